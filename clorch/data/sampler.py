"""A distributed sampler whose position survives a checkpoint.

Each rank draws a disjoint, deterministic share of `range(dataset_size)`:

* The epoch's permutation is `torch.randperm(dataset_size)` seeded with
  `seed + epoch`, identical on every rank and in every run; the same indices,
  padding and strides as `torch.utils.data.DistributedSampler`, so switching
  between the two keeps the data order.
* With `drop_last=False` the permutation is padded by repeating it from the
  start until it divides evenly; every index is covered and at most
  `num_replicas - 1` are seen twice. With `drop_last=True` the tail is dropped
  so that every rank gets the same count.
* Rank r takes positions r, r + num_replicas, r + 2 * num_replicas, ...
  With `block_size=k` it takes blocks of k consecutive positions instead (block r,
  r + num_replicas, ...), and the padding (or cut) is to a multiple of
  k x num_replicas. Give k = batch_size x accumulation and every optimizer step's
  micro-batches are the same samples on any world size with the same global
  batch: rank r trains the r-th contiguous part of the step (`exact=true`).

It is a subclass of `torch.utils.data.distributed.DistributedSampler`, so
trainers that check `isinstance(sampler, DistributedSampler)` before calling
`set_epoch` keep reshuffling, and it has torch's attributes (`dataset`,
`num_replicas`, `rank`, `epoch`, `shuffle`, `seed`, `drop_last`,
`num_samples`, `total_size`); every method is clorch's own.

Unlike torch's sampler this one remembers how far it got: `advance(n)` (or
iterating it) moves a per-epoch position, `state_dict()` records it, and
after `load_state_dict()` the sampler continues with the very next index.
Otherwise each new pass (each `iter(loader)`) starts the epoch over, as with
torch's sampler, however far an earlier pass got.

Resuming onto another world size: `global_state_dict()` records the position
as a count of the epoch's global positions consumed (every rank consumes in
step, so after k optimizer steps of global batch G it is k * G), and
`load_global_state_dict()` continues it on any number of ranks. The rest of
that epoch is the interrupted run's own list (its permutation, padded for its
world size) from that position, split round-robin over the new ranks: every
remaining sample is seen once, and each run of G consecutive positions (one
optimizer step of the uninterrupted run) is again one optimizer step, provided
the new ranks keep the global batch (`accumulation_for`). Only the last,
partial step of such an epoch may be padded (or dropped with `drop_last`)
differently. Later epochs follow the new world size's own rule. During such
an epoch `len()` stays the new world size's full count (`remaining()` is
exact) and `state_dict()` raises (`continues_another_world_size` says
when): its per-rank form cannot say where the epoch came from, so save
`global_state_dict()` (sharded checkpoints do, and so do clorch-train's
checkpoint files). `global_state_of(state_dict())` gives the job's position
from a rank's state saved without it.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

import clorch.distributed as cdist
from clorch._args import int_arg as _int_arg
from clorch.distributed.groups import check_group_joined

_STATE_KEYS = ("epoch", "seed", "rank", "num_replicas", "dataset_size", "shuffle", "drop_last", "consumed")
# Keys that must agree between a saved state and the sampler it is loaded into;
# epoch and consumed are what loading restores.
_FIXED_KEYS = ("dataset_size", "num_replicas", "rank", "seed", "shuffle", "drop_last")


def _bool_arg(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def _fit(indices: list[int], replicas: int, drop_last: bool) -> list[int]:
    """Pad `indices` by repeating them from the start (or cut them) to a multiple of `replicas`."""
    n = len(indices)
    if drop_last or n == 0:
        return indices[: n - n % replicas]
    padding = -n % replicas
    return indices + (indices * math.ceil(padding / n))[:padding]


def _fit_length(n: int, replicas: int, drop_last: bool) -> int:
    """len(_fit(range(n), replicas, drop_last)), without building the list."""
    return n - n % replicas if drop_last or n == 0 else n + (-n % replicas)


def accumulation_for(global_batch_size: int, batch_size: int, world_size: int) -> int:
    """The accumulation steps that keep `global_batch_size` = batch_size x world_size x accumulation.

    A run resumed on another number of ranks calls it with the saved run's
    global batch, so that each optimizer step averages the same samples.

    Raises:
        TypeError / ValueError: an argument is not an int >= 1, or the global batch is
            not a multiple of batch_size x world_size (the message names all three and
            the batch sizes that would fit).
    """
    for name, value in (
        ("global_batch_size", global_batch_size),
        ("batch_size", batch_size),
        ("world_size", world_size),
    ):
        _int_arg(name, value, 1)
    per_step = batch_size * world_size
    if global_batch_size % per_step:
        fits = [b for b in range(1, batch_size + 1) if global_batch_size % (b * world_size) == 0]
        hint = (
            f"batch_size values that fit: {fits}"
            if fits
            else f"no batch_size fits: {world_size} ranks do not divide {global_batch_size}"
        )
        raise ValueError(
            f"global batch {global_batch_size} cannot be kept on world_size {world_size} with batch_size "
            f"{batch_size}: {global_batch_size} is not a multiple of {batch_size} x {world_size} = "
            f"{per_step}; {hint}"
        )
    return global_batch_size // per_step


def _dataset_size(dataset: Any) -> int:
    """A sample count, or the len() of a dataset."""
    if isinstance(dataset, int) and not isinstance(dataset, bool):
        return _int_arg("dataset", dataset, 0)
    if hasattr(dataset, "__len__"):
        return len(dataset)
    raise TypeError(f"dataset must be a dataset with len() or a sample count (int >= 0), got {type(dataset).__name__}")


class DistributedSampler(TorchDistributedSampler):
    """This rank's share of each epoch's permutation, with a resumable position.

    Takes torch's `DistributedSampler` arguments, in torch's order, and passes
    `isinstance(sampler, torch.utils.data.distributed.DistributedSampler)`.

    Args:
        dataset: the dataset (anything with `len()`) or its number of samples, >= 0.
        num_replicas: ranks sharing the data; defaults to the process group's
            world size (1 outside a group, unless WORLD_SIZE > 1 says the
            process should be in one: then RuntimeError).
        rank: this rank, in [0, num_replicas); defaults to the group's rank.
        seed: base seed; the permutation of epoch e is seeded with seed + e.
        shuffle: permute each epoch; False keeps `range(dataset_size)` order.
        drop_last: drop the tail so every rank gets the same count without
            padding (instead of repeating indices from the start).
        block_size: consecutive positions a rank takes in turn (keyword only); 1, the
            default, is torch's round-robin.

    Call `set_epoch(epoch)` (or set `sampler.epoch`) before each epoch. Without it every epoch reuses the
    same permutation, exactly as torch's sampler does.

    Position rules: `advance(n)` and iteration move the position within the
    current epoch; `set_epoch` with a new epoch resets it to 0, and with the
    current epoch keeps it, so the usual loop
    `for epoch in range(start, epochs): sampler.set_epoch(epoch)` continues
    mid-epoch after `load_state_dict`. A new pass (`iter(sampler)`) continues
    from the position only when `load_state_dict` or `advance` set it since the
    last pass began; otherwise it starts the epoch over, as torch's sampler does
    (a peek with `next(iter(loader))` or a pass left with `break` loses no
    samples). `len(sampler)` is always the full per-rank count of an epoch;
    `remaining()` is what is left of it.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: dataset_size < 0, num_replicas < 1, or rank outside
            [0, num_replicas).
        RuntimeError: num_replicas or rank left to its default while no
            process group is initialized but WORLD_SIZE > 1 (a rank of a
            launched job that never joined the group; see
            `clorch.distributed.groups.check_group_joined`).
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        block_size: int = 1,
    ) -> None:
        # Not torch's __init__: it asks torch.distributed for the defaults, which needs a group.
        Sampler.__init__(self)
        if num_replicas is None or rank is None:
            check_group_joined("DistributedSampler")
        self.dataset_size = _dataset_size(dataset)
        self.dataset = dataset
        self.num_replicas = _int_arg("num_replicas", cdist.world_size() if num_replicas is None else num_replicas, 1)
        rank = cdist.rank() if rank is None else rank
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {rank!r} ({type(rank).__name__})")
        if not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, {self.num_replicas}) (num_replicas={self.num_replicas}), got {rank}")
        self.rank = rank
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
        self.seed = seed
        self.shuffle = _bool_arg("shuffle", shuffle)
        self.drop_last = _bool_arg("drop_last", drop_last)
        self.block_size = _int_arg("block_size", block_size, 1)
        # Padding (or the cut) is to a multiple of one turn of every rank's block.
        self._unit = self.block_size * self.num_replicas
        self.num_samples = self._per_rank_count()
        self.total_size = self.num_samples * self.num_replicas
        self._epoch = 0
        self._consumed = 0
        # Set by load_state_dict and advance: the next pass continues from the position
        # (the restored, possibly empty, rest of the epoch); otherwise a pass starts over.
        self._resume_here = False
        self._cache: tuple[int, list[int]] | None = None
        # Set by load_global_state_dict: (epoch, saved world size, global positions consumed);
        # that epoch continues the saved run's list instead of this sampler's own.
        self._carried: tuple[int, int, int] | None = None

    def _per_rank_count(self) -> int:
        if self.block_size > 1:
            return _fit_length(self.dataset_size, self._unit, self.drop_last) // self.num_replicas
        # Same arithmetic as torch.utils.data.DistributedSampler.
        if self.drop_last and self.dataset_size % self.num_replicas != 0:
            return math.ceil((self.dataset_size - self.num_replicas) / self.num_replicas)
        return math.ceil(self.dataset_size / self.num_replicas)

    @property
    def epoch(self) -> int:
        """The current epoch (0 until `set_epoch` is called); setting it is `set_epoch`."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; a new epoch starts at position 0, the current one keeps its position.

        Raises:
            TypeError / ValueError: epoch is not an int >= 0.
        """
        epoch = _int_arg("epoch", epoch, 0)
        if epoch != self._epoch:
            self._epoch = epoch
            self._consumed = 0
            self._resume_here = False

    def _epoch_indices(self) -> list[int]:
        """This rank's full index list for the current epoch (cached per epoch)."""
        if self._cache is not None and self._cache[0] == self._epoch:
            return self._cache[1]
        carried = self._carried if self._carried and self._carried[0] == self._epoch else None
        if carried is None:
            indices = self._global_indices(self._unit)
        else:
            indices = self._global_indices(carried[1])[carried[2] :]
            indices = _fit(indices, self._unit, self.drop_last)
        mine = self._share(indices)
        self._cache = (self._epoch, mine)
        return mine

    def _share(self, indices: list[int]) -> list[int]:
        """This rank's positions of a list whose length is a multiple of one turn (`_unit`)."""
        if self.block_size == 1:
            return indices[self.rank :: self.num_replicas]
        k, start = self.block_size, self.rank * self.block_size
        return [i for turn in range(0, len(indices), self._unit) for i in indices[turn + start : turn + start + k]]

    def _global_indices(self, replicas: int) -> list[int]:
        """The epoch's permutation, padded (or cut) as a world of `replicas` ranks reads it."""
        n = self.dataset_size
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self._epoch)
            indices = torch.randperm(n, generator=generator).tolist()
        else:
            indices = list(range(n))
        return _fit(indices, replicas, self.drop_last)

    def sample_indices(self) -> list[int]:
        """The rest of this epoch's indices for this rank, from the current position.

        A pure read: the position moves only through `advance` or iteration.
        """
        return list(self._epoch_indices()[self._consumed :])

    def remaining(self) -> int:
        """How many of this epoch's indices this rank has not consumed yet."""
        return len(self._epoch_indices()) - self._consumed

    def advance(self, n: int) -> None:
        """Mark the next `n` indices of this epoch as consumed (e.g. after a batch trained).

        Raises:
            TypeError / ValueError: n is not an int in [0, remaining()].
        """
        n = _int_arg("n", n, 0)
        if n > self.remaining():
            raise ValueError(f"n must be in [0, {self.remaining()}] (indices left in epoch {self._epoch}), got {n}")
        self._consumed += n
        self._resume_here = True

    def __iter__(self) -> Iterator[int]:
        """Yield this epoch's indices, advancing the position by one per index yielded.

        The pass starts at the beginning of the epoch, as torch's sampler does,
        unless `load_state_dict` or `advance` set the position since the last
        pass began: then it yields the rest of the epoch from there (nothing,
        for a restored epoch that was finished). A DataLoader with workers
        reads ahead of training, so a position saved mid-epoch then counts
        prefetched indices; use `sample_indices()` and `advance()` where the
        exact position matters.
        """
        start = self._consumed if self._resume_here else 0
        self._consumed, self._resume_here = start, False
        indices = self._epoch_indices()
        epoch = self._epoch
        for position in range(start, len(indices)):
            if self._epoch != epoch:  # set_epoch(new) ends this pass
                return
            self._consumed = position + 1  # this pass's own count: an abandoned pass cannot skip ahead
            yield indices[position]

    def __len__(self) -> int:
        """Indices per rank in a full epoch (mid-epoch too; see `remaining()`)."""
        return self.num_samples

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and bools: the arguments, the epoch and the position within it.

        Raises:
            RuntimeError: the sampler is in an epoch continued from another world size
                (`load_global_state_dict`); save `global_state_dict()` instead.
        """
        if self.continues_another_world_size:
            raise RuntimeError(
                "this epoch continues a run of another world size; its position is "
                "global_state_dict(), not state_dict() (sharded checkpoints save that)"
            )
        return {
            "epoch": self._epoch,
            "seed": self.seed,
            "rank": self.rank,
            "num_replicas": self.num_replicas,
            "dataset_size": self.dataset_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "consumed": self._consumed,
        }

    @staticmethod
    def state_problem(state: Any) -> str | None:
        """What makes `state` no state this class writes (a wrong key or type), or None.

        A checkpoint reader calls it to tell a corrupt or crafted state (a format error)
        from a real sampler's state that does not fit this sampler (`check_state_dict`).
        """
        if not isinstance(state, dict):
            return f"is {type(state).__name__}, not a dict"
        if set(state) != set(_STATE_KEYS):
            return f"has keys {sorted(map(str, state))}, not {sorted(_STATE_KEYS)}"
        for key in _STATE_KEYS:
            value, boolean = state[key], key in ("shuffle", "drop_last")
            if boolean and not isinstance(value, bool):
                return f"has {key}={value!r}, not true or false"
            least = 1 if key == "num_replicas" else 0
            if not boolean and (type(value) is not int or value < least):
                return f"has {key}={value!r}, not an int >= {least}"
        return None

    def check_state_dict(self, state: Any) -> None:
        """Raise the error `load_state_dict(state)` would raise, without changing anything.

        Raises:
            TypeError: state is not a dict.
            ValueError: missing or unknown keys, or a saved dataset_size,
                num_replicas, rank, seed, shuffle or drop_last differing from
                this sampler's (all differences listed), or a bad position.
        """
        if not isinstance(state, dict):
            raise TypeError(f"sampler state must be a dict, got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        unknown = sorted(str(k) for k in state if k not in _STATE_KEYS)
        if missing or unknown:
            raise ValueError(
                f"sampler state has missing keys {missing} and unknown keys {unknown}; "
                f"expected exactly {list(_STATE_KEYS)}"
            )
        mine = self.state_dict()
        differs = [
            f"{k}: saved {state[k]!r}, this sampler {mine[k]!r}"
            for k in _FIXED_KEYS
            if state[k] != mine[k] or type(state[k]) is not type(mine[k])
        ]
        if differs:
            raise ValueError("sampler state was saved by a different sampler: " + "; ".join(differs))
        _int_arg("sampler state 'epoch'", state["epoch"], 0)
        consumed = state["consumed"]
        if isinstance(consumed, bool) or not isinstance(consumed, int) or not 0 <= consumed <= self.num_samples:
            raise ValueError(f"sampler state 'consumed' must be an int in [0, {self.num_samples}], got {consumed!r}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the epoch and position saved by `state_dict()`; the next index is the one after.

        Raises:
            TypeError / ValueError: see `check_state_dict`.
        """
        self.check_state_dict(state)
        self._carried, self._cache = None, None
        self._epoch = state["epoch"]
        self._consumed = state["consumed"]
        self._resume_here = True

    _GLOBAL_FIXED = ("dataset_size", "seed", "shuffle", "drop_last")

    @property
    def continues_another_world_size(self) -> bool:
        """Whether the current epoch continues a run of another world size (`load_global_state_dict`).

        While it does, `state_dict()` raises: save `global_state_dict()` instead.
        """
        return self._carried is not None and self._carried[0] == self._epoch

    @staticmethod
    def global_state_of(state: dict[str, Any]) -> dict[str, Any]:
        """The `global_state_dict()` of the job whose rank saved `state` (a `state_dict()`).

        For a position saved per rank (by a checkpoint of an earlier clorch, say) that is
        to continue on another world size. Like `global_state_dict` it assumes every rank
        of that job consumed as many indices as this one.

        Raises:
            TypeError / ValueError: `state` is not a state `state_dict()` writes.
        """
        problem = DistributedSampler.state_problem(state)
        if problem is not None:
            raise ValueError(f"sampler state {problem}")
        replicas, size, drop_last = state["num_replicas"], state["dataset_size"], state["drop_last"]
        return {
            "epoch": state["epoch"],
            "dataset_size": size,
            "seed": state["seed"],
            "shuffle": state["shuffle"],
            "drop_last": drop_last,
            "layout_replicas": replicas,
            "position": min(_fit_length(size, replicas, drop_last), state["consumed"] * replicas),
        }

    def global_state_dict(self) -> dict[str, Any]:
        """The position as the whole job's, loadable on any world size (`load_global_state_dict`).

        Keys: the epoch, the fixed arguments, `layout_replicas` (what the list this epoch
        follows is padded to a multiple of: the world size, times `block_size` where that
        is over 1) and `position` (global positions of that list
        consumed). It assumes every rank consumed as many indices as this one, as
        ranks training in step do; a sharded checkpoint checks that all ranks agree.
        """
        carried = self._carried if self.continues_another_world_size else None
        layout, offset = (carried[1], carried[2]) if carried else (self._unit, 0)
        full = _fit_length(self.dataset_size, layout, self.drop_last)
        return {
            "epoch": self._epoch,
            "dataset_size": self.dataset_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "layout_replicas": layout,
            "position": min(full, offset + self._consumed * self.num_replicas),
        }

    def load_global_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the epoch of `global_state_dict()` on this sampler's world size and rank.

        Raises:
            TypeError / ValueError: see `check_global_state_dict`.
        """
        epoch, layout, position = self.check_global_state_dict(state)
        self._epoch, self._consumed, self._resume_here = epoch, 0, True
        # The same world size and a position on a rank boundary is the ordinary state.
        self._carried = None if layout == self._unit and position % layout == 0 else (epoch, layout, position)
        if self._carried is None:
            self._consumed = position // self.num_replicas
        self._cache = None

    def check_global_state_dict(self, state: Any) -> tuple[int, int, int]:
        """Raise what `load_global_state_dict(state)` would raise, changing nothing.

        Returns:
            (epoch, layout_replicas, position).

        Raises:
            TypeError: state is not a dict.
            ValueError: missing keys, a dataset_size, seed, shuffle or drop_last
                differing from this sampler's (all listed), or a bad position.
        """
        if not isinstance(state, dict):
            raise TypeError(f"sampler global state must be a dict, got {type(state).__name__}")
        keys = ("epoch", "layout_replicas", "position", *self._GLOBAL_FIXED)
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"sampler global state misses keys {missing}; expected {list(keys)}")
        differs = [
            f"{k}: saved {state[k]!r}, this sampler {getattr(self, k)!r}"
            for k in self._GLOBAL_FIXED
            if state[k] != getattr(self, k)
        ]
        if differs:
            raise ValueError("sampler global state was saved by a different sampler: " + "; ".join(differs))
        epoch = _int_arg("sampler global state 'epoch'", state["epoch"], 0)
        layout = _int_arg("sampler global state 'layout_replicas'", state["layout_replicas"], 1)
        full = _fit_length(self.dataset_size, layout, self.drop_last)
        position = state["position"]
        if type(position) is not int or not 0 <= position <= full:
            raise ValueError(f"sampler global state 'position' must be an int in [0, {full}], got {position!r}")
        return epoch, layout, position

    def __repr__(self) -> str:
        return (
            f"DistributedSampler(dataset_size={self.dataset_size}, num_replicas={self.num_replicas}, "
            f"rank={self.rank}, seed={self.seed}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, epoch={self._epoch}, consumed={self._consumed})"
        )
