"""Your own map-style `torch.utils.data.Dataset` as a clorch task: `DatasetTask`.

The engine trains every task through the same few calls (`clorch.data.base`); this
one adapts a dataset of yours to them:

* Batches come from torch's `DataLoader` (your `collate_fn`, `num_workers`,
  `pin_memory`, `persistent_workers`, `prefetch_factor`), fed with the index
  lists clorch's `DistributedSampler` hands out, so a rank reads only its shard
  and a resumed run continues with the very next sample, with workers too
  (exact as long as `dataset[i]` is the same item for the same `i`).
* A batch is what the collate function returns: an `(input, target)` pair
  (a tuple or list; more members are passed on untouched) or a dict with
  "input" and "target" keys. `loss_fn(model(input), target)` is the loss (with
  cross_entropy or mse, a model's output object such as Hugging Face's
  `SequenceClassifierOutput` gives its `.logits`), unless a step function
  `step(model, batch)` computes it (returning the loss, or
  `(loss, {"metric": value, ...})` with batch means as values).
* Eval sums every metric over samples (a batch mean times its size), so the
  engine's all-reduce gives exact means over the eval split. With the
  cross-entropy loss eval adds `accuracy` (argmax over dim 1 == target).

`IterableDataset`s are refused: the sampler must be able to index the data to
shard it across ranks and to resume mid-epoch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, default_collate

from clorch.data.base import derive_seed

LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": nn.functional.cross_entropy,
    "mse": nn.functional.mse_loss,
}


def check_map_style(dataset: Any, where: str = "data._target_") -> None:
    """Raise TypeError unless `dataset` is a sized, indexable (map-style) dataset."""
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            f"{where} built an IterableDataset ({type(dataset).__name__}); clorch shards and "
            "resumes by index, so it takes map-style datasets (__getitem__ and __len__): "
            "wrap your stream in a Dataset that indexes it, or write a worker with the library API"
        )
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(
            f"{where} built a {type(dataset).__name__}, which has no __getitem__ and __len__: "
            "it must be a map-style torch.utils.data.Dataset"
        )


def dataset_model_kwargs(dataset: Any) -> dict:
    """A dataset's `model_kwargs()` (also through the Subset `hold_out` makes), else {}."""
    offered = getattr(dataset, "model_kwargs", None)
    if offered is None and isinstance(dataset, Subset):
        offered = getattr(dataset.dataset, "model_kwargs", None)
    return dict(offered()) if callable(offered) else {}


def hold_out(dataset: Dataset, eval_fraction: float) -> tuple[Dataset, Dataset]:
    """(train, eval): the dataset's last `eval_fraction` held out (at least one sample each).

    Raises:
        ValueError: fewer than two samples, so one split would be empty.
    """
    size = len(dataset)
    held = max(1, int(size * eval_fraction))
    if size - held < 1:
        raise ValueError(
            f"the dataset has {size} sample(s): holding out data.eval_fraction="
            f"{eval_fraction} of it leaves no training samples"
        )
    return Subset(dataset, range(size - held)), Subset(dataset, range(size - held, size))


def split_parts(batch: Any) -> tuple[Any, Any]:
    """(input, target) of a batch: an (input, target, ...) sequence or an {"input", "target"} dict.

    Raises:
        TypeError: any other shape (a step function of your own can read it).
    """
    if isinstance(batch, Mapping) and "input" in batch and "target" in batch:
        return batch["input"], batch["target"]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    shape = f"a dict with keys {sorted(batch)}" if isinstance(batch, Mapping) else type(batch).__name__
    raise TypeError(
        f"a batch must be an (input, target) pair or a dict with 'input' and 'target' keys, "
        f"got {shape}: return one of those from your dataset or collate_fn, or name a step "
        "function with step._target_ (called step(model, batch))"
    )


