"""Mixed precision: autocast and a dynamic loss scaler checked across all ranks.

bf16 uses `autocast` without a scaler; fp16 uses `autocast` and `GradScaler`;
fp32 uses neither (`precision_settings` returns that pair for a name).
"""

from clorch.amp.autocast import autocast, precision_settings
from clorch.amp.scaler import GradScaler, backward, step

__all__ = ["autocast", "GradScaler", "backward", "step", "precision_settings"]
