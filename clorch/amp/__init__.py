"""Mixed precision: autocast and a dynamic loss scaler checked across all ranks.

bf16 uses `autocast` without a scaler; fp16 uses `autocast` and `GradScaler`;
fp32 uses neither (`precision_settings` returns that pair for a name).
`MixedPrecision` holds one mode's autocast, scaler, backward and optimizer
step in one object (the engine trains through it).
"""

from clorch.amp.autocast import autocast, precision_settings
from clorch.amp.mixed_precision import MixedPrecision
from clorch.amp.scaler import GradScaler, ScalerStateError, backward, step

__all__ = ["autocast", "GradScaler", "MixedPrecision", "ScalerStateError", "backward", "step", "precision_settings"]
