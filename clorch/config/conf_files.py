"""conf/: the YAML files Hydra composes, written from the schema dataclasses.

Every group option a user can pick has a file that shows what it sets
(`conf/precision/fp16.yaml`, `conf/checkpoint/periodic.yaml`, ...), and
`conf/top.yaml` holds the top-level keys. The dataclasses of
`clorch.config.schema` stay the one place a default is written: the files are
rendered from them, field comments included, and a test fails when a file
differs from its rendering. After changing a schema, write them again:

    python -m clorch.config.conf_files          # rewrites conf/ (and docs/keys.md) in this checkout
    python -m clorch.config.conf_files --check  # exit 1 if a file is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Iterator


from clorch.config import keys_page, registry
from clorch.config.comments import field_comments, scalar
from clorch.config.schema import BACKENDS, CUSTOM, TARGET_GROUPS, TopConfig

CUSTOM_EXAMPLES = {
    "model": "my_pkg.Net",
    "data": "my_pkg.data.Shapes",
    "loss": "my_pkg.losses.focal",
    "step": "my_pkg.train.step",
}
TOP = "top"  # conf/top.yaml, first in config.yaml's defaults list
_EDIT_HINT = "# Written from {where}: edit that dataclass, then run python -m clorch.config.conf_files"


def rendered() -> dict[str, str]:
    """Path under conf/ -> the text that file must hold."""
    files = {f"{TOP}.yaml": _render(TopConfig(), header="# @package _global_\n")}
    for backend in BACKENDS:
        files[f"backend/{backend}.yaml"] = (
            f"# @package _global_\n# Sets the top-level key backend (the process-group backend).\nbackend: {backend}\n"
        )
    for group in registry.groups():
        for name, values in registry.options(group).items():
            files[f"{group}/{name}.yaml"] = _render(values)
    for group in TARGET_GROUPS:
        files[f"{group}/{CUSTOM}.yaml"] = (
            f"# Your own code: {group}._target_={CUSTOM_EXAMPLES[group]} plus its keyword arguments\n"
            f"# selects this option (a target outside clorch, torch.nn and torch.optim must be trusted\n"
            f"# with CLORCH_TRUSTED_MODULES). It has no keys of its own.\nname: {CUSTOM}\n"
        )
    return files


def _render(values: Any, header: str = "") -> str:
    cls = type(values)
    where = f"{cls.__module__}.{cls.__qualname__}"
    doc = (cls.__doc__ or "").strip().splitlines()[0]
    return header + f"# {doc}\n" + _EDIT_HINT.format(where=where) + "\n" + "".join(_lines(values, 0))


def _lines(values: Any, depth: int) -> Iterator[str]:
    comments = field_comments(type(values))
    indent = "  " * depth
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        comment = f"  # {comments[f.name]}" if f.name in comments else ""
        if dataclasses.is_dataclass(value):
            yield f"{indent}{f.name}:{comment}\n"
            yield from _lines(value, depth + 1)
        else:
            yield f"{indent}{f.name}: {scalar(value)}{comment}\n"


def stale(conf_dir: Path) -> list[str]:
    """The files under `conf_dir` that differ from their rendering, are missing, or are extra."""
    wanted = rendered()
    # conf/hydra/ holds clorch's sweepers, Hydra's own groups (their defaults: clorch.sweep.settings,
    # and a test holds the two equal), not options of a config group.
    present = {
        str(p.relative_to(conf_dir)) for p in conf_dir.rglob("*.yaml") if p.relative_to(conf_dir).parts[0] != "hydra"
    } - {"config.yaml"}
    out = [
        name
        for name, text in wanted.items()
        if not (conf_dir / name).is_file() or (conf_dir / name).read_text() != text
    ]
    return sorted(out + [f"{name} (no such option)" for name in present - set(wanted)])


def write(conf_dir: Path) -> list[str]:
    """Write every rendered file under `conf_dir`; return the ones that changed."""
    changed = stale(conf_dir)
    for name, text in rendered().items():
        path = conf_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clorch.config.conf_files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="report stale files; write nothing")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "conf",
        help="the conf/ folder (default: this checkout's)",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "docs",
        help="the docs/ folder whose keys.md and training.md key table are written too",
    )
    args = parser.parse_args(argv)
    if args.check:
        bad = [args.dir / n for n in stale(args.dir)] + [args.docs / n for n in keys_page.stale_pages(args.docs)]
        for path in bad:
            print(f"stale: {path}", file=sys.stderr)
        return 1 if bad else 0
    for name in write(args.dir):
        print(f"wrote {args.dir / name}")
    if args.docs.is_dir():
        for name in keys_page.write_pages(args.docs):
            print(f"wrote {args.docs / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
