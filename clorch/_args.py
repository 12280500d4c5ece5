"""Argument checks shared by the public API: clear TypeError/ValueError messages naming the argument."""

from __future__ import annotations


def int_arg(name: str, value: object, minimum: int) -> int:
    """`value` as an int >= `minimum` (bools refused).

    Raises:
        TypeError: not an int.
        ValueError: below `minimum`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value
