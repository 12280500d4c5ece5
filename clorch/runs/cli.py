"""`clorch-runs`: find, compare and plot the runs clorch-train left.

    clorch-runs ls                                   every run under outputs/ and multirun/
    clorch-runs ls --where 'eval_loss<0.1' --status failed --recipe ddp_bf16 --since 2026-12-01
    clorch-runs ls --sort eval_loss --json           (or --csv) for scripts; --sort=-KEY descends
    clorch-runs show RUN                             config, environment, metrics, checkpoints, commands
    clorch-runs diff RUN_A RUN_B                     the config keys that differ, metrics side by side
    clorch-runs plot RUN... --metric eval_loss --out plot.png
    clorch-runs verify RUN [--steps K]               rerun it: are the weights bit-identical?

RUN is a run directory, a run id (the `id` column, or its first 4+ characters)
or the end of a run's path (`06-13-41`, `06-13-55/1`). `--root DIR` (repeatable)
looks under DIR instead of ./outputs and ./multirun. Nothing is ever written into
a run directory. Exit status: 0; 2 for a bad argument (the message names it, the
value and what is allowed); 1 when something else stops the command (plot's
matplotlib is missing), and for verify, when the weights differ or the rerun failed.
Imports no torch (verify --steps reads checkpoints with it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from clorch.runs.discover import UsageError, check_roots, default_roots, find_runs, select
from clorch.runs.plot import MissingExtra, plot
from clorch.runs.query import pick, sort_runs, split_list
from clorch.runs.records import STATUSES
from clorch.runs.table import format_table, list_rows, to_csv, to_json
from clorch.runs.verify import verdict_text, verify
from clorch.runs.views import diff_data, diff_text, show_data, show_text

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_VERIFY_HELP = """Rerun a run from its recorded command (clorch-train, into a temporary directory) and say
whether the weights come out bit-identical: to its end against summary.json's weights_sha256,
or with --steps K until its checkpoint of step K, against the run's own checkpoint of step K
(same config and schedule; the rerun is stopped there). When they differ, it names what
differs: torch, CUDA, GPU models, clorch's version and commit, Python, world size, the data
files' digests; and whether the run was exact=true.

