"""Which of a study's running trials are cut off, and which run live in another sweep.

Several sweeps may share one study (Optuna's distributed pattern: workers, for
example SLURM jobs, with one `hydra.sweeper.storage` and `study_name`). A trial the
study calls RUNNING may be running now in another sweep, or may have been cut off
(its sweep was stopped or killed). Each sweep therefore marks the trials it runs,
as Optuna's heartbeat (`heartbeat_interval`, `grace_period`) does for `optimize`,
but for every storage and for trials that run in other processes:

    clorch_sweep_uid   the id of the sweep directory whose sweep runs the trial
    clorch_heartbeat   when that sweep last said the trial runs (Unix time), every
                       HEARTBEAT_S while it runs; 0 once the sweep let it go (a signal
                       stopped it: continuing the sweep runs it again)

A RUNNING trial is cut off, and continuing the sweep runs it again in its own
directory, when its heartbeat is older than STALE_S or 0, or when it belongs to this
sweep directory (whose lock this sweep holds: the sweep that ran it has ended), or,
in the study file of the sweep directory, when it carries no mark (a sweep of an
older clorch). A live trial of another sweep is left to it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import optuna

UID_ATTR = "clorch_sweep_uid"
BEAT_ATTR = "clorch_heartbeat"
HEARTBEAT_S = 30.0  # how often a running trial's heartbeat is written
STALE_S = 120.0  # a heartbeat older than this: the sweep that ran the trial is gone


def cut_off(
    trials: list[Any], uid: str, own_file: bool, now: float | None = None, stale_s: float = STALE_S
) -> list[Any]:
    """The RUNNING trials among `trials` (FrozenTrials) that no live sweep runs (see the module's docstring).

    Args:
        uid: this sweep directory's id.
        own_file: the study lives in this sweep directory's own file (no shared storage).
    """
    now = time.time() if now is None else now
    found = []
    for trial in trials:
        if trial.state != optuna.trial.TrialState.RUNNING:
            continue
        owner, beat = trial.user_attrs.get(UID_ATTR), trial.user_attrs.get(BEAT_ATTR)
        if owner == uid or (owner is None and own_file) or (beat is not None and now - float(beat) > stale_s):
            found.append(trial)
    return found


class Heartbeats:
    """The heartbeats of this sweep's running trials, written by a daemon thread.

    `storage` is an Optuna storage object (BaseStorage); `mark` and `release` write at once,
    the thread every `interval` seconds. A failed write is said once and retried at the next
    beat: a trial is not stopped for it (the study's own writes report a lost storage).
    """

    def __init__(self, storage: Any, uid: str, interval: float = HEARTBEAT_S) -> None:
        self.storage, self.uid, self.interval = storage, uid, interval
        self._running: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._beat_forever, name="clorch-sweep-heartbeat", daemon=True)
        self._thread.start()

    def mark(self, trial_id: int) -> None:
        """Trial `trial_id` runs in this sweep from now on."""
        self.storage.set_trial_user_attr(trial_id, UID_ATTR, self.uid)
        self.storage.set_trial_user_attr(trial_id, BEAT_ATTR, time.time())
        with self._lock:
            self._running.add(trial_id)

    def ended(self, trial_id: int) -> None:
        """Trial `trial_id` was told its end: no more heartbeats."""
        with self._lock:
            self._running.discard(trial_id)

    def release(self, trial_id: int) -> None:
        """Trial `trial_id` was cut off here (a signal): any sweep may run it again."""
        self.ended(trial_id)
        self._write(trial_id, 0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                running = list(self._running)
            for trial_id in running:
                self._write(trial_id, time.time())

    def _write(self, trial_id: int, beat: float) -> None:
        try:
            self.storage.set_trial_user_attr(trial_id, BEAT_ATTR, beat)
        except optuna.exceptions.UpdateFinishedTrialError:
            self.ended(trial_id)  # told its end meanwhile
        except Exception as exc:  # the storage is busy or gone: the study's own writes will say so
            if not self._warned:
                self._warned = True
                print(f"clorch-train: a trial's heartbeat could not be written ({exc}); retrying", file=sys.stderr)
