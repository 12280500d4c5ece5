"""The front door: one check per run in every entry mode; ranks receive the plan, unchecked."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from clorch.config import compose
from clorch.plan.plan import Plan, for_world_size, resolve
from clorch.plan.plan_file import PLAN_HEADER, read_plan, write_plan

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]

# Counts the door's config checks in the launching process while it runs each command in turn
# (clorch-train's train_main, or run_local), one interpreter for all of them.
_COUNTING = textwrap.dedent("""
    import json, os, sys
    import clorch.plan.plan as door
    calls = []
    original = door.checked_partial
    def counted(values, **kwargs):
        calls.append(1)
        return original(values, **kwargs)
    door.checked_partial = counted
    for mode, args, where in json.loads(sys.argv[1]):
        os.makedirs(where, exist_ok=True)
        os.chdir(where)
        calls.clear()
        if mode == "cli":
            from clorch.cli import train_main
            code = train_main(args)
        else:
            import clorch
            clorch.run_local(recipe="cpu_smoke", max_steps=2, progress="off")
            code = 0
        print("CHECKS", where, len(calls), code, flush=True)
""")


def _count(tmp_path: Path, commands: dict[str, tuple[str, list[str]]]) -> dict[str, tuple[int, int]]:
    """{name: (checks, exit status)} for each command, run in tmp_path/name."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    plan = [(mode, args, str(tmp_path / name)) for name, (mode, args) in commands.items()]
    done = subprocess.run(
        [sys.executable, "-c", _COUNTING, json.dumps(plan)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("CHECKS"):
            _, where, checks, code = line.split()
            found[Path(where).name] = (int(checks), int(code))
    assert set(found) == set(commands), done.stdout + done.stderr
    return found


def test_every_entry_mode_checks_the_config_once(tmp_path):
    counted = _count(
        tmp_path,
        {
            "single": ("cli", ["+recipe=cpu_smoke", "max_steps=2"]),
            "sweep": ("cli", ["-m", "+recipe=cpu_smoke", "max_steps=2", "seed=1,2"]),
            "torchrun": (
                "cli",
                ["+recipe=cpu_smoke", "max_steps=2", "launcher=torchrun", "launcher.rdzv_endpoint=127.0.0.1:0"],
            ),
            "run_local": ("run_local", []),
        },
    )
    # A sweep's jobs take the plans checked before it started; torchrun's ranks read the plan file.
    assert counted == {"single": (1, 0), "sweep": (2, 0), "torchrun": (1, 0), "run_local": (1, 0)}
    assert len(list((tmp_path / "sweep" / "multirun").glob("*/*/[01]/summary.json"))) == 2
    (run_dir,) = list((tmp_path / "torchrun" / "outputs").glob("*/*"))
    assert not list(run_dir.glob(".plan-*"))  # the plan file is gone with the job


def test_execute_takes_only_a_plan(tmp_path):
    from clorch.engine.run import execute

    with pytest.raises(TypeError, match="takes the Plan"):
        execute(compose(["+recipe=cpu_smoke"]), tmp_path)


def test_a_plan_file_round_trips_and_refuses_an_edit(tmp_path):
    plan = resolve(compose(["+recipe=cpu_smoke"]))
    path = tmp_path / "plan.pkl"
    write_plan(plan, path)
    assert read_plan(path) == plan and read_plan(path).digest() == plan.digest()
    edited = replace(plan, config=replace(plan.config, optim=replace(plan.config.optim, lr=1.0)))
    head = path.read_bytes().partition(b"\n")[0]
    path.write_bytes(head + b"\n" + pickle.dumps(edited))  # the new plan under the old digest
    with pytest.raises(ValueError, match="changed after clorch checked it"):
        read_plan(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a launch plan"):
        read_plan(path)


def test_a_plan_file_that_names_anything_but_clorchs_config_classes_runs_nothing(tmp_path):
    class Runs:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "ran"),))

    path = tmp_path / "plan.pkl"
    for payload in (Runs(), Path("elsewhere")):  # a function; a class that is not clorch's
        data = pickle.dumps(payload)
        path.write_bytes(PLAN_HEADER + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        with pytest.raises(ValueError, match="not one of clorch's config classes"):
            read_plan(path)
    assert not (tmp_path / "ran").exists()
    # A module of clorch's that runs a command when imported is not imported.
    data = b"cclorch.runs.__main__\nmain\n."
    path.write_bytes(PLAN_HEADER + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
    with pytest.raises(ValueError, match="not one of clorch's config classes"):
        read_plan(path)
    assert "clorch.runs.__main__" not in sys.modules


def test_a_plan_file_naming_a_dataclass_that_is_not_a_config_class_is_refused(tmp_path):
    import clorch.train.worker  # noqa: F401 - loaded, as in a rank: it imports torch's StateDictOptions

    path = tmp_path / "plan.pkl"
    for module in ("clorch.train.worker", "torch.distributed.checkpoint.state_dict"):
        data = f"c{module}\nStateDictOptions\n)R.".encode()  # StateDictOptions(), by the module's name for it
        path.write_bytes(PLAN_HEADER + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        with pytest.raises(ValueError, match=f"{module}.StateDictOptions is not one of clorch's config classes"):
            read_plan(path)


def test_a_plan_file_keeps_keys_as_they_were_checked(tmp_path):
    from clorch.config.schema import target_section

    plan = resolve(compose(["+recipe=cpu_smoke"]))
    labels = {i: f"class {i}" for i in range(11)}  # JSON would have made them "0" .. "10"
    model = target_section("model", {"_target_": "my_pkg.Net", "id2label": labels, "mixed": {1: 1, "a": 2}})
    path = tmp_path / "plan.pkl"
    write_plan(replace(plan, config=replace(plan.config, model=model)), path)
    kwargs = read_plan(path).config.model.kwargs
    assert kwargs["id2label"] == labels and kwargs["mixed"] == {1: 1, "a": 2}


def test_another_world_size_changes_only_the_step_arithmetic():
    plan = resolve(compose(["+recipe=cpu_smoke", "data.sample_count=256", "batch_size=8"]))
    same, errors = for_world_size(plan, plan.world_size)
    assert same is plan and errors == []
    wider, errors = for_world_size(plan, 2 * plan.world_size)
    assert errors == []
    assert wider.shard_size == plan.shard_size // 2 and wider.world_size == 2 * plan.world_size
    assert wider.config == plan.config and isinstance(wider, Plan)
    _, errors = for_world_size(plan, 200)  # a shard of 1 or 2 samples: smaller than the batch
    assert any("batch_size=8 is larger than a rank's shard" in e for e in errors), errors
