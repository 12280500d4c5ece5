"""The launch plan's checks of your own data and of weights to start from, run before launch.

A dataset of yours is tried as the ranks will use it: its first items are
collated into a batch and one forward and loss run on the CPU, in the launching
process, with the model the config names. A `model.init_from` file is read and
its keys and shapes compared with the model built on the meta device. Each
check returns error messages naming the key, so that the plan reports them
with every other error.
"""

from __future__ import annotations

import traceback

from clorch.config.data_spec import is_user_data, model_sizes_of, user_tasks
from clorch.config.model_spec import build_model_for
from clorch.config.schema import TrainConfig

TRIAL_ITEMS = 2  # items collated for the trial batch (two, so that stacking is exercised)


def _where(exc: BaseException) -> str:
    """`Type: message (file:line in function)` of the innermost frame, for a one-line error."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{place}"


def user_data_errors(cfg: TrainConfig) -> list[str]:
    """A dataset of yours whose first items do not collate, or whose batch does not fit the model
    and loss (one forward on the CPU). Empty for the built-in data."""
    if not is_user_data(cfg):
        return []
    import torch  # lazy: the config package is imported by clorch-train --help

    data = cfg.data
    train, _ = user_tasks(cfg, "cpu")
    if len(train) == 0:
        return [f"data._target_={data.target}: the training split is empty"]
    indices = list(range(min(TRIAL_ITEMS, len(train))))
    try:
        batch = train.batch(indices)
    except Exception as exc:  # the user's __getitem__ or collate_fn
        how = f"data.collate_fn._target_={data.collate_fn['_target_']}" if data.collate_fn else "default_collate"
        return [f"data._target_={data.target}: items {indices} do not make a batch with {how}: {_where(exc)}"]
    try:
        model = build_model_for(cfg, train.model_kwargs())
    except Exception as exc:
        return [f"model={cfg.model.name}: cannot be built for data._target_={data.target}: {_where(exc)} "
                "(a built-in model takes its sizes from the dataset's model_kwargs(); or name your "
                "model with model._target_)"]
    try:
        with torch.no_grad():
            train.loss(model, batch)
    except Exception as exc:
        what = f"step._target_={cfg.step.target}" if hasattr(cfg.step, "target") else "model(input) and the loss"
        return [f"data._target_={data.target}: a batch of items {indices} does not fit {what} "
                f"(tried on the CPU before launch): {_where(exc)}"]
    return []


def init_from_errors(cfg: TrainConfig) -> list[str]:
    """A `model.init_from` file that is missing, unreadable, or does not fit the model."""
    path = getattr(cfg.model, "init_from", None)
    if path is None:
        return []
    import torch  # lazy: the config package is imported by clorch-train --help

    from clorch.checkpoint.weights import fit_errors, read_weights  # lazy: imports torch

    try:
        weights = read_weights(path)
    except (OSError, ValueError, TypeError) as exc:
        return [f"model.init_from={path!r}: {exc}"]
    try:
        sizes = model_sizes_of(cfg)  # on the host: a task may draw samples
        with torch.device("meta"):
            model = build_model_for(cfg, sizes)
    except Exception:  # reported by the data and model checks; nothing to compare against
        return []
    return fit_errors(model, weights, strict=cfg.model.init_strict, key=f"model.init_from={path}")
