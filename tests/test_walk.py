"""scripts/walk/count.py on a real run: the walk of `ddp.bucket_cap_mb` from the command line to
the reducer's buckets, and a guard that it does not grow past what it measures today."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Measured on this tree (docs/development.md, "One setting's walk"); lower them as the walk shortens.
MOST_HANDOFFS, MOST_FILES = 31, 17


def _count_module():
    spec = importlib.util.spec_from_file_location("walk_count", ROOT / "scripts" / "walk" / "count.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["walk_count"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(240)
def test_the_bucket_size_walks_from_the_command_line_through_the_plan_file_to_the_buckets(tmp_path):
    count = _count_module()
    (launching, first), (rank, then) = count.run(
        "ddp.bucket_cap_mb=1.37", "1.37", "nn/parallel/buckets.py:plan_buckets", tmp_path
    )
    names = [c.name for c in first], [c.name for c in then]
    assert (launching, rank) == ("launching process", "rank")
    assert names[0][0].startswith("cli/") and "plan/plan.py:write_plan" in names[0]
    assert "plan/plan.py:read_plan" in names[1] and names[1][-1] == "nn/parallel/buckets.py:plan_buckets"
    # A check that reads the value and hands nothing on is not part of the walk.
    assert "cli/hydra_keys.py:hydra_key_errors" not in names[0]
    # The launcher itself never carries the config: the ranks read it from the plan file.
    assert not [n for n in names[0] + names[1] if n.startswith("launch/")]
    files = {n.partition(":")[0] for n in names[0] + names[1]}
    assert len(names[0]) + len(names[1]) <= MOST_HANDOFFS and len(files) <= MOST_FILES, (names, files)
