import copy, time, torch, torch.distributed as dist
import clorch.distributed as cd
from clorch.bench import ddp_models
from clorch.bench.stats import interleave, median
from clorch.nn.parallel import DistributedDataParallel

with cd.process_group(backend="nccl"):
    dev = cd.device()
    # 1. mixed-dtype foreach copy and premul in bf16
    src = [torch.randn(n, device=dev) for n in (16384, 256, 65536, 7)]
    dst = [torch.empty(n, device=dev, dtype=torch.bfloat16) for n in (16384, 256, 65536, 7)]
    torch._foreach_copy_(dst, src)
    print("foreach fp32->bf16 equal to .to():", all(torch.equal(d, s.to(torch.bfloat16)) for d, s in zip(dst, src)))
    flat = torch.zeros(16384 + 256, device=dev, dtype=torch.bfloat16)
    views = [flat[:16384], flat[16384:]]
    torch._foreach_copy_(views, src[:2])
    print("foreach fp32->bf16 into views equal:", all(torch.equal(d, s.to(torch.bfloat16)) for d, s in zip(views, src[:2])))
    for dt in (torch.float32, torch.bfloat16):
        t = torch.randn(1000, device=dev).to(dt); ref = t.clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(1.0)); torch.cuda.synchronize()
        print("premul(1.0)", dt, "equal:", torch.equal(t, ref), (t - ref).abs().max().item())
    # 2. bucket path variants at world size 1
    args = {"model": "gpt2-small", "batch": 8, "bucket_cap_mb": 25.0, "width": 2048, "features": 512}
    work = ddp_models.build(args, 0, dev)
    base = work.model
    def cand(model, opt, step):
        def run():
            torch.cuda.synchronize(); t = time.perf_counter()
            for _ in range(3):
                work.loss(model).backward(); step(opt)
            torch.cuda.synchronize(); return (time.perf_counter() - t) / 3
        return run
    def plain_step(opt):
        opt.step(); opt.zero_grad(set_to_none=True)
    cands = {}
    single = copy.deepcopy(base); cands["one process"] = cand(single, work.optimizer(single), plain_step)
    for name in ("side stream, premul", "side stream, no comm", "main stream foreach", "per-param hook copies",
                 "side stream, SUM"):
        m = DistributedDataParallel(copy.deepcopy(base)); m._run_bucket_path(); r = m._reducer
        if "no comm" in name: r._communicates = False
        if "SUM" in name: r._reduce_op = dist.ReduceOp.SUM
        if "main stream" in name: r._copy_stream = torch.cuda.current_stream()
        if "per-param" in name:
            r._copy_stream = None
            r._handles = [h.remove() for h in r._handles] and []
            for b in r.buckets:
                for pos, i in enumerate(b.param_indices):
                    r._handles.append(r._params[i].register_post_accumulate_grad_hook(r._make_hook(i, b, pos)))
        cands[name] = cand(m, work.optimizer(m.module), m.optimizer_step)
    interleave(cands, 3)
    s = interleave(cands, 12)
    one = median(s["one process"])
    for k, v in s.items():
        print(f"{k:28s} {median(v) * 1e3:8.3f} ms  {median(v) / one:.4f}x one process")
