"""Step checkpoints by name, as the launching process lists them before any rank starts."""

from __future__ import annotations

import pytest

from clorch._checkpoint_names import any_step_checkpoints, step_checkpoints

pytestmark = pytest.mark.timeout(30)


def test_sharded_step_checkpoints_count_once_committed(tmp_path):
    (tmp_path / "step_00000002.ckpt").write_bytes(b"")
    committed = tmp_path / "step_00000004.dcp"
    committed.mkdir()
    (committed / "clorch.json").write_text("{}")
    (tmp_path / "step_00000006.dcp").mkdir()  # interrupted: no clorch.json yet
    (tmp_path / "notes.txt").write_text("")
    assert [s for s, _ in step_checkpoints(tmp_path)] == [2]
    assert [(s, p.name) for s, p in any_step_checkpoints(tmp_path)] == [
        (4, "step_00000004.dcp"),
        (2, "step_00000002.ckpt"),
    ]
    assert any_step_checkpoints(tmp_path / "missing") == []
