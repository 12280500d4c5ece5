"""Gradients summed in one fixed order on any world size: the arithmetic of `exact=true`.

An optimizer step's global batch is `M` micro-batches in the sampler's order;
rank r of W holds the contiguous range [r * M / W, (r + 1) * M / W) of them
(`clorch.data.DistributedSampler(block_size=...)` lays the data out so). The
step's gradient is the sum of the micro-batches' gradients in one balanced
binary tree over the micro-batch index: a node [lo, hi) is the sum of
[lo, mid) and [mid, hi), mid = (lo + hi) // 2, a leaf one micro-batch's
gradient. Floating-point addition is commutative but not associative, so a
fixed tree fixes every bit: whoever adds two nodes gets the same sum.

Each rank sums the largest nodes that lie wholly in its range (`cover`), from
its own leaves; the ranks then exchange those nodes (one all-gather, whatever
the world size divides) and every rank adds the upper nodes itself, in the same
tree. The backend's own reduction order (NCCL's rings, gloo's algorithms)
decides no bit, and neither does the world size: one rank computes every node
itself, in the same tree.

A sharded model (parallel=fsdp) sums the same tree: each micro-batch's whole
gradient is a leaf (`add` takes it from the unsharded parameters), `summed`
gives the whole sum on every rank, and each rank keeps its shard of it
(`views`, then `clorch.strategies.exact_fsdp`).

The price against an all-reduce: each rank keeps its micro-batches' gradients
until the step's end (one flat float32 copy each) and receives every other
rank's nodes (a few model-sized buffers per rank) instead of a reduced sum.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch

import clorch.distributed as cdist

__all__ = ["TreeGradients", "cover", "micro_batch_seed", "tree_sum"]


def _mid(lo: int, hi: int) -> int:
    return (lo + hi) // 2


def cover(lo: int, hi: int, start: int, stop: int) -> list[tuple[int, int]]:
    """The largest nodes of the tree over [lo, hi) that lie wholly in [start, stop), in order."""
    if stop <= lo or hi <= start or start >= stop:
        return []
    if start <= lo and hi <= stop:
        return [(lo, hi)]
    mid = _mid(lo, hi)
    return cover(lo, mid, start, stop) + cover(mid, hi, start, stop)


def tree_sum(nodes: dict[tuple[int, int], torch.Tensor], lo: int, hi: int) -> torch.Tensor:
    """Node [lo, hi) of the tree, from the nodes known (`nodes`, leaves included).

    Raises:
        KeyError: a leaf under [lo, hi) is neither known nor covered by a known node.
    """
    known = nodes.get((lo, hi))
    if known is not None:
        return known
    if hi - lo == 1:
        raise KeyError(f"micro-batch {lo} has no gradient on this rank and no node covers it")
    mid = _mid(lo, hi)
    return tree_sum(nodes, lo, mid) + tree_sum(nodes, mid, hi)


def micro_batch_seed(seed: int, step: int, index: int) -> int:
    """The seed of the draws (dropout masks, ...) of micro-batch `index` of optimizer step
    `step`: a function of the data's place in the run, not of the rank that trains it."""
    digest = hashlib.sha256(f"clorch-exact/{seed}/{step}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _flatten(params: list[torch.Tensor], loss: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One micro-batch's gradients (zeros where a parameter got none) and its loss, as one
    float32 vector."""
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float() for p in params]
    parts.append(loss.detach().reshape(1).float().to(device))
    return torch.cat(parts)


class TreeGradients:
    """Collects one rank's micro-batch gradients and sums the step's gradient in the tree.

    Args:
        params: the parameters whose gradients are summed (every rank: the same, in the same order).
        rank, world_size: where this rank's micro-batches lie among the step's.
        device: where the sums are kept.
    """

    def __init__(self, params: Iterable[torch.Tensor], rank: int, world_size: int, device: torch.device):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world_size, self.device = rank, world_size, device
        self.leaves: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor, holders: Iterable[torch.Tensor] | None = None) -> None:
        """Take the gradients the last backward left in `.grad` (and its loss) as the next leaf,
        and clear `.grad` for the next micro-batch. Local.

        Args:
            holders: the tensors whose `.grad` hold the micro-batch's gradients, one per
                parameter in `params`' order and shapes (a sharded model's unsharded
                parameters); default: `params` themselves.

        Raises:
            ValueError: `holders` do not match `params` in number or shapes.
        """
        held = self.params if holders is None else [h for h in holders if h.requires_grad]
        if [tuple(h.shape) for h in held] != [tuple(p.shape) for p in self.params]:
            raise ValueError(
                f"TreeGradients.add(): the gradient holders' shapes {[tuple(h.shape) for h in held]} "
                f"are not the parameters' {[tuple(p.shape) for p in self.params]}"
            )
        self.leaves.append(_flatten(held, loss, self.device))
        for h in held:
            h.grad = None

    def summed(self) -> torch.Tensor:
        """The step's micro-batches summed in the tree: one float32 vector, the gradients in
        `params`' order and then the loss, bit for bit the same on every rank and world size.

        Every rank must call it once per step with the same number of leaves: one
        all-gather where world_size > 1 (blocking with gloo; ordered on the current
        stream with NCCL). Raises the backend's RuntimeError when a peer has died.

        Raises:
            ValueError: no leaf was added this step.
        """
        count = len(self.leaves)
        if count == 0:
            raise ValueError("TreeGradients.summed(): no micro-batch gradient was added this step")
        total_count = count * self.world_size
        first = self.rank * count
        local = {(first + i, first + i + 1): leaf for i, leaf in enumerate(self.leaves)}
        mine = cover(0, total_count, first, first + count)
        nodes = {node: tree_sum(local, *node) for node in mine}
        if self.world_size > 1:
            nodes = self._exchange(nodes, count)
        self.leaves = []
        return tree_sum(nodes, 0, total_count)

    def finish(self) -> torch.Tensor:
        """Sum the step's micro-batches in the tree (`summed`: collective), write the sum into
        `.grad` on every rank, and return the step's summed loss (a 0-d float32 tensor, the
        same on every rank).

        Raises:
            ValueError: no leaf was added this step.
        """
        total = self.summed()
        for p, view in zip(self.params, self.views(total)):
            p.grad = view.to(p.dtype)
        return total[-1]

    def views(self, total: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's gradient in `total` (from `summed`), as a view in the parameter's
        whole shape (a sharded parameter's global shape). Local."""
        views, offset = [], 0
        for p in self.params:
            n = p.numel()
            views.append(total[offset : offset + n].view(p.shape))
            offset += n
        return views

    def _exchange(self, mine: dict[tuple[int, int], torch.Tensor], count: int) -> dict[tuple[int, int], torch.Tensor]:
        """Every rank's nodes, gathered (collective: every rank calls it, with the same `count`)."""
        total_count = count * self.world_size
        covers = [cover(0, total_count, r * count, (r + 1) * count) for r in range(self.world_size)]
        width = max(len(c) for c in covers)
        size = next(iter(mine.values())).numel()
        sent = torch.zeros(width, size, device=self.device)
        for row, node in enumerate(covers[self.rank]):
            sent[row] = mine[node]
        received = torch.empty(width * self.world_size, size, device=self.device)
        cdist.all_gather_into(received, sent)
        return {node: received[r * width + row] for r, c in enumerate(covers) for row, node in enumerate(c)}
