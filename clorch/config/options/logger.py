"""The `logger` group: where a run's metrics go besides metrics.jsonl."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from clorch.config.registry import Option, declare, option
from clorch.trackers import TRACKERS, missing_extras

declare("logger", "metrics.jsonl, TensorBoard, experiment trackers")

LoggerName = Literal[("jsonl", "tensorboard", *TRACKERS)]  # type: ignore[valid-type]
TrackerName = Literal[TRACKERS]  # type: ignore[valid-type]


@option("logger", "jsonl")
@option("logger", "tensorboard", name="tensorboard", tensorboard=True)
@dataclass
class LoggerConfig(Option):
    """metrics.jsonl from rank 0 (always written); TensorBoard event files and experiment trackers optionally."""

    name: LoggerName = "jsonl"
    tensorboard: bool = False  # also write TensorBoard event files (needs the tensorboard extra)
    progress: Literal["auto", "bar", "lines", "off"] = "auto"  # auto: a bar on a terminal, else lines
    # experiment trackers the run's metrics go to (clorch.trackers: mlflow, wandb, ...)
    trackers: list[TrackerName] = field(default_factory=list)
    experiment: Optional[str] = (
        None  # the MLflow experiment and W&B project; null: $MLFLOW_EXPERIMENT_NAME / $WANDB_PROJECT, else clorch
    )
    tracking_uri: Optional[str] = (
        None  # MLflow's store or server; null: $MLFLOW_TRACKING_URI, else sqlite mlflow.db beside outputs/
    )
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"  # W&B: auto is online when logged in, else offline

    def rules(self, cfg: Any) -> list[str]:
        errors = [f"logger.trackers: {e}" for e in missing_extras(self.trackers)]
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            errors.append(
                "logger=tensorboard needs the tensorboard package: "
                "pip install tensorboard (in a clorch checkout: pip install '.[tensorboard]'), "
                "or use logger=jsonl"
            )
        return errors


for _tracker in TRACKERS:  # logger=mlflow is logger.trackers=[mlflow], one option per tracker
    option("logger", _tracker, name=_tracker, trackers=[_tracker])(LoggerConfig)
