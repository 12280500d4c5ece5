"""Commands clorch prints for pasting (the resume hint, `clorch-runs show`'s re-run), made to
work from any directory.

A printed command runs where the user pastes it, maybe in another directory or
shell: so it gives every path it names absolute, sets the trust variable the
run was started with, and then starts with `cd` into the directory the run was
started from (your own modules are imported from there). Read without torch or Hydra.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Iterable, Sequence

from clorch.config.registry import path_keys

TRUST_VARIABLE = "CLORCH_TRUSTED_MODULES"  # as clorch.config.targets.TRUSTED_VARIABLE
# Override keys whose values are files or directories (the config's, marked rule(path=True) in
# their options, and Hydra's run directories); a recipe's value is a path when it looks like one.
PATH_KEYS = (*path_keys(), "hydra.run.dir", "hydra.sweep.dir")
_NOT_PATHS = ("none", "latest", "null", "")


def _is_recipe_path(value: str) -> bool:
    return value.endswith((".yaml", ".yml")) or os.sep in value


def _absolute(value: str, base: str) -> str:
    if value in _NOT_PATHS or "${" in value:
        return value
    path = Path(value).expanduser()
    return value if path.is_absolute() else os.path.normpath(Path(base) / path)


def absolute_args(args: Iterable[str], base: str) -> list[str]:
    """`args` with the relative paths they name made absolute against `base` (a sweep's
    comma-separated values each)."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        name = key.lstrip("+~")
        if (
            sep
            and (name in PATH_KEYS or (name == "recipe" and _is_recipe_path(value)))
            and not value.startswith(("[", "'", '"'))
        ):
            arg = f"{key}={','.join(_absolute(v, base) for v in value.split(','))}"
        out.append(arg)
    return out


def pasteable(args: Sequence[str], cwd: str | None, trusted: str | None, cd: bool = True) -> str:
    """`cd CWD && CLORCH_TRUSTED_MODULES=... clorch-train ARGS`, with `args`' paths absolute.

    Args:
        args: clorch-train's arguments.
        cwd: the directory the run was started from (None: unknown, no `cd`).
        trusted: the trust variable's value the run was started with (None or "": not set).
        cd: start with `cd CWD`; without it, only when modules are trusted by the variable
            (your own code may be imported from the working directory).
    """
    if cwd:
        args = absolute_args(args, cwd)
    command = shlex.join(["clorch-train", *args])
    if trusted:
        command = f"{TRUST_VARIABLE}={shlex.quote(trusted)} {command}"
    return f"cd {shlex.quote(cwd)} && {command}" if cwd and (cd or trusted) else command


def trusted_in_config(text: str) -> str | None:
    """The trust variable's value a run was started with, from its config.yaml's comment
    (`# trusted modules (CLORCH_TRUSTED_MODULES): a, b`), or None."""
    prefix = f"# trusted modules ({TRUST_VARIABLE}): "
    for line in text.splitlines():
        if line.startswith(prefix):
            return ",".join(name.strip() for name in line[len(prefix) :].split(",") if name.strip())
        if not line.startswith("#"):
            break
    return None


def recipe_files_again(args: Iterable[str], cwd: str | None) -> list[str]:
    """`+recipe=file_NAME`, as clorch-train records a recipe file (by its registered name), as
    that file's path again: NAME.yaml (or .yml) in the directory the run was started from,
    where it is there."""
    out = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "recipe" and value.startswith("file_") and cwd:
            found = [p for p in (Path(cwd, value[5:] + ".yaml"), Path(cwd, value[5:] + ".yml")) if p.is_file()]
            arg = f"{key}={found[0]}" if found else arg
        out.append(arg)
    return out
