"""The optimizer step overlapped with gradient communication, one bucket at a time.

`DistributedDataParallel.step_in_backward(optimizer)` hands the optimizer to
the reducer. From then on each synchronized backward also steps the
parameters: a bucket's parameters are stepped as soon as that bucket's
all-reduce is done, while later buckets are still travelling, so the step can
end with the last bucket instead of after it.

How each bucket is stepped: one shallow copy of the optimizer per bucket, its
param_groups holding only the bucket's parameters and sharing the optimizer's
`state` dict. Before each step the copy takes the optimizer's current
hyperparameters (so LR schedules and `load_state_dict` apply), and then runs
the optimizer class's own `step`, with the same kernels (fused or foreach)
the optimizer would have used. For per-parameter optimizers (SGD, Adam,
AdamW, ...) the result is the same as one `optimizer.step()` after backward.

Where the step runs: on CUDA, on a side stream that waits for the bucket's
all-reduce on the device (the host never waits), overlapping the backward
still computing on the main stream; the main stream waits for the side stream
when backward ends. On CPU the host waits for each bucket's all-reduce in
turn and steps it while the later buckets are still being reduced by gloo's
threads.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch.optim.adam import adam

from clorch.nn.parallel.buckets import Bucket, wait_for_reduction

_NEEDS_WHOLE_MODEL = ("LBFGS",)  # optimizers whose step looks at every parameter at once


def _refuse_step(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
    raise ValueError(
        f"{type(optimizer).__name__}.step() was called, but this optimizer already steps inside "
        "backward (DistributedDataParallel.step_in_backward): each synchronized backward updates "
        "the parameters; call only optimizer.zero_grad() (or the strategy's optimizer_step()) after it"
    )


class BucketStepper:
    """Steps the parameters of each bucket of a reducer with one optimizer.

    Args:
        optimizer: a per-parameter torch optimizer holding exactly the
            reducer's parameters.
        buckets: the reducer's buckets.
        params: the reducer's parameters (indices in buckets refer to them).

    Raises:
        TypeError: optimizer is not a torch.optim.Optimizer.
        ValueError: an optimizer that needs every parameter at once (LBFGS),
            or parameters that differ from the model's trainable ones.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, buckets: Sequence[Bucket], params: Sequence[torch.Tensor]):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"step_in_backward() takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        name = type(optimizer).__name__
        if name in _NEEDS_WHOLE_MODEL:
            raise ValueError(
                f"step_in_backward() needs an optimizer that steps each parameter on its "
                f"own (SGD, Adam, AdamW, ...), got {name}"
            )
        _check_covers(optimizer, params)
        self.optimizer = optimizer
        self._group_of = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
        self._parts = [self._part(bucket, params) for bucket in buckets]
        device = params[0].device if params else torch.device("cpu")
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._guard = optimizer.register_step_pre_hook(_refuse_step)

    def _part(self, bucket: Bucket, params: Sequence[torch.Tensor]) -> tuple[torch.optim.Optimizer, list[int]]:
        """A copy of the optimizer over the bucket's parameters, and the groups they come from."""
        members: dict[int, list[torch.Tensor]] = {}
        for index in bucket.param_indices:
            param = params[index]
            members.setdefault(self._group_of[id(param)], []).append(param)
        part = copy.copy(self.optimizer)  # shares `state`, with hook registries of its own (empty)
        for name, value in vars(self.optimizer).items():  # the optimizer's own attributes
            if name not in vars(part) and name != "step":  # not an LR scheduler's wrapped step
                setattr(part, name, value)
        groups = sorted(members)
        part.param_groups = [dict(self.optimizer.param_groups[g], params=members[g]) for g in groups]
        return part, groups

    def step(self, bucket: Bucket, work: object) -> None:
        """Step `bucket`'s parameters once its all-reduce `work` (None: nothing in flight) is done.

        Local (no collective). On CUDA it returns at once: the side stream waits
        for the reduction and the gradients' producers. On CPU it blocks until
        `work` is done.
        """
        if self.stream is None:
            self._step_now(bucket, work)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            self._step_now(bucket, work)

    def _step_now(self, bucket: Bucket, work: object) -> None:
        if work is not None:
            wait_for_reduction(work, bucket)
        if bucket.converts:
            bucket.flat.copy_(bucket.comm)
        main = self.optimizer
        with torch.no_grad():
            if not self._adam_step(bucket.index):
                self._class_step(bucket.index)
        main._opt_called = True  # what an LR scheduler checks to know the optimizer stepped

    def _class_step(self, index: int) -> None:
        """The optimizer class's own step on the bucket's copy, with the optimizer's current settings."""
        part, groups = self._parts[index]
        main = self.optimizer
        part.state = main.state  # load_state_dict() replaces the optimizer's state dict
        for group, g in zip(part.param_groups, groups):
            for key, value in main.param_groups[g].items():
                if key != "params":
                    group[key] = value
        type(main).step(part)

    def _adam_step(self, index: int) -> bool:
        """Adam/AdamW once their state exists: torch's functional `adam` on the bucket's tensor lists.

        The same call `Adam.step` makes after gathering its lists, without the
        checks and bookkeeping of its per-parameter gathering (which, per
        bucket, costs the host more than the step). The lists are read from
        the optimizer's state at every step, so a cleared, reloaded or replaced
        state is followed. Returns False where this does not apply (other
        optimizers, the first step, complex or differentiable settings, an
        older torch).
        """
        main = self.optimizer
        if type(main) not in (torch.optim.Adam, torch.optim.AdamW):
            return False
        lists = self._adam_lists(index)
        if lists is None:
            return False

        for g, params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps in lists:
            group = main.param_groups[g]
            beta1, beta2 = group["betas"]
            adam(
                params,
                [p.grad for p in params],
                exp_avgs,
                exp_avg_sqs,
                max_exp_avg_sqs,
                steps,
                amsgrad=group["amsgrad"],
                has_complex=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                foreach=group["foreach"],
                capturable=group["capturable"],
                differentiable=False,
                fused=group["fused"],
                grad_scale=None,
                found_inf=None,
                decoupled_weight_decay=group["decoupled_weight_decay"],
            )
        return True

    def _adam_lists(self, index: int) -> list[tuple] | None:
        """Per param group of the bucket: (group index, params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps)."""
        part, groups = self._parts[index]
        main = self.optimizer
        lists = []
        for group, g in zip(part.param_groups, groups):
            settings = main.param_groups[g]
            if "decoupled_weight_decay" not in settings or settings.get("differentiable"):
                return None
            params = group["params"]
            states = [main.state.get(p) for p in params]
            if not all(state and "step" in state for state in states) or any(p.is_complex() for p in params):
                return None
            lists.append(
                (
                    g,
                    params,
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [s["max_exp_avg_sq"] for s in states] if settings["amsgrad"] else [],
                    [s["step"] for s in states],
                )
            )
        return lists

    def join(self) -> None:
        """Make the current stream wait for every step queued on the side stream (no host wait)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)

    def remove(self) -> None:
        """Let the optimizer step by itself again."""
        self.join()
        self._guard.remove()


def _check_covers(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
    # Frozen parameters may be in the optimizer (it skips them, having no gradient); they are not stepped here.
    held = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    theirs, ours = {id(p) for p in held}, {id(p) for p in params}
    if theirs != ours:
        raise ValueError(
            "step_in_backward(): the optimizer must hold exactly the model's trainable parameters "
            f"(the model has {len(ours)}, the optimizer {len(theirs)}, {len(theirs - ours)} of them "
            f"not the model's, {len(ours - theirs)} of the model's missing); build it from "
            "model.parameters()"
        )
