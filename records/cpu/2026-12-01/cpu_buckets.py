"""CPU gloo, 2 ranks, MLP: clorch DDP bucket layouts vs torch DDP (interleaved medians)."""
import copy, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, configs):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29633")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    from clorch.bench import ddp_models
    from clorch.bench.ddp import DEFAULTS
    from clorch.bench.stats import interleave, median
    from clorch.nn.parallel import DistributedDataParallel
    args = dict(DEFAULTS); args["batch"] = 64
    work = ddp_models.build(args, rank, torch.device("cpu"))
    cands = {}
    for name, kind, kw in configs:
        model = (DistributedDataParallel if kind == "clorch" else torch.nn.parallel.DistributedDataParallel)(
            copy.deepcopy(work.model), **kw)
        opt = work.optimizer(model.module)
        def run(model=model, opt=opt, kind=kind):
            dist.barrier(); t = time.perf_counter()
            for _ in range(3):
                work.loss(model).backward()
                if kind == "clorch": model.optimizer_step(opt)
                else: opt.step(); opt.zero_grad(set_to_none=True)
            return (time.perf_counter() - t) / 3
        cands[name] = run
    interleave(cands, 3)
    samples = interleave(cands, int(sys.argv[1]) if len(sys.argv) > 1 else 15)
    if rank == 0:
        for name, v in samples.items():
            print(f"{name:40s} {median(v)*1e3:8.2f} ms")
    dist.destroy_process_group()

if __name__ == "__main__":
    configs = [("clorch 25/1", "clorch", {}), ("clorch bf16 one bucket", "clorch", {"bucket_cap_mb": 100, "first_bucket_cap_mb": 100, "reduce_dtype": "bf16"}), ("clorch bf16", "clorch", {"reduce_dtype": "bf16"}),
               ("clorch one bucket", "clorch", {"bucket_cap_mb": 100, "first_bucket_cap_mb": 100}),
               ("clorch 25/8", "clorch", {"first_bucket_cap_mb": 8}),
               ("torch default", "torch", {}),
               ("torch best", "torch", {"gradient_as_bucket_view": True, "static_graph": True})]
    mp.spawn(worker, args=(configs,), nprocs=2)
