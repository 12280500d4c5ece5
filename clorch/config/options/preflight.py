"""The `preflight` group: the checks of the job's machines before training (clorch.preflight)."""

from __future__ import annotations

from clorch.config.registry import declare, option
from clorch.preflight.options import PreflightConfig

declare("preflight", "check the machines before training", selector=None, shorthand="mode")
option("preflight", "default")(PreflightConfig)
