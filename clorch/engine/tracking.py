"""The run's experiment trackers (`logger.trackers`), fed from rank 0's metrics.jsonl by one process.

No rank calls a tracker while it trains: rank 0 writes metrics.jsonl as always,
and one process reads that file and forwards its records, so a slow or
unreachable tracker server never slows a training step. Which process:

    launcher=local      the launching process (node 0's, with several nodes): `start`
                        while the ranks start up, `log` each new record as the progress
                        view reads it (clorch.engine.run._follow), `finish` after
                        summary.json and loss.png are written.
    launcher=torchrun   torch's agent holds the launching process until the ranks end,
                        so the whole run goes at the end (`feed_at_end`), from the node
                        that found rank 0's result (or the only node). A failed job of
                        several nodes is not sent: no node knows it hosted rank 0.
    outside launcher    (torchrun, srun or submitit starting clorch-train as each rank,
                        clorch.engine.as_rank): rank 0 at the end, after summary.json,
                        when the job succeeded (a failing job's ranks are ended by that
                        launcher before they could send anything).

Each tracker run gets the checked config as its params, every record of
metrics.jsonl (those carried over from the run a resume started from included),
and at the end the run's status (succeeded: MLflow's FINISHED; interrupted:
KILLED; anything else: FAILED) and the files config.yaml, summary.json and
loss.png. Each job of a sweep is a run of its own, named after its directory
(clorch.trackers.run_name); the default MLflow store, mlflow.db beside outputs/ and
multirun/, holds every run and sweep job of the project (clorch.trackers.mlflow_target says
how MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME are used, wandb_target W&B's variables).
Each tracker gets the whole `logger` section and reads its own keys from it.

A tracker that fails warns once and is off for the rest of the run
(clorch.trackers); nothing here raises but an interrupt (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Sequence

from clorch.plan.plan import Plan
from clorch.train.metrics import read_metrics
from clorch.trackers import Tracker, build_trackers, run_name

ARTIFACTS = ("config.yaml", "summary.json", "loss.png")  # each sent when the run directory has it


class TrackerFeed:
    """The trackers of one run: `start` once, `log` records as they come, `finish` once.

    Called by one process only (see the module); none of its methods raises but an
    interrupt (Ctrl-C, SIGTERM: `Interrupted`, a KeyboardInterrupt). A record an
    interrupt kept from some tracker stays pending and goes with the next call, so the
    run's end (`log` of the last records, then `finish`) still sends all of it; a
    tracker that was not started before the interrupt is left out (the run is ending).
    A feed without trackers does nothing, so callers need not ask whether there are any.
    """

    def __init__(self, trackers: Sequence[Tracker], params: dict[str, Any]):
        self.trackers, self.params = list(trackers), params
        self._started: list[Tracker] = []  # whose start was called, in order
        self._pending: deque[dict[str, Any]] = deque()  # records not yet sent to every started tracker
        self._sent_to = 0  # started trackers the first pending record went to already

    def start(self) -> None:
        """Open each tracker's run with the run's config as its params."""
        for tracker in self.trackers:
            self._started.append(tracker)  # first: a start cut short is not repeated (a second run)
            tracker.start(self.params)

    def log(self, records: Iterable[dict[str, Any]]) -> None:
        """Forward metrics records (metrics.jsonl's, in the file's order) to each started tracker."""
        if not self._started:
            return
        self._pending.extend(records)
        while self._pending:
            while self._sent_to < len(self._started):
                self._started[self._sent_to].log(self._pending[0])
                self._sent_to += 1
            self._pending.popleft()
            self._sent_to = 0

    def finish(self, status: str, run_dir: Path) -> None:
        """Send what is pending, then close each started tracker's run as `status` (summary.json's),
        with the run's files attached."""
        self.log([])
        artifacts = [Path(run_dir) / name for name in ARTIFACTS]
        for tracker in self._started:
            tracker.finish(status, artifacts)


NO_TRACKERS = TrackerFeed([], {})
"""The feed of a process that sends nothing (another node than rank 0's)."""


def tracker_feed(plan: Plan, run_dir: Path) -> TrackerFeed:
    """The feed for the trackers `plan.config.logger` names (none started yet; cheap: the
    trackers' packages are imported when they start)."""
    logger = plan.config.logger
    # The whole logger section: each tracker reads its own keys (tracking_uri, experiment, mode, ...).
    settings = dataclasses.asdict(logger)
    trackers = build_trackers(logger.trackers, run_dir, run_name=run_name(run_dir), settings=settings)
    return TrackerFeed(trackers, plan.config.to_dict())


def feed_at_end(plan: Plan, run_dir: Path, status: str) -> None:
    """Send a run that has ended to its trackers at once: start, every record of metrics.jsonl,
    finish as `status`. For the processes that cannot follow the run while it trains (see the module)."""
    feed = tracker_feed(plan, run_dir)
    if not feed.trackers:
        return
    feed.start()
    # A line cut short by a killed rank is left out, as the progress view leaves it out.
    feed.log(read_metrics(Path(run_dir) / "metrics.jsonl", skip_damaged=True))
    feed.finish(status, run_dir)
