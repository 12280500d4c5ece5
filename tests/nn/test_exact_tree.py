"""The fixed summation tree of exact=true (clorch.nn.parallel.exact), in one process and on gloo ranks.

The claim: a step's gradient is the same bits whichever ranks computed which
micro-batches, because the tree over the micro-batch index fixes every addition.
"""

from __future__ import annotations

import pytest
import torch

from clorch.nn.parallel.exact import TreeGradients, cover, micro_batch_seed, tree_sum
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def test_cover_splits_a_range_into_the_largest_nodes_inside_it():
    assert cover(0, 8, 0, 8) == [(0, 8)]
    assert cover(0, 8, 0, 4) == [(0, 4)]
    assert cover(0, 8, 2, 6) == [(2, 4), (4, 6)]
    assert cover(0, 6, 2, 4) == [(2, 3), (3, 4)]  # 6 leaves split 3 + 3: ranks of 2 cross the middle
    assert cover(0, 5, 0, 5) == [(0, 5)]
    for total, ranks in [(8, 2), (12, 3), (6, 3), (7, 7), (10, 5)]:
        per = total // ranks
        leaves = [
            leaf for r in range(ranks) for node in cover(0, total, r * per, (r + 1) * per) for leaf in range(*node)
        ]
        assert leaves == list(range(total))


