"""Does gradient accumulation over two micro-batches work under torch.compile(mode=reduce-overhead)?"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8)).cuda()
ref = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8)).cuda()
ref.load_state_dict(model.state_dict())
compiled = torch.compile(model, mode="reduce-overhead")
xs = [torch.randn(32, 64, device="cuda") for _ in range(2)]
for step in range(4):
    try:
        for x in xs:
            compiled(x).square().mean().backward()
            ref(x).square().mean().backward()
        worst = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
        print("step", step, "accumulated grads differ by", worst)
    except Exception as e:  # noqa: BLE001
        print("step", step, "raised", type(e).__name__, str(e)[:300])
    for m in (model, ref):
        m.zero_grad(set_to_none=True)
