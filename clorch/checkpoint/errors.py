"""The checkpoint package's own error and warning (their own module, so every other module can import them)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt, not a regular file, or not a safe tensor archive.

    Also raised when saving would overwrite a file that is not a checkpoint,
    or when the disk is full.
    """


class WorldSizeChangedWarning(UserWarning):
    """A checkpoint loaded onto another world size: the ranks' RNG states were not restored.

    Random streams cannot be re-split over another number of ranks (the data order can).
    A trainer that reseeds them by a rule of its own filters this category.
    """