The rerun imports what the run's config names: CLORCH_TRUSTED_MODULES is yours to set, as for
clorch-train, and is never taken from the run directory. Exit status: 0 identical, 1 not (or
the rerun failed), 2 a bad argument.
"""


def _roots(args: argparse.Namespace) -> list[Path]:
    return check_roots(args.root) if args.root else default_roots()


def _ls(args: argparse.Namespace) -> int:
    roots = _roots(args)
    runs = find_runs(roots)
    chosen = pick(runs, args.where, split_list(args.status), split_list(args.recipe), args.since)
    if args.sort:
        chosen = sort_runs(chosen, args.sort)
    if args.reverse:
        chosen.reverse()
    if args.json:
        print(to_json([r.record() for r in chosen]))
    elif args.csv:
        sys.stdout.write(to_csv(chosen))
    elif not runs:
        where = ", ".join(map(str, roots)) or "./outputs and ./multirun (neither exists here)"
        print(f"clorch-runs: no runs under {where}; --root DIR looks elsewhere", file=sys.stderr)
    elif chosen:
        # A sweep's line of its own heads the full listing only: once filtered or reordered, the
        # table lists the runs that match, in the order asked for, and nothing else.
        narrowed = args.where or args.status or args.recipe or args.since or args.sort or args.reverse
        print(format_table(*list_rows(chosen, group_sweeps=not narrowed)))
    else:
        print(f"clorch-runs: none of the {len(runs)} runs matches", file=sys.stderr)
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    roots = _roots(args)
    run = select(args.run, find_runs(roots), roots)
    print(to_json(show_data(run)) if args.json else show_text(run))
    return EXIT_OK


def _diff(args: argparse.Namespace) -> int:
    roots = _roots(args)
    runs = find_runs(roots)
    a, b = (select(name, runs, roots) for name in args.runs)
    print(to_json(diff_data(a, b)) if args.json else diff_text(a, b))
    return EXIT_OK


def _plot(args: argparse.Namespace) -> int:
    roots = _roots(args)
    runs = find_runs(roots)
    chosen = [select(name, runs, roots) for name in args.runs]
    out, missing = plot(chosen, args.metric, args.out)
    for run in missing:
        print(f"clorch-runs: run {run.id} ({run.path}) has no {args.metric}; left out", file=sys.stderr)
    print(out)
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    roots = _roots(args)
    run = select(args.run, find_runs(roots), roots)
    verdict = verify(run, args.steps, args.keep, lambda line: print(f"clorch-runs verify: {line}", file=sys.stderr))
    print(to_json(verdict.to_dict()) if args.json else verdict_text(verdict))
    return EXIT_OK if verdict.identical else EXIT_FAILED


_RUN = (("run", dict(metavar="RUN"), None),)
_LS = (
    (
        "--where",
        dict(action="append", default=[], metavar="COND"),
        "KEY OP VALUE, e.g. 'eval_loss<0.1' or 'optim.lr==3e-4' (repeatable: all must hold)",
    ),
    (
        "--status",
        dict(action="append", metavar="STATUS"),
        f"one of {', '.join(STATUSES)} (comma-separated or repeated)",
    ),
    ("--recipe", dict(action="append", metavar="NAME"), "runs of this recipe (repeatable)"),
    ("--since", dict(metavar="DATE"), "runs started at or after DATE (2026-12-01[T14:30])"),
    ("--sort", dict(metavar="KEY"), "order by KEY (a --where key; --sort=-KEY: descending)"),
    ("--reverse", dict(action="store_true"), "reverse the order"),
)
_PLOT = (
    ("runs", dict(metavar="RUN", nargs="+"), None),
    ("--metric", dict(default="loss"), "a metrics.jsonl key (default: loss; eval_loss, lr, ...)"),
    ("--out", dict(default="plot.png", type=Path), "the PNG to write (default: ./plot.png)"),
)
_VERIFY = _RUN + (
    ("--steps", dict(type=int, metavar="K"), "compare at the run's own checkpoint of step K"),
    ("--keep", dict(action="store_true"), "keep the rerun's directory (and say where)"),
)
# One row per subcommand: (name, what runs it, add_parser keywords, its arguments as (flag,
# argparse keywords, help) rows, the mutually exclusive output formats it offers).
_COMMANDS = (
    ("ls", _ls, dict(help="one row per run"), _LS, ("--json", "--csv")),
    ("show", _show, dict(help="one run in full"), _RUN, ("--json",)),
    ("diff", _diff, dict(help="two runs side by side"), (("runs", dict(metavar="RUN", nargs=2), None),), ("--json",)),
    ("plot", _plot, dict(help="runs' curves of one metric in one PNG"), _PLOT, ()),
    (
        "verify",
        _verify,
        dict(
            help="rerun a run: are the weights bit-identical?",
            description=_VERIFY_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ),
        _VERIFY,
        ("--json",),
    ),
)
_FORMATS = {"--json": "JSON for scripts", "--csv": "CSV for scripts"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clorch-runs",
        description="Find, compare and plot clorch runs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n")[1],
    )
    roots = argparse.ArgumentParser(add_help=False)
    roots.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder holding run directories (repeatable; default: ./outputs and ./multirun)",
    )
    names = "{" + ",".join(name for name, *_ in _COMMANDS) + "}"
    sub = parser.add_subparsers(dest="command", required=True, metavar=names)
    for name, handler, options, arguments, formats in _COMMANDS:
        command = sub.add_parser(name, parents=[roots], **options)
        command.set_defaults(handler=handler)
        for flag, keywords, text in arguments:
            command.add_argument(flag, **keywords, help=text)
        if formats:
            group = command.add_mutually_exclusive_group()
            for flag in formats:
                group.add_argument(flag, action="store_true", help=_FORMATS[flag])
    return parser


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run `clorch-runs ARGV`; return the exit status (argparse exits 2 itself on its own errors)."""
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as exc:
        print(f"clorch-runs {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except MissingExtra as exc:
        print(f"clorch-runs {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # `clorch-runs ls | head`
        return EXIT_OK


def main() -> None:
    sys.exit(run_cli())


if __name__ == "__main__":
    main()
