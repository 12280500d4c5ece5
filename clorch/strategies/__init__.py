"""One class per `parallel` mode: what a rank's loop asks of the mode (`clorch.strategies.base.Strategy`).

`DDPStrategy` (clorch.strategies.ddp) and `FSDPStrategy` (clorch.strategies.fsdp); a
`parallel` option names its class as a string (`strategy`), so a mode of your own is
one class plus its option (docs/extending.md, "A parallel mode").
"""

from clorch.strategies.base import ModelSource, Strategy, strategy_class, weights_digest

__all__ = ["ModelSource", "Strategy", "strategy_class", "weights_digest"]
