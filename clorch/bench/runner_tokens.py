"""The token data `clorch-bench runner` trains on (a clorch Task each).

* `RandomTokens` (`--tokens random`, the default): uniformly random sequences. Speed does not
  depend on what the tokens say; the "loss after" column then measures how far each loop has
  memorized its training samples.
* `MarkovTokens` (`--tokens markov`): walks of a fixed random Markov chain over a subset of
  the vocabulary, each token followed by one of a few successors. A model can learn it, so
  the loss on held-out walks of the same chain after N steps compares what two loops learned
  (float8 against bf16, for example), not what they memorized: the runner draws as many walks
  as a loop takes samples. One reading is still noisy early on: a model first sits on a plateau
  near ln(STATES) and leaves it at a step that moves by hundreds with the order of the data
  alone, so compare loops well after both have left it (the loss near ln(SUCCESSORS)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clorch.data.base import as_index
from clorch.data.text import lm_per_sample_loss

__all__ = ["RandomTokens", "MarkovTokens", "tokens_task", "bench_tasks", "held_out_lines"]


class RandomTokens:
    """Fixed random token sequences: the same data for both loops (a clorch Task)."""

    tokens_per_sample: int
    compile_loss: bool | str = False  # clorch's side sets it with --compile, as the engine does with compile: true

    def __init__(self, samples: int, seq_len: int, vocab_size: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.data = self._sequences(samples, seq_len + 1, vocab_size, gen)
        self.tokens_per_sample = seq_len

    @staticmethod
    def _sequences(samples: int, length: int, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, vocab_size, (samples, length), generator=gen)

    def __len__(self) -> int:
        return self.data.size(0)

    def batch(self, indices) -> dict[str, torch.Tensor]:
        rows = self.data[as_index(indices, self.data.device)]
        return {"input": rows[:, :-1], "target": rows[:, 1:]}

    def loss(self, model, batch) -> torch.Tensor:
        if not self.compile_loss:  # the plain loop's loss, as a user writes it
            return F.cross_entropy(model(batch["input"]).flatten(0, 1), batch["target"].flatten())
        return lm_per_sample_loss(model(batch["input"]), batch["target"], compiled=self.compile_loss).mean()


class MarkovTokens(RandomTokens):
    """Walks of one Markov chain: `STATES` tokens, each followed by one of `SUCCESSORS` tokens
    drawn uniformly (the best loss is about ln(SUCCESSORS) = 2.08). The chain is fixed by
    `CHAIN_SEED`; `seed` draws the walks, so two seeds give training and held-out walks."""

    STATES, SUCCESSORS, CHAIN_SEED = 1024, 8, 1234

    @classmethod
    def _sequences(cls, samples: int, length: int, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
        chain = torch.Generator().manual_seed(cls.CHAIN_SEED)
        states = min(cls.STATES, vocab_size)
        ids = torch.randperm(vocab_size, generator=chain)[:states]  # which token ids the chain uses
        successors = torch.randint(0, states, (states, cls.SUCCESSORS), generator=chain)
        walk = torch.empty(samples, length, dtype=torch.long)
        walk[:, 0] = torch.randint(0, states, (samples,), generator=gen)
        picks = torch.randint(0, cls.SUCCESSORS, (samples, length), generator=gen)
        for t in range(1, length):
            walk[:, t] = successors[walk[:, t - 1], picks[:, t]]
        return ids[walk]


def tokens_task(kind: str, samples: int, seq_len: int, vocab_size: int, seed: int = 0) -> RandomTokens:
    """The `--tokens` data: "random" or "markov"."""
    cls = MarkovTokens if kind == "markov" else RandomTokens
    return cls(samples, seq_len, vocab_size, seed=seed)


def bench_tasks(
    kind: str, batch_size: int, samples: int, seq_len: int, vocab_size: int
) -> tuple[RandomTokens, RandomTokens]:
    """The runner's (training task, held-out task) for `--tokens KIND`.

    markov: `samples` walks (as many as a loop draws: it learns the chain, not the walks) and 16
    held-out ones; random: one small set of random sequences, read back as its own "held-out" set.
    """
    if kind == "markov":
        return tokens_task("markov", max(512, samples), seq_len, vocab_size), tokens_task(
            "markov", 16, seq_len, vocab_size, seed=1
        )
    task = tokens_task("random", max(64, batch_size * 8), seq_len, vocab_size)
    return task, task


def held_out_lines(curves: dict[str, list[float]], warmup: int, steps: int) -> str:
    """The report's lines of each loop's held-out loss after each of its blocks, and its lowest."""
    text = ""
    for name, curve in curves.items():
        if curve:
            after = [warmup + steps * (i + 1) for i in range(len(curve))]
            text += (
                f"held-out loss of {name} after steps {', '.join(map(str, after))}: "
                f"{', '.join(f'{x:.3f}' for x in curve)} (lowest {min(curve):.3f})\n"
            )
    return text
