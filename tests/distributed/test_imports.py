"""Module structure of clorch.distributed, clorch.launch and clorch.checkpoint.

Each import runs first in a fresh interpreter: an import cycle only shows when
its modules are entered in a particular order, and whether torch is loaded is
only meaningful in a process that has not imported it already.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import clorch.distributed as cd

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("clorch.distributed", "clorch.launch", "clorch.checkpoint")


def _run(code: str) -> dict:
    """Run `code` in a fresh interpreter at the repository root; return the JSON it prints last."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# clorch.nn and clorch.amp import clorch.distributed, which re-exports clorch.checkpoint,
# which imports clorch.nn: entering that loop at any point must work.
@pytest.mark.parametrize("module", [*PACKAGES, "clorch.env", "clorch.nn", "clorch.amp"])
def test_each_module_imports_first_in_a_fresh_process(module):
    result = _run(f"import json, {module}; print(json.dumps({{'ok': True}}))")
    assert result == {"ok": True}


@pytest.mark.parametrize("module", ["clorch.launch", "clorch.env"])
def test_launcher_side_imports_without_torch(module):
    result = _run(f"import json, sys, {module}; print(json.dumps({{'torch': 'torch' in sys.modules}}))")
    assert result == {"torch": False}


def test_group_module_and_context_manager_have_distinct_names():
    groups = importlib.import_module("clorch.distributed.groups")
    assert isinstance(groups, types.ModuleType)
    assert inspect.isfunction(cd.process_group)
    assert cd.process_group is groups.process_group
    import clorch.distributed.groups as by_statement

    assert by_statement is groups


def test_process_group_stays_the_function_after_every_submodule_loads():
    # Loading a submodule binds it as an attribute of its package, replacing any
    # function of the same name: import all of them, then look again.
    code = (
        "import importlib, inspect, json, pkgutil\n"
        "import clorch.distributed as cd, clorch.checkpoint, clorch.launch, clorch.nn, clorch.amp\n"
        f"for name in {PACKAGES!r}:\n"
        "    pkg = importlib.import_module(name)\n"
        "    for info in pkgutil.iter_modules(pkg.__path__):\n"
        "        if info.name != '__main__':\n"
        "            importlib.import_module(f'{name}.{info.name}')\n"
        "print(json.dumps({'function': inspect.isfunction(cd.process_group)}))\n"
    )
    assert _run(code) == {"function": True}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_public_name_shadows_a_submodule(package):
    pkg = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(pkg.__path__)}
    assert not submodules & set(pkg.__all__)


def test_reexports_are_the_original_objects():
    import clorch.checkpoint
    import clorch.launch

    for name in clorch.launch.__all__:
        assert getattr(cd, name) is getattr(clorch.launch, name)
    assert cd.save_checkpoint is clorch.checkpoint.save_checkpoint
    assert cd.load_checkpoint is clorch.checkpoint.load_checkpoint
    assert set(cd.__all__) >= {*clorch.launch.__all__, "save_checkpoint", "load_checkpoint"}
