"""A sharded checkpoint runs no code and never loads unverified: a crafted `.metadata` or byte item
(digests re-signed, as anyone can), a flipped byte, a truncated, swapped, missing or unrecorded file
is refused with a CheckpointError naming the file, before anything changes; resume=latest falls back
to the newest checkpoint that verifies and says what it skipped."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from clorch.checkpoint.errors import CheckpointError
from clorch.checkpoint.sharded import (
    MARKER,
    find_latest_sharded,
    load_sharded,
    save_sharded,
    sharded_step_path,
    verify_sharded,
)
from clorch.checkpoint.sharded_files import file_entry
from clorch.checkpoint.sharded_marker import encode_marker

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized"),
]


class Evil:
    """Unpickling this creates `marker`: the classic code-on-load payload."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _parts(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    return model, optimizer


def _params(model):
    return [t.detach().clone() for t in model.state_dict().values()]


def _unchanged(model, before) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> Path:
    """step_1 and step_2 of one run, never changed: each test copies them."""
    directory = tmp_path_factory.mktemp("sharded_steps")
    model, optimizer = _parts()
    save_sharded(sharded_step_path(directory, 1), model=model, optimizer=optimizer, state={"step": 1})
    optimizer.step()
    save_sharded(sharded_step_path(directory, 2), model=model, optimizer=optimizer, state={"step": 2})
    return directory


@pytest.fixture
def run(steps, tmp_path) -> Path:
    shutil.copytree(steps, tmp_path / "checkpoints")
    return tmp_path / "checkpoints"


def _resign(path: Path) -> None:
    """Recompute clorch.json's digests and checksum for the files now there, as an attacker could."""
    body = json.loads((path / MARKER).read_text())
    body.pop("checksum")
    body["files"] = {p.name: file_entry(p) for p in sorted(path.iterdir()) if p.name != MARKER}
    (path / MARKER).write_bytes(encode_marker(body))


def _refused(path: Path, match: str, tmp_path: Path) -> None:
    """load_sharded and verify_sharded refuse `path`, changing nothing; latest falls back to step 1."""
    victim, optimizer = _parts(seed=1)
    before = _params(victim)
    with pytest.raises(CheckpointError, match=match):
        load_sharded(path, model=victim, optimizer=optimizer)
    assert _unchanged(victim, before)
    with pytest.raises(CheckpointError, match=match):
        verify_sharded(path)
    latest = find_latest_sharded(path.parent)
    assert latest.path == sharded_step_path(path.parent, 1)
    [(skipped, reason)] = latest.skipped
    assert skipped == path and reason


def test_an_untouched_checkpoint_loads_every_tensor_and_value(run):
    model, optimizer = _parts(seed=1)
    assert load_sharded(sharded_step_path(run, 2), model=model, optimizer=optimizer) == {"step": 2}
    assert set(verify_sharded(sharded_step_path(run, 2))["files"]) == {".metadata", "__0_0.distcp"}
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    assert find_latest_sharded(run).path == sharded_step_path(run, 2)


def test_a_crafted_metadata_runs_nothing_under_torch_it_would(run, tmp_path):
    path, marker = sharded_step_path(run, 2), tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(Evil(str(marker))))
    _resign(path)
    _refused(path, r"refusing to load DCP metadata .*\.metadata: .*open is not one of DCP's metadata", tmp_path)
    assert not marker.exists()
    model, _ = _parts()  # the payload is live: torch's own reader runs it
    with pytest.raises(BaseException):
        dcp.load({"model": model.state_dict()}, checkpoint_id=path, no_dist=True)
    assert marker.exists()


def test_a_crafted_byte_item_runs_nothing(run, tmp_path):
    path, marker = sharded_step_path(run, 2), tmp_path / "pwned"
    model, optimizer = _parts()
    model_state, optim_state = get_state_dict(model, [optimizer])
    optim_state["param_groups"][0]["lr"] = Evil(str(marker))
    for old in path.iterdir():
        if old.name != MARKER:
            old.unlink()
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path, no_dist=True)
    _resign(path)
    _refused(path, r"refusing to load item 'optim.param_groups.0.lr' of .*__0_0\.distcp", tmp_path)
    assert not marker.exists()


def _flip(name: str, at: int):
    def change(path: Path) -> None:
        data = bytearray((path / name).read_bytes())
        data[at if at >= 0 else len(data) + at] ^= 0xFF
        (path / name).write_bytes(bytes(data))

    return change


