"""One NCCL rank: clorch's all_reduce fast and full paths give torch's results and errors."""
import torch
import torch.distributed as dist
import clorch.distributed as cd

with cd.process_group(backend="nccl"):
    x = torch.arange(4.0, device="cuda")
    cd.all_reduce(x)
    work = cd.all_reduce(x, op="max", async_op=True)
    work.wait()
    y = torch.arange(4.0, device="cuda")
    cd.all_reduce(y, op="avg")
    print("values", x.tolist(), y.tolist(), type(work).__name__)
    for bad in (torch.ones(2), torch.ones(4, 2, device="cuda").t()):
        try:
            cd.all_reduce(bad)
            print("no error for", bad.device, bad.is_contiguous())
        except ValueError as exc:
            print("refused:", str(exc)[:90])
    dist.destroy_process_group()
    try:
        cd.all_reduce(x)
    except RuntimeError as exc:
        print("after torch's destroy:", str(exc)[:60])
