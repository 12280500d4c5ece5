"""Alias of `clorch.env` (the torch-free home of the environment-variable helpers)."""

from clorch.env import MULTICAST_OFF, OPTIONAL_VARIABLES, REQUIRED_VARIABLES, DistEnv, read_env, with_multicast_off

__all__ = ["MULTICAST_OFF", "OPTIONAL_VARIABLES", "REQUIRED_VARIABLES", "DistEnv", "read_env", "with_multicast_off"]
