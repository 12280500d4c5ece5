"""The checkpoint package's own error (its own module, so every other module can import it)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt, not a regular file, or not a safe tensor archive.

    Also raised when saving would overwrite a file that is not a checkpoint,
    or when the disk is full.
    """