def logits_of(out: Any) -> Any:
    """The logits in what a model returned: a tensor itself, else its `.logits` or `["logits"]`
    (Hugging Face's ModelOutput), else the first tensor of a tuple that is not 0-d (nanoGPT's
    `(logits, loss)`); None when there is none."""
    if isinstance(out, torch.Tensor):
        return out
    found = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(found, torch.Tensor):
        return found
    if isinstance(out, (tuple, list)):
        return next((v for v in out if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    return None


def batch_size_of(batch: Any) -> int:
    """The number of samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.size(0) if batch.dim() else 1
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    for value in values:
        found = batch_size_of(value)
        if found:
            return found
    return 0


class _IndexBatches:
    """The DataLoader's batch sampler: the micro-batches' index lists, set before each pass.

    One sampler object for the loader's life, so that persistent workers survive
    from one pass to the next (the loader asks it for a new iterator each pass).
    """

    def __init__(self) -> None:
        self.batches: list[Sequence[int]] = []

    def __iter__(self) -> Iterator[Sequence[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class DatasetTask:
    """One split of a dataset of yours, with its loss and eval metrics (see the module docstring).

    Args:
        dataset: a map-style Dataset (this split's samples).
        loss: "cross_entropy", "mse", or a function `fn(outputs, targets)`; unused with `step`.
        step: `fn(model, batch)` returning the loss or `(loss, metrics)`; None runs
            `loss(model(input), target)`.
        collate_fn: merges a list of items into a batch; None is torch's `default_collate`.
        num_workers, pin_memory, persistent_workers, prefetch_factor: the DataLoader's.
        seed: seeds the loader's worker seeds (each pass from (seed, epoch)), so that the
            global random state, which dropout draws from, is left alone.

    Raises:
        TypeError: the dataset is not map-style.
        ValueError: an unknown loss name.
    """

    tokens_per_sample = None

    def __init__(
        self,
        dataset: Dataset,
        *,
        loss: str | Callable[..., torch.Tensor] | None = None,
        step: Callable[..., Any] | None = None,
        collate_fn: Callable[[list], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        seed: int = 0,
    ):
        check_map_style(dataset)
        if isinstance(loss, str) and loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)} or a function, got {loss!r}")
        self.dataset, self.step, self.seed = dataset, step, seed
        self.loss_fn = LOSSES[loss] if isinstance(loss, str) else loss
        self.named_loss = isinstance(loss, str)
        self.accuracy = loss == "cross_entropy" and step is None
        self.collate = collate_fn or default_collate
        self._index_batches = _IndexBatches()
        self._generator = torch.Generator()
        workers = {"prefetch_factor": prefetch_factor} if num_workers and prefetch_factor else {}
        self.loader = DataLoader(
            dataset,
            batch_sampler=self._index_batches,
            collate_fn=self.collate,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers and num_workers > 0,
            generator=self._generator,
            **workers,
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, indices: Iterable[int]) -> Any:
        """One batch, read in this process: the collated items at `indices`."""
        return self.collate([self.dataset[int(i)] for i in indices])

    def iterate(self, index_batches: Sequence[Sequence[int]], epoch: int = 0) -> Iterator[Any]:
        """The batches at each index list in turn, through the DataLoader (and its workers)."""
        self._index_batches.batches = [[int(i) for i in ix] for ix in index_batches]
        self._generator.manual_seed(derive_seed(self.seed, epoch))
        return iter(self.loader)

    def model_kwargs(self) -> dict:
        """The dataset's own `model_kwargs()` when it has one (sizes for a built-in model), else {}."""
        return dataset_model_kwargs(self.dataset)

    def _loss_and_metrics(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        if self.step is not None:
            out = self.step(model, batch)
            loss, metrics = out if isinstance(out, tuple) else (out, {})
            if not isinstance(metrics, Mapping):
                raise TypeError(
                    f"step returned ({type(loss).__name__}, {type(metrics).__name__}); "
                    "it must return the loss, or (loss, dict of metrics)"
                )
            return loss, dict(metrics)
        inputs, targets = split_parts(batch)
        out = model(inputs)
        # torch's losses take tensors: a model's output object gives its logits; a loss
        # function of yours gets what the model returned.
        outputs = logits_of(out) if self.named_loss else out
        if outputs is None:
            raise TypeError(
                f"model(input) returned {type(out).__name__}, which holds no logits for the loss: return a "
                "tensor or an object with .logits, or use loss=from_model if it computes its own loss"
            )
        metrics = {}
        if self.accuracy:
            hits = (outputs.argmax(dim=1) == targets).float()
            metrics["accuracy"] = hits.reshape(hits.size(0), -1).mean(dim=1).mean()
        return self.loss_fn(outputs, targets), metrics

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The batch's mean loss (a 0-d tensor).

        Raises:
            TypeError: the loss is not a 0-d tensor (or the batch has no input/target).
        """
        loss = self._loss_and_metrics(model, batch)[0]
        _check_scalar("the loss", loss)
        return loss

    def eval_sums(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """`count`, `loss_sum` and one `<metric>_sum` per metric (batch means times the batch size)."""
        loss, metrics = self._loss_and_metrics(model, batch)
        _check_scalar("the loss", loss)
        for name, value in metrics.items():
            _check_scalar(
                f"metric {name!r}", torch.as_tensor(value.detach() if isinstance(value, torch.Tensor) else value)
            )
        return sums_of(loss, metrics, batch_size_of(batch))


def sums_of(loss: torch.Tensor, metrics: Mapping[str, Any], count: int) -> dict[str, torch.Tensor]:
    """`count`, `loss_sum` and one `<metric>_sum` per metric (batch means times `count`), in float64."""
    sums = {
        "count": torch.full((), count, dtype=torch.float64, device=loss.device),
        "loss_sum": loss.detach().to(torch.float64) * count,
    }
    for name, value in metrics.items():
        value = torch.as_tensor(
            value.detach() if isinstance(value, torch.Tensor) else value, dtype=torch.float64, device=loss.device
        )
        sums[f"{name}_sum"] = value * count
    return sums


def _check_scalar(what: str, value: Any) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"{what} must be a 0-d tensor (a mean over the batch), got {shape}")
