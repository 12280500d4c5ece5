"""A project of your own, trained by clorch-train: a model, a dataset and a loss (see ../README.md)."""
