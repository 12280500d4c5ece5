"""How a sweep is stopped before or during its trials, by what it found (standard library only)."""

from __future__ import annotations


class SweepRefused(ValueError):
    """The sweep may not run in this directory, or on this study (`.errors`: every reason, a line each)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


class StorageError(RuntimeError):
    """The study's storage cannot be used; the message is one line: what, where, what to do."""
