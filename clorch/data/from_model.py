"""Models that compute their own loss (`loss=from_model`), and a step over the built-in data.

nanoGPT's `GPT.forward(idx, targets)` returns `(logits, loss)`; a Hugging Face model called
with `labels=` returns a `ModelOutput` whose `.loss` is the loss. `FromModelStep` is the step
(`fn(model, batch)`) that calls the model so and finds that loss, so the training loop runs it
like any step of your own. A dict batch in Hugging Face's convention (`input_ids`,
`attention_mask`, `labels`, ...: no "input" and "target" keys) is passed whole, as
`model(**batch)`, its labels inside it. With `accuracy` the step also reports the share of
labels that the output's logits rank first (`accuracy_of`).

`SteppedTask` puts a step (`step._target_`, or `FromModelStep`) on a built-in task
(`data=tokens`, `text`, ...): the task's batches and sizes, the step's loss.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import nn

from clorch.data.user import batch_size_of, logits_of, split_parts, sums_of

LABELS = ("target", "input")
IGNORE_INDEX = -100  # the label of a position that no loss or accuracy counts (torch's and Hugging Face's)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0


def model_loss(out: Any) -> torch.Tensor:
    """The loss in what a model returned: itself (a 0-d tensor), the one 0-d tensor of a tuple
    (nanoGPT's `(logits, loss)`), or its `.loss` / `["loss"]` (Hugging Face's ModelOutput).

    Raises:
        TypeError: none of those, naming what the model returned.
    """
    if _is_scalar(out):
        return out
    if isinstance(out, Mapping) and _is_scalar(out.get("loss")):
        return out["loss"]
    if _is_scalar(getattr(out, "loss", None)):
        return out.loss
    if isinstance(out, (tuple, list)):
        scalars = [v for v in out if _is_scalar(v)]
        if len(scalars) == 1:
            return scalars[0]
        if len(scalars) > 1:
            raise TypeError(
                f"loss=from_model: the model returned a {type(out).__name__} with "
                f"{len(scalars)} 0-d tensors; it must hold exactly one (the loss), or name "
                "a step of your own with step._target_"
            )
    raise TypeError(
        f"loss=from_model: the model returned {_shape(out)}, which holds no loss: return the "
        "loss as a 0-d tensor, a tuple with one 0-d tensor (nanoGPT's (logits, loss)), or an "
        "object with .loss (Hugging Face's ModelOutput; is loss.target_arg=labels set?)"
    )


def _shape(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of ({', '.join(_shape(v) for v in out)})"
    if isinstance(out, Mapping):
        return f"a {type(out).__name__} with keys {sorted(map(str, out))}"
    return f"a {type(out).__name__}"


def is_keyword_batch(batch: Any) -> bool:
    """Whether a batch is passed whole as `model(**batch)`: a dict without clorch's "input" and
    "target" keys (Hugging Face's `input_ids`, `attention_mask`, `labels`, ...)."""
    return isinstance(batch, Mapping) and not ("input" in batch and "target" in batch)


@torch.no_grad()
def accuracy_of(out: Any, labels: torch.Tensor, shifted: bool = False) -> torch.Tensor:
    """The share of `labels` that the logits in `out` (`logits_of`) rank first, over the last
    dimension (classes or vocabulary), positions labelled IGNORE_INDEX left out (0-d tensor).

    `shifted`: the logits at position t predict the label at t + 1, as in a causal LM that is
    given its input as labels (Hugging Face's shift).

    Raises:
        TypeError: the model returned no logits, or logits that do not fit the labels.
    """
    logits = logits_of(out)
    if logits is None:
        raise TypeError(
            f"loss.accuracy=true needs the model's logits, but it returned {_shape(out)}: return "
            "them as .logits (Hugging Face's ModelOutput) or beside the loss (logits, loss)"
        )
    if shifted:
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    if logits.shape[:-1] != labels.shape:
        raise TypeError(
            f"loss.accuracy=true compares the logits' argmax over their last dimension with the labels: "
            f"logits of shape {tuple(logits.shape)} do not fit labels of shape {tuple(labels.shape)}"
        )
    counted = labels != IGNORE_INDEX
    hits = (logits.argmax(dim=-1) == labels) & counted
    return hits.sum().float() / counted.sum().clamp(min=1).float()


class FromModelStep:
    """`step(model, batch)`: the model's own loss for a batch's input and target, or for a dict
    batch passed whole (`model(**batch)`, `is_keyword_batch`), its labels inside it.

    Args:
        target_arg: the keyword the target is passed as (`labels` for Hugging Face); None
            passes it as the second positional argument (nanoGPT's `targets`).
        labels: "target" passes the batch's target; "input" passes the input itself, for
            models that shift it internally (Hugging Face's causal LMs).
        accuracy: also return `{"accuracy": ...}` (`accuracy_of`: the logits' argmax against the
            labels passed; a dict batch's own are its "labels").

    Raises:
        ValueError: `labels` is neither "target" nor "input".
    """

    def __init__(self, target_arg: str | None = None, labels: str = "target", accuracy: bool = False):
        if labels not in LABELS:
            raise ValueError(f"loss.labels must be one of {', '.join(LABELS)}, got {labels!r}")
        self.target_arg, self.labels, self.accuracy = target_arg, labels, accuracy

    def __call__(self, model: nn.Module, batch: Any) -> Any:
        if is_keyword_batch(batch):
            out, labels, shifted = model(**batch), batch.get("labels"), False
        else:
            inputs, targets = split_parts(batch)
            labels, shifted = (inputs, True) if self.labels == "input" else (targets, False)
            out = model(inputs, **{self.target_arg: labels}) if self.target_arg else model(inputs, labels)
        loss = model_loss(out)
        if not self.accuracy:
            return loss
        if not isinstance(labels, torch.Tensor):
            raise TypeError(
                f"loss.accuracy=true needs the labels: a dict batch passed as model(**batch) must hold "
                f"them under 'labels', got keys {sorted(map(str, batch))}"
            )
        return loss, {"accuracy": accuracy_of(out, labels, shifted)}

    def __repr__(self) -> str:
        return f"FromModelStep(target_arg={self.target_arg!r}, labels={self.labels!r}, accuracy={self.accuracy!r})"


def _check_scalar(loss: Any) -> None:
    if not _is_scalar(loss):
        raise TypeError(f"the loss must be a 0-d tensor (a mean over the batch), got {_shape(loss)}")


class SteppedTask:
    """A built-in task whose loss a step computes: `step(model, batch)` returning the loss, or
    `(loss, {metric: batch mean})`. Everything else (batches, sizes, placement) is the task's."""

    def __init__(self, task: Any, step: Callable[..., Any]):
        self.inner, self.step = task, step

    def __getattr__(self, name: str) -> Any:  # batch, model_kwargs, tokens_per_sample, iterate, ...
        if name == "inner":  # not set yet (copy, pickle): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def _loss_and_metrics(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        out = self.step(model, batch)
        loss, metrics = out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping) else (out, {})
        _check_scalar(loss)
        return loss, dict(metrics)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The step's loss for the batch (a 0-d tensor)."""
        return self._loss_and_metrics(model, batch)[0]

    def eval_sums(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """`count`, `loss_sum` and a `<metric>_sum` per metric (batch means times the batch size)."""
        loss, metrics = self._loss_and_metrics(model, batch)
        return sums_of(loss, metrics, batch_size_of(batch))