def _leaves(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    # Values of very different sizes, so that another order of addition rounds differently.
    return [torch.randn(64, generator=generator) * 10.0 ** float(i % 7 - 3) for i in range(count)]


def test_the_tree_sum_is_the_same_from_any_split_and_differs_from_a_running_sum():
    leaves = _leaves(12)
    whole = tree_sum({(i, i + 1): leaf for i, leaf in enumerate(leaves)}, 0, 12)
    for ranks in (2, 3, 4, 6, 12):
        per = 12 // ranks
        local = {(i, i + 1): leaf for i, leaf in enumerate(leaves)}
        nodes = {n: tree_sum(local, *n) for r in range(ranks) for n in cover(0, 12, r * per, (r + 1) * per)}
        assert torch.equal(tree_sum(nodes, 0, 12), whole), ranks
    running = torch.zeros(64)
    for leaf in leaves:
        running = running + leaf
    assert not torch.equal(running, whole)  # so the test can tell orders apart


def test_micro_batch_seed_depends_on_the_data_position_only():
    assert micro_batch_seed(0, 3, 1) == micro_batch_seed(0, 3, 1)
    assert len({micro_batch_seed(s, t, j) for s in (0, 1) for t in (0, 1) for j in (0, 1)}) == 8


def _step_on_ranks(rank: int, world: int, per_rank: int, total: int) -> list[float]:
    """Each rank adds its micro-batches' gradients of a fixed linear model; returns the summed gradient."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    tree = TreeGradients(model.parameters(), rank, world, torch.device("cpu"))
    data = torch.Generator().manual_seed(11)
    inputs = [torch.randn(3, 16, generator=data) * 10.0 ** float(j % 5 - 2) for j in range(total)]
    for j in range(rank * per_rank, (rank + 1) * per_rank):
        loss = model(inputs[j]).square().sum() / total
        loss.backward()
        tree.add(loss)
    summed = tree.finish()
    return [summed.item(), *model.weight.grad.reshape(-1).tolist(), *model.bias.grad.tolist()]


def test_one_two_and_four_gloo_ranks_sum_to_the_same_bits():
    results = {world: run_ranks(_step_on_ranks, world, 8 // world, 8) for world in (1, 2, 4)}
    for world, per_rank in results.items():
        assert all(r == per_rank[0] for r in per_rank), world  # every rank holds the same sum
    assert results[1][0] == results[2][0] == results[4][0]


def test_gradients_held_by_other_tensors_are_summed_as_the_parameters_own():
    torch.manual_seed(0)
    model, twin = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    tree = TreeGradients(model.parameters(), 0, 1, torch.device("cpu"))
    leaves = []
    for j in range(3):
        twin(torch.randn(2, 5) * 10.0 ** (j - 1)).square().sum().backward()
        leaves.append([p.grad.clone() for p in twin.parameters()])
        tree.add(torch.tensor(float(j)), twin.parameters())
        assert all(p.grad is None for p in twin.parameters())  # cleared for the next micro-batch
    total = tree.summed()
    assert total[-1].item() == 3.0  # the losses, after the gradients
    for i, view in enumerate(tree.views(total)):  # [0, 3) = [0, 1) + ([1, 2) + [2, 3))
        assert torch.equal(view, leaves[0][i] + (leaves[1][i] + leaves[2][i]))
    with pytest.raises(ValueError, match=r"gradient holders' shapes \[\(5, 3\), \(3,\)\] are not the parameters'"):
        tree.add(torch.tensor(0.0), [torch.zeros(5, 3, requires_grad=True), torch.zeros(3, requires_grad=True)])


def _fsdp_keeps_whole_gradients(rank: int, world: int) -> list[bool]:
    """What ExactFSDPStrategy assumes of torch's FSDP2, checked against the same model unsharded."""
    import copy

    from torch.distributed.tensor import DTensor

    from clorch.nn.parallel.fsdp import shard_model
    from clorch.strategies.exact_fsdp import keep_gradients_unsharded, reshard, shard_of, unsharded_parameters

    torch.manual_seed(0)
    whole = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    sharded = shard_model(copy.deepcopy(whole), shard_modules=["Linear"], policy=None)
    keep_gradients_unsharded(sharded)
    data = torch.Generator().manual_seed(1)
    checks = []
    for _ in range(2):  # the second micro-batch starts from the state the first one left
        x = torch.randn(4, 6, generator=data)
        whole.zero_grad(set_to_none=True)
        whole(x).square().sum().backward()
        sharded(x).square().sum().backward()
        held = unsharded_parameters(sharded)  # plain tensors, whole shapes, the micro-batch's gradient
        checks.append(all(torch.equal(h.grad, p.grad) for h, p in zip(held, whole.parameters())))
        grads = [h.grad for h in held]
        for h in held:
            h.grad = None
        reshard(sharded)
        shards = list(sharded.parameters())
        checks.append(all(isinstance(p, DTensor) for p in shards))
        pieces = [shard_of(g, p) for g, p in zip(grads, shards)]
        checks.append(all(torch.equal(piece.full_tensor(), g) for piece, g in zip(pieces, grads)))
        checks.append(
            all(
                piece.to_local().untyped_storage().data_ptr() == g.untyped_storage().data_ptr()
                for piece, g in zip(pieces, grads)
            )
        )
    return checks


class _WithUnusedUnit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _fsdp_unit_left_out(rank: int, world: int) -> list[tuple[str, bool, bool]]:
    """A unit whose forward did not run stays sharded: zeros of its whole shape stand in."""
    from clorch.nn.parallel.fsdp import shard_model
    from clorch.strategies.exact_fsdp import keep_gradients_unsharded, unsharded_parameters

    torch.manual_seed(0)
    model = shard_model(_WithUnusedUnit(), shard_modules=["Linear"], policy=None)
    keep_gradients_unsharded(model)
    model(torch.randn(4, 6)).sum().backward()
    held = unsharded_parameters(model)
    return [(tuple(h.shape), h.grad is not None, bool(h.grad is None and not h.any())) for h in held]


def test_fsdp_leaves_each_micro_batchs_whole_gradient_unreduced_and_shard_of_views_its_rows():
    for checks in run_ranks(_fsdp_keeps_whole_gradients, 2):
        assert checks == [True] * 8, checks
    for held in run_ranks(_fsdp_unit_left_out, 2):
        assert held == [((5, 6), True, False), ((5,), True, False), ((3, 5), False, True), ((3,), False, True)]
