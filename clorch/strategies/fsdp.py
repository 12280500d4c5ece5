"""`FSDPStrategy` (parallel=fsdp): torch's fully_shard; each rank holds its shard of the model's state.

Checkpoints are sharded directories (`clorch.checkpoint.sharded`: `step_00000100.dcp`,
`final.dcp`) to which every rank writes its own shards; export and the digest gather the
parameters one at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from clorch.checkpoint.policy import Latest
from clorch.checkpoint.sharded import (
    find_latest_sharded,
    load_sharded,
    prune_sharded_checkpoints,
    save_sharded,
    sharded_step_path,
)
from clorch.nn.parallel.fsdp import ShardedTrainer, device_mesh, shard_model, sharded_norm_and_clip
from clorch.strategies.base import ModelSource, Strategy, compile_mode_of, compiled, weights_digest


class _Weights:
    """A state dict standing in for a module where one is written (save_safetensors)."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self._state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


class FSDPStrategy(Strategy):
    """parallel=fsdp, configured by the option's keys (`clorch.config.options.parallel.FSDPParallelConfig`).

    Args:
        parallel: the `parallel=fsdp` option, or any object with its keys.
        compile_mode: torch.compile's mode for the sharded model's forward; False: not compiled.
    """

    checkpoint_suffix = ".dcp"
    final_name = "final.dcp"

    def __init__(
        self,
        precision: Any,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        *,
        parallel: Any = None,
        compile_mode: Any = False,
    ):
        super().__init__(precision, device, rank, world_size)
        self.parallel, self.compile_mode = parallel, compile_mode

    @classmethod
    def from_config(cls, cfg: Any, precision: Any, device: torch.device, rank: int, world_size: int) -> FSDPStrategy:
        return cls(precision, device, rank, world_size, parallel=cfg.parallel, compile_mode=compile_mode_of(cfg))

    def setup(self, source: ModelSource, build_optimizer: Callable[[nn.Module], torch.optim.Optimizer]) -> None:
        """Shard the model over every rank of the job, in train mode, its shards on the device (in
        host memory with `parallel.cpu_offload`). Collective: fully_shard over the mesh.

        No rank holds the whole model where `source` can build it on the meta device: it is
        sharded there, then given storage and values shard by shard (`source.fill`). Otherwise
        it is built whole in host memory and each unit cut to this rank's shard as it is sharded.
        The optimizer is built after sharding: its state is sharded too.
        """
        parallel = self.parallel
        raw, covered = source.on_meta()
        on_meta = raw is not None
        if not on_meta:
            raw = source.whole()
        if self.device.type == "cuda" and not parallel.cpu_offload:
            torch.cuda.set_device(self.device)  # fully_shard moves each unit to the current device
        # bf16 and fp16: parameters all-gathered and computed in that dtype, gradients
        # reduce-scattered in fp32 into fp32 shards (fp16's loss scaler unscales those);
        # parallel.param_dtype=fp32 gathers fp32 and leaves the casts to autocast, as under ddp.
        shard_model(
            raw,
            mesh=self.device_mesh(),
            shard_modules=parallel.shard,
            min_params=parallel.min_params,
            reshard_after_forward=parallel.reshard_after_forward,
            policy=self.precision.fsdp_policy(parallel.param_dtype),
            cpu_offload=parallel.cpu_offload,
        )
        if on_meta:
            source.fill(raw, torch.device("cpu") if parallel.cpu_offload else self.device, covered)
        raw.train()
        forward = compiled(raw, self.compile_mode)
        self.raw_model, self.optimizer = raw, build_optimizer(raw)
        self.model = ShardedTrainer(raw, None if forward is raw else forward)

    def device_mesh(self) -> DeviceMesh:
        """The mesh `setup` shards over: every rank of the job, one dimension (collective: every rank
        calls it). A mode that arranges the ranks otherwise (`HSDPStrategy`) overrides it."""
        return device_mesh(self.device.type)

    def clip_gradients(self, max_norm: float | None) -> torch.Tensor | None:
        """Collective: the partial norms of the shards are all-reduced over the mesh. The precision
        object unscales the sharded gradients first (each rank its own shard)."""
        if not any(p.grad is not None for p in self.raw_model.parameters()):
            return None
        self.precision.unscale_gradients(self.optimizer)
        return sharded_norm_and_clip(self.raw_model.parameters(), max_norm)

    def optimizer_step(self) -> bool | torch.Tensor:
        """The precision object steps on the sharded gradients (its found-inf flag all-reduced over
        the job's ranks, so every rank skips the same steps); then the gradients are zeroed."""
        stepped = self.precision.optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return stepped

    def padding_batches(self, batches: int, batches_of_rank0: int) -> int:
        """A sharded forward is collective (it all-gathers each unit): a rank with fewer batches
        than rank 0 runs as many more forwards."""
        return max(0, batches_of_rank0 - batches)

    # -- checkpoints: a directory of every rank's shards (DCP) -------------------------------------

    @classmethod
    def step_path(cls, directory: Path, step: int) -> Path:
        return sharded_step_path(directory, step)

    @classmethod
    def find_latest(cls, directory: Path) -> Latest:
        return find_latest_sharded(directory)

    @classmethod
    def prune(cls, directory: Path, keep_last: int) -> None:
        prune_sharded_checkpoints(directory, keep_last)

    @classmethod
    def parameters_held(cls, parallel: Any, params: int, world_size: int, device_type: str) -> int:
        """Each rank's share of its shard group's replica (`parallel.layout`); none on the GPU with cpu_offload."""
        offloaded = getattr(parallel, "cpu_offload", False) and device_type == "cuda"
        return 0 if offloaded else -(-params // parallel.layout(world_size).shard_size)

    def save(self, path: Path, sampler: Any, state: dict[str, Any]) -> None:
        """fp16's loss scale travels in the state (a checkpoint file holds it apart)."""
        scaler = self.precision.scaler
        state["scaler"] = None if scaler is None else scaler.state_dict()
        save_sharded(path, model=self.raw_model, optimizer=self.optimizer, sampler=sampler, state=state)

    def load(self, path: Path, sampler: Any) -> Any:
        saved = load_sharded(path, model=self.raw_model, optimizer=self.optimizer, sampler=sampler)
        scaler = self.precision.scaler
        if scaler is not None and isinstance(saved, dict) and saved.get("scaler"):
            scaler.load_state_dict(saved["scaler"])
        return saved

    # -- the trained weights: gathered one parameter at a time --------------------------------------

    def export_weights(self) -> Any:
        """torch's full state dict with CPU offload: rank 0's host memory gets each parameter whole,
        the other ranks keep none."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.raw_model, options=options)
        return _Weights(state) if self.rank == 0 else None

    def weights_digest(self) -> str | None:
        """Every rank takes part in gathering the weights (one parameter at a time)."""
        digest = weights_digest(self.raw_model)
        return digest if self.rank == 0 else None
