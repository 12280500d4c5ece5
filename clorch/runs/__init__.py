"""Reading the run directories clorch-train leaves: find, filter, compare and plot runs.

    status.py    Status: every status word, its exit code and its console line (clorch-train's too)
    records.py   Run: one run directory read tolerantly (a live, killed or summary-less run too)
    discover.py  find_runs(roots), select(name): run directories under roots, one named by id or path
    query.py     --where / --status / --recipe / --since / --sort
    table.py     the aligned table, JSON and CSV
    views.py     what `show` and `diff` print
    commands.py  the commands that re-run or resume a run; its checkpoints
    plot.py      several runs' curves of one metric (matplotlib, the `plot` extra)
    rerun.py     a run's recorded command run again into a directory of its own (verify's rerun)
    environment.py  what differs between two runs' env.json (versions, GPUs, data files' digests)
    verify.py    `verify`: rerun a run, compare the weights' digests, name what differs
    cli.py       the `clorch-runs` console script

Nothing here imports torch (the command line stays fast; `verify --steps` reads checkpoints
with it) or writes into a run directory.
"""

from __future__ import annotations

from clorch.runs.discover import find_runs, select
from clorch.runs.records import Run, short_id

__all__ = ["Run", "find_runs", "select", "short_id"]
