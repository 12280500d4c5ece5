"""The builders below both sides: what a config's model, data and optimizer are made of.

The plan (`clorch.plan`, on the meta device, in the launching process) and the ranks
(`clorch.train`, for real) build through the same functions here, so neither reaches into
the other: `clorch.builders.data` (the data's splits and the sizes they give the model),
`clorch.builders.model` (the model's constructor call), `clorch.builders.optimizer` (the optimizer
over clorch's parameter groups), `clorch.builders.rank_model` (a rank's model, whole or on the meta
device, for a parallel strategy) and `clorch.builders.model_options` (the config's changes to a
built model). Nothing here imports the plan, the ranks' code, the engine or the strategies (`tests/test_layers.py`).
"""
