"""A directory named as a sharded step checkpoint (step_N.dcp) without clorch.json is refused before
training, naming it: `checkpoint.resume=latest` would skip it, and the run would fail at its own
save of that step (save_sharded refuses to replace what is not a clorch sharded checkpoint)."""

from __future__ import annotations

import pytest

from clorch.config.checks import ConfigError
from clorch.plan.plan import plan_overrides

pytestmark = pytest.mark.timeout(120)

FSDP = ["+recipe=cpu_smoke", "parallel=fsdp", "checkpoint=periodic", "checkpoint.every_n_steps=2"]


def _errors(*overrides: str) -> list[str]:
    try:
        plan_overrides([*FSDP, *overrides])
    except ConfigError as exc:
        return exc.errors
    return []


def test_a_dcp_directory_without_clorch_json_is_refused_naming_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    foreign = ckpt / "step_00000002.dcp"
    foreign.mkdir(parents=True)
    (foreign / ".metadata").write_bytes(b"not clorch's")
    (error,) = _errors(f"checkpoint.dir={ckpt}", "checkpoint.resume=latest")
    assert error.startswith(f"checkpoint.dir={ckpt}: {foreign} is named as a sharded step checkpoint"), error
    assert "holds no clorch.json" in error and "checkpoint.resume=latest would skip it" in error
    assert f"move it out of {ckpt} (or delete it)" in error
    # A run that writes step checkpoints there fails at that save too, resume or not.
    (error,) = _errors(f"checkpoint.dir={ckpt}", "checkpoint.resume=none")
    assert "this run's save of that step would refuse to replace it" in error
    assert "latest" not in error


def test_a_committed_checkpoint_and_a_ddp_run_are_not_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_00000002.dcp").mkdir(parents=True)
    # parallel=ddp writes step_N.ckpt files: a .dcp directory is not its business
    assert not any("step_00000002.dcp" in e for e in _errors(f"checkpoint.dir={ckpt}", "parallel=ddp"))
    # nothing there but clorch's temporary directories of an interrupted save
    (ckpt / "step_00000002.dcp").rmdir()
    (ckpt / ".step_00000002.dcp.abc.tmp").mkdir()
    assert _errors(f"checkpoint.dir={ckpt}", "checkpoint.resume=latest") == []
