"""Hydra's command-line flags as `clorch-train` reads them.

Hydra parses its command line with argparse, which also takes a unique prefix
of a long flag (`--multi`) and short flags run together (`-mc job`). clorch-train
decides what to check and whether to launch by the flags present, comparing
whole flags, so `whole_flags` writes prefixes out in full and refuses run-together
short flags before anything else reads the command line.
"""

from __future__ import annotations

MULTIRUN = ("-m", "--multirun")  # a sweep
# Flags that only print something that is not the job's config: no checks, no launch.
PRINT_ONLY = ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc")
# Flags that would compose or load something other than clorch's config, unchecked (another
# primary config may declare Hydra callbacks; a rerun file is a pickle): refused.
OTHER_CONFIG = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "--experimental-rerun")
# Flags that print the composed config instead of running it: checked like a run, no launch.
PRINT_CONFIG = ("--cfg", "-c", "--resolve", "--package", "-p")
# Every flag of Hydra's command line.
LONG_FLAGS = (
    "--help",
    "--hydra-help",
    "--version",
    "--cfg",
    "--resolve",
    "--package",
    "--run",
    "--multirun",
    "--shell-completion",
    "--config-path",
    "--config-name",
    "--config-dir",
    "--experimental-rerun",
    "--info",
)
SHORT_FLAGS = ("-h", "-c", "-p", "-r", "-m", "-sc", "-cp", "-cn", "-cd", "-i")


def whole_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """`args` with abbreviated long flags written in full, and the flags refused.

    Refused: a short flag run together with others or with its value
    (`-mc job`, `-cjob`: write `-m -c job` or `-c=job`), a long flag that is no Hydra
    flag's prefix or more than one's, a flag after `--` (which is dropped: every
    argument that is not a flag is an override already).
    """
    out, errors = [], []
    if "--" in args:  # argparse's end of flags: what follows is overrides, which never start with '-'
        end = args.index("--")
        errors += [
            f"{arg} comes after '--', so it would be read as an override, and an override cannot "
            "start with '-': put flags before '--'"
            for arg in args[end + 1 :]
            if arg.startswith("-")
        ]
        args = args[:end] + [arg for arg in args[end + 1 :] if not arg.startswith("-")]
    for arg in args:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            matches = [flag for flag in LONG_FLAGS if flag == name] or [
                flag for flag in LONG_FLAGS if flag.startswith(name)
            ]
            if len(matches) == 1:
                arg = matches[0] + sep + value
            else:
                errors.append(
                    f"{name} is not a clorch-train flag (Hydra's flags: {', '.join(LONG_FLAGS)})"
                    if not matches
                    else f"{name} is ambiguous: it could be {', '.join(matches)}"
                )
        elif arg.startswith("-") and len(arg) > 1 and arg.split("=")[0] not in SHORT_FLAGS:
            errors.append(
                f"{arg}: write each short flag and its value separately (e.g. -m -c job); "
                f"the short flags are {', '.join(SHORT_FLAGS)}"
            )
        out.append(arg)
    return out, errors


def flags_first(args: list[str]) -> list[str]:
    """`args` with the flags that take no value moved to the front.

    Hydra's command line (argparse) refuses a flag after an override
    (`clorch-train +recipe=x -m optim.lr=1,2`); the order means nothing here.
    """
    alone = [a for a in args if a in MULTIRUN + ("--resolve",)]
    return alone + [a for a in args if a not in alone]


def flag_set(args: list[str]) -> set[str]:
    """The `-x`/`--xyz` flags among `args` (`--cfg=job` counts as `--cfg`)."""
    return {a.split("=")[0] for a in args if a.startswith("-")}
