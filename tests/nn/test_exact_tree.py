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
