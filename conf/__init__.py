"""clorch-train's primary config (config.yaml), read through importlib.resources (Hydra's pkg://clorch.conf)."""
