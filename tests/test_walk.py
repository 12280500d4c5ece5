"""scripts/walk/count.py on real runs: the walks of `ddp.bucket_cap_mb` (from the command line to the
reducer's buckets) and of `precision=fp16` (to the loss scaler's update), and a guard that neither grows
past what it measures today."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Measured on this tree (docs/development.md, "One setting's walk"); lower them as the walks shorten.
# (override, the value followed, where it is used, most hand-offs, most files)
# Raised by one hand-off and one file each (20/12, 23/13 before) when the parallel modes became
# strategy classes: a mode's settings and the precision object reach its class when it is made
# (`from_config`), and the class uses them (`setup` wraps the model; `optimizer_step` calls the
# precision object's, as Fabric's Strategy does); clorch/strategies/ddp.py is the new file.
# Raised by one file each (13, 14 before), hand-offs unchanged, when the plan file's writer and
# reader moved out of plan/plan.py into plan/plan_file.py: the walk passes through both modules.
WALKS = [
    ("ddp.bucket_cap_mb=1.37", "1.37", "nn/parallel/buckets.py:plan_buckets", 21, 14),
    ("precision=fp16", "fp16", "amp/scaler.py:update", 24, 15),
]


def _count_module():
    spec = importlib.util.spec_from_file_location("walk_count", ROOT / "scripts" / "walk" / "count.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["walk_count"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(240)
@pytest.mark.parametrize("override, mark, end, most_handoffs, most_files", WALKS, ids=[w[0] for w in WALKS])
def test_a_setting_walks_from_the_command_line_through_the_plan_file_to_its_use(
    tmp_path, override, mark, end, most_handoffs, most_files
):
    count = _count_module()
    (launching, first), (rank, then) = count.run(override, mark, end, tmp_path)
    names = [c.name for c in first], [c.name for c in then]
    assert (launching, rank) == ("launching process", "rank")
    assert names[0][0] == "config/composer.py:rewrite_recipe_overrides" and "cli/train.py:_check_and_run" in names[0]
    assert "plan/plan_file.py:write_plan" in names[0]
    # What built part of what is handed on is on the walk, however deep inside it the part is.
    assert "config/schema.py:section_from_dict" in names[0]
    assert "plan/plan_file.py:read_plan" in names[1] and names[1][-1] == end
    # A check that reads the value and hands nothing on is not part of the walk.
    assert "cli/hydra_keys.py:hydra_key_errors" not in names[0]
    # The launcher itself never carries the config: the ranks read it from the plan file.
    assert not [n for n in names[0] + names[1] if n.startswith("launch/")]
    files = {n.partition(":")[0] for n in names[0] + names[1]}
    assert len(names[0]) + len(names[1]) <= most_handoffs and len(files) <= most_files, (names, files)
