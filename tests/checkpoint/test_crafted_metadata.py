"""A checkpoint whose metadata was crafted with odd field types (and a recomputed checksum)
is refused with a CheckpointError naming the field, never a crash."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from clorch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, verify_checkpoint
from clorch.checkpoint.metadata import encode
from clorch.data import DistributedSampler

# Documented errors for a well-formed state that does not fit the sampler given (None where the
# checkpoint holds no sampler state, shuffle=true for a sampler without shuffling).
FIT_ERRORS = ("holds no sampler state", "saved by a different sampler")
ODD = [None, "x", -1, 1.5, [], {}, [1, "a"], {"a": 1}, True, float("nan")]


def _fields(node, prefix=()):
    """Every path into the metadata body (the first entry of each list of dicts)."""
    for key, value in node.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _fields(value, (*prefix, key))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            yield (*prefix, key, 0)
            yield from _fields(value[0], (*prefix, key, 0))


def _parts():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    return model, optimizer, DistributedSampler(10, num_replicas=1, rank=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("crafted")
    torch.manual_seed(0)
    model, optimizer, sampler = _parts()
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    save_checkpoint(
        directory / "good.ckpt", model=model, optimizer=optimizer, sampler=sampler, state={"step": 3, "epoch": 0}
    )
    body = json.loads((directory / "good.ckpt").read_text())
    body.pop("checksum")
    return directory, body


def test_every_field_with_an_odd_type_is_refused_or_harmless(saved):
    directory, body = saved
    crashes = []
    for field in _fields(body):
        for value in ODD:
            crafted = copy.deepcopy(body)
            node = crafted
            for key in field[:-1]:
                node = node[key]
            node[field[-1]] = value
            path = directory / "crafted.ckpt"
            path.write_bytes(encode(crafted))  # a valid checksum is easy to recompute
            for check in (
                lambda: verify_checkpoint(path),
                lambda: load_checkpoint(path, model=_parts()[0], optimizer=_parts()[1], sampler=_parts()[2]),
            ):
                try:
                    check()
                except CheckpointError:
                    pass
                except Exception as exc:  # noqa: BLE001 - what the test looks for
                    if field[:1] == ("state",):
                        continue  # the user's own state: returned as saved
                    if isinstance(exc, ValueError) and any(m in str(exc) for m in FIT_ERRORS):
                        continue  # a value of the right type that does not fit this sampler
                    crashes.append(f"{'.'.join(map(str, field))}={value!r}: {type(exc).__name__}: {exc}")
    assert crashes == []


def test_the_engine_refuses_a_crafted_training_state(tmp_path):
    from clorch.train.checkpoints import _check_training_state

    good = {
        "step": 3,
        "epoch": 0,
        "window_loss": [0.5, 0.25],
        "window_steps": 2,
        "window_samples": 64,
        "scheduler": {"last_epoch": 3},
        "run_dir": None,
    }
    _check_training_state(tmp_path, good, 2)
    for key, value in [
        ("step", "3"),
        ("step", -1),
        ("epoch", None),
        ("window_loss", [0.5]),
        ("window_loss", ["a", "b"]),
        ("window_steps", 1.5),
        ("scheduler", "x"),
        ("run_dir", 7),
    ]:
        with pytest.raises(CheckpointError, match=f"state field '{key}'"):
            _check_training_state(tmp_path, {**good, key: value}, 2)


def test_a_crafted_run_record_does_not_crash_the_resume_check(tmp_path, monkeypatch):
    from clorch.config import compose
    from clorch.plan.plan import resolve_errors

    monkeypatch.delenv("CLORCH_RESTART_COUNT", raising=False)
    model, optimizer, sampler = _parts()
    for record in ("x", {"model": "x", "data": [1], "batch_size": {}}, [1, 2]):
        path = tmp_path / "run.ckpt"
        save_checkpoint(path, model=model, optimizer=optimizer, state={"step": 1, "epoch": 0, "run": record})
        errors = resolve_errors(compose(["+recipe=cpu_smoke", "checkpoint=final", f"checkpoint.resume={path}"]))
        assert all(isinstance(e, str) for e in errors)
