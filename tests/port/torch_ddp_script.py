"""A PyTorch DDP training script, written against torch's API only.

It runs as it is under torchrun (`torchrun --nproc-per-node 2 torch_ddp_script.py`).
The port test swaps the import block below for clorch's and checks that the
numbers do not change: a GPT on random tokens, gradient accumulation with
`no_sync()` and with `require_backward_grad_sync`, GradScaler with
scale -> backward -> unscale_ -> clip_grad_norm_ -> step -> update, fused AdamW
where the device has it, a cosine schedule, DistributedSampler.
"""

import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# --- imports a port to clorch changes ---
from torch.amp import GradScaler, autocast
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
# --- end ---


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, seq=16, d=32, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def train(steps=20, precision="fp32", accumulation=2, batch=4, poison_step=None, clip=1.0, seed=0):
    """Train on this rank; return losses, grad norms, final weights and the last step's raw grads."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    )
    torch.manual_seed(seed)
    data = TensorDataset(torch.randint(0, 64, (steps * accumulation * batch * world, 17)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    model = GPT().to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = GradScaler(device.type, init_scale=2.0**12, enabled=precision != "bf16")
    losses, norms, grads = [], [], []
    micro = iter(loader)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for i in range(accumulation):
            (tokens,) = next(micro)
            tokens = tokens.to(device)
            last = i == accumulation - 1
            if step % 2 == 0 and not last:
                with model.no_sync():  # the forward decides: its backward below does not sync
                    with autocast(device.type, dtype=dtype, enabled=precision != "fp32"):
                        logits = model(tokens[:, :-1])
                        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
                scaler.scale(loss / accumulation).backward()
                continue
            model.require_backward_grad_sync = last
            with autocast(device.type, dtype=dtype, enabled=precision != "fp32"):
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            if step == poison_step and rank == 0 and last:
                loss = loss * float("inf")
            scaler.scale(loss / accumulation).backward()
        grads = [p.grad.detach().float().cpu().clone() for p in model.parameters()]
        scaler.unscale_(opt)
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        scaler.step(opt)
        scaler.update()
        sched.step()
        losses.append(loss.item())
    weights = {k: v.detach().float().cpu() for k, v in model.module.state_dict().items()}
    return {"losses": losses, "norms": norms, "weights": weights, "grads": grads, "scale": scaler.get_scale()}


if __name__ == "__main__":
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    out = train()
    if dist.get_rank() == 0:
        print("final loss", out["losses"][-1])
    dist.destroy_process_group()