def _truncate(path: Path) -> None:
    data = (path / "__0_0.distcp").read_bytes()
    (path / "__0_0.distcp").write_bytes(data[: len(data) // 2])


def _swap(path: Path) -> None:
    shutil.copyfile(path.parent / "step_00000001.dcp" / "__0_0.distcp", path / "__0_0.distcp")


DAMAGE = {
    "a flipped byte in a weight": (_flip("__0_0.distcp", -200), r"__0_0\.distcp is corrupt"),
    "a flipped byte in .metadata": (_flip(".metadata", 40), r"\.metadata is corrupt"),
    "a truncated shard": (_truncate, r"__0_0\.distcp is truncated"),
    "a shard of another step": (_swap, r"__0_0\.distcp is corrupt"),
    "a missing shard": (
        lambda p: (p / "__0_0.distcp").unlink(),
        r"__0_0\.distcp recorded in its clorch.json is missing",
    ),
    "an unrecorded file": (lambda p: (p / "__1_0.distcp").write_bytes(b"x"), r"does not record: .*__1_0\.distcp"),
    "no clorch.json": (lambda p: (p / MARKER).unlink(), "incomplete: it has no clorch.json"),
    "an edited clorch.json": (
        lambda p: (p / MARKER).write_text((p / MARKER).read_text().replace('"step": 2', '"step": 9')),
        "clorch.json is corrupt",
    ),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damage_is_refused_naming_the_file(run, tmp_path, case):
    change, match = DAMAGE[case]
    path = sharded_step_path(run, 2)
    change(path)
    _refused(path, match, tmp_path)


def test_a_checkpoint_without_digests_is_refused(run, tmp_path):
    path = sharded_step_path(run, 2)
    body = json.loads((path / MARKER).read_text())
    body.pop("checksum")
    for files in (None, {}, {".metadata": None}):
        (path / MARKER).write_bytes(encode_marker({**body, "files": files}))
        _refused(path, "records no digests|field \"files\\['.metadata'\\]\"|files", tmp_path)
    (path / MARKER).write_text(json.dumps({**body, "format": 1}))  # an older clorch's
    _refused(path, "records no digests of DCP's files .*format 1", tmp_path)


# Values of the right type that load (or that the fit check refuses, naming the model's parameters).
LOADABLE = {"sampler": (None, {}), "state": ({},), "rank_buffers": ([],), "signature": ({},), "has_optimizer": (True,)}


def test_every_marker_field_with_an_odd_type_is_refused(run):
    path = sharded_step_path(run, 2)
    body = json.loads((path / MARKER).read_text())
    body.pop("checksum")
    accepted = []
    for field in ("world_size", "state", "has_optimizer", "signature", "sampler", "rng", "rank_buffers", "files"):
        for value in (None, "x", -1, 1.5, [], {}, [1, "a"], True):
            if any(value == ok and type(value) is type(ok) for ok in LOADABLE.get(field, ())):
                continue
            (path / MARKER).write_bytes(encode_marker({**body, field: value}))
            try:
                verify_sharded(path)
                accepted.append(f"{field}={value!r}")
            except CheckpointError as exc:
                assert "clorch.json" in str(exc)
    assert accepted == []


def test_resume_latest_skips_what_does_not_verify_and_says_so(run, tmp_path, capsys):
    from clorch.config.options.checkpoint import CheckpointConfig
    from clorch.config.options.parallel import FSDPParallelConfig
    from clorch.config.schema import TrainConfig
    from clorch.train import checkpoints

    _truncate(sharded_step_path(run, 2))
    bare = run / "step_00000003.dcp"  # DCP's files alone: not a checkpoint clorch can resume
    shutil.copytree(sharded_step_path(run, 1), bare)
    (bare / MARKER).unlink()
    cfg = TrainConfig(parallel=FSDPParallelConfig(), checkpoint=CheckpointConfig(dir=str(run), resume="latest"))
    assert checkpoints.resume_path(cfg, tmp_path) == sharded_step_path(run, 1)
    out = capsys.readouterr().out
    assert f"skipped {bare}" in out and "incomplete: it has no clorch.json" in out
    assert f"skipped {sharded_step_path(run, 2)}" in out and "truncated" in out
    assert f"resuming from {sharded_step_path(run, 1)}" in out
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["skipped_checkpoint"] for e in events] == [str(bare), str(sharded_step_path(run, 2))]
    assert all(e["reason"] for e in events)
