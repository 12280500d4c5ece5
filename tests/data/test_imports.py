"""Every data module imports on its own, first thing in a fresh interpreter (no import cycle).

An import cycle often hides when some other module happened to be imported first, so each
module gets its own subprocess. Function-local imports of `clorch.data` modules are refused
too: they are the usual way a cycle is papered over instead of removed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "clorch" / "data"
MODULES = [
    "clorch.data.tasks",
    "clorch.data.arithmetic",
    "clorch.data.synthetic",
    "clorch.data.text",
    "clorch.data",
    "clorch.data.base",
]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_first_in_a_fresh_interpreter(module):
    # cwd=ROOT: `-c` puts it first on sys.path, so this checkout is what gets imported.
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert result.returncode == 0, result.stderr


def _local_data_imports(path: Path) -> list[str]:
    """`clorch.data` imports inside functions of the module at `path`, as `name:line`."""
    found = []
    for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(name.startswith("clorch.data") for name in names):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_function_local_imports_of_data_modules():
    modules = sorted(DATA.glob("*.py"))
    assert len(modules) >= 6
    assert [hit for path in modules for hit in _local_data_imports(path)] == []
