"""Hydra's command-line flags as `clorch-train` reads them.

Hydra parses its command line with argparse, which also takes a unique prefix
of a long flag (`--multi`) and short flags run together (`-mc job`). clorch-train
decides what to check and whether to launch by the flags present, comparing
whole flags, so `whole_flags` writes prefixes out in full and refuses run-together
short flags before anything else reads the command line. The overrides are read apart
from the flags (`is_override`) and reach Hydra before them.
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


# Hydra runs one mode: a run, a sweep, a printed config, its information or shell completion.
# Each mode's flags, what the flag does, and what the mode is.
MODES = (
    (("--cfg", "-c"), "prints one config", "a printed config"),
    (("--info", "-i"), "prints Hydra's information", "Hydra's information"),
    (("--shell-completion", "-sc"), "sets up shell completion", "shell completion"),
    (("--multirun", "-m"), "runs a sweep", "a sweep"),
    (("--run", "-r"), "runs once", "a single run"),
)


def mode_errors(names: set[str]) -> list[str]:
    """An error when the flags `names` ask Hydra for more than one mode (Hydra would raise)."""
    chosen = [(sorted(names & set(flags))[0], does, what) for flags, does, what in MODES if names & set(flags)]
    if len(chosen) < 2:
        return []
    (first, does, _), (second, _, what) = chosen[:2]
    return [f"{first} {does} and cannot run with {second} ({what}): drop one of the two"]


def whole_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """`args` (the flags and their values: the overrides are read apart, `is_override`) with
    abbreviated long flags written in full, and the flags refused.

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
            matches = _long_matches(name)
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


# Flags whose value may be the next argument (`--cfg job`); `--cfg=job` carries its own. (`--info`'s
# optional value is a word, never an override: `--info batch_size=4` is `--info` and an override.)
VALUE_FLAGS = (
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
)


def is_override(args: list[str], i: int) -> bool:
    """Whether `args[i]` is an override (`key=value`, `~key`): not a flag, nor a flag's value.

    clorch-train hands Hydra its overrides first and its flags after them, so that a flag
    between two overrides (`+recipe=x -m optim.lr=1,2`, `+recipe=x --cfg job batch_size=4`)
    reads as meant: Hydra's command line (argparse) takes no override after a flag.
    """
    arg = args[i]
    if arg.startswith("-") or not ("=" in arg or arg.startswith("~")):
        return False
    before = args[i - 1] if i else ""
    return not (before.startswith("-") and "=" not in before and _whole(before) in VALUE_FLAGS)


def _whole(flag: str) -> str:
    """A long flag's unique prefix written in full (`--pack` is `--package`); any other as it is."""
    if not flag.startswith("--"):
        return flag
    matches = _long_matches(flag)
    return matches[0] if len(matches) == 1 else flag


def _long_matches(name: str) -> list[str]:
    """The long flags `name` names: itself, or those it is a prefix of."""
    return [flag for flag in LONG_FLAGS if flag == name] or [flag for flag in LONG_FLAGS if flag.startswith(name)]


def flag_set(args: list[str]) -> set[str]:
    """The `-x`/`--xyz` flags among `args` (`--cfg=job` counts as `--cfg`)."""
    return {a.split("=")[0] for a in args if a.startswith("-")}
