"""The runner's token data: the Markov chain is fixed, learnable and drawn apart for held-out walks."""

from __future__ import annotations

import math

import torch

from clorch.bench.runner_tokens import MarkovTokens, RandomTokens, tokens_task


def test_markov_walks_follow_one_fixed_chain_with_few_successors():
    train = tokens_task("markov", 64, 100, 50304)
    held_out = tokens_task("markov", 16, 100, 50304, seed=1)
    assert isinstance(train, MarkovTokens) and train.data.shape == (64, 101)
    assert not torch.equal(train.data[:16], held_out.data)  # other walks ...
    successors: dict[int, set[int]] = {}
    for rows in (train.data, held_out.data):
        for a, b in zip(rows[:, :-1].flatten().tolist(), rows[:, 1:].flatten().tolist()):
            successors.setdefault(a, set()).add(b)
    # ... of the same chain: every token has at most SUCCESSORS followers across both sets
    assert max(len(s) for s in successors.values()) <= MarkovTokens.SUCCESSORS
    assert len(successors) <= MarkovTokens.STATES
    assert torch.equal(train.data, tokens_task("markov", 64, 100, 50304).data)  # seeded


def test_the_chains_best_loss_is_far_below_random_tokens():
    # the entropy of a next token is at most ln(SUCCESSORS); uniform tokens have ln(vocab)
    assert math.log(MarkovTokens.SUCCESSORS) < 0.25 * math.log(50304)
    assert type(tokens_task("random", 4, 8, 512)) is RandomTokens
