"""The `launcher` group: what starts the ranks (clorch's own launcher, or torchrun's agent)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

from clorch.config.registry import Option, constant_of, declare, default_of, option, rule

LAUNCH = "clorch.launch.launcher:launch"
YEAR = constant_of("clorch.launch.config", "MAX_SECONDS")  # longer waits are mistakes

declare("launcher", "what starts the ranks: clorch's launcher or torchrun")


class LauncherOption(Option):
    """Any `launcher` option."""

    # torch's elastic agent starts the ranks (clorch.launch.torchrun), not clorch's launcher
    torch_agent: ClassVar[bool] = False


@option("launcher", "local")
@dataclass
class LocalLauncherConfig(LauncherOption):
    """clorch.distributed.launch on this machine (one node, or one launcher per node)."""

    name: Literal["local"] = "local"
    nproc_per_node: Union[Literal["auto"], int] = field(
        default="auto", metadata=rule(ge=1)
    )  # ranks on this node; auto: one per GPU, or 2 on CPU
    devices: Optional[list[int]] = None  # CUDA device indices, one per local rank, e.g. [0,1]
    timeout: Optional[float] = field(
        default=default_of(LAUNCH, "timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # whole-job limit; null: none
    nnodes: int = field(default=default_of(LAUNCH, "nnodes"), metadata=rule(ge=1))  # nodes in the job
    node_rank: int = field(default=default_of(LAUNCH, "node_rank"), metadata=rule(ge=0))  # this node's index
    master_addr: str = default_of(LAUNCH, "master_addr")  # rendezvous host
    master_port: Optional[int] = field(
        default=default_of(LAUNCH, "master_port"), metadata=rule(ge=1, le=65535)
    )  # null picks a free port
    max_restarts: int = field(
        default=default_of(LAUNCH, "max_restarts"), metadata=rule(ge=0)
    )  # restart a failed job, resuming from latest
    rdzv_timeout: float = field(
        default=default_of(LAUNCH, "rdzv_timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # nnodes > 1: wait this long for the other nodes
    collective_timeout: float = field(
        default=default_of(LAUNCH, "collective_timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # a rank stuck this long in one collective fails the job


@option("launcher", "torchrun")
@dataclass
class TorchrunLauncherConfig(LauncherOption):
    """torch's elastic agent (torchrun) on this node: c10d rendezvous, restarts, several nodes.

    Start the same command on every node; they meet at rdzv_endpoint.
    """

    name: Literal["torchrun"] = "torchrun"
    torch_agent: ClassVar[bool] = True
    nproc_per_node: Union[Literal["auto"], int] = field(default="auto", metadata=rule(ge=1))  # ranks on this node
    nnodes: Union[int, str] = 1  # nodes in the job, or "MIN:MAX" for an elastic range
    rdzv_endpoint: str = "127.0.0.1:29400"  # HOST:PORT of the c10d rendezvous (the first node)
    rdzv_id: str = "clorch"  # the job's id, the same on every node
    rdzv_timeout: float = field(
        default=900.0, metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # wait this long for the nodes
    max_restarts: int = field(default=0, metadata=rule(ge=0))  # restart the ranks, resuming from latest
    collective_timeout: float = field(
        default=default_of(LAUNCH, "collective_timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # a rank stuck this long in one collective fails the job

    def rules(self, cfg: Any) -> list[str]:
        """launcher.nnodes: N or "MIN:MAX" with 1 <= MIN <= MAX."""
        value = self.nnodes
        parts = str(value).split(":")
        try:
            low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
        except ValueError:
            low, high = 0, -1
        if isinstance(value, bool) or not 1 <= low <= high:
            return [
                f"launcher.nnodes={value!r} is not allowed; give a node count >= 1 or a range "
                f"MIN:MAX with 1 <= MIN <= MAX (e.g. 2 or 1:4)"
            ]
        return []
