"""The package surface: clorch.run_local as documented, and a .gitignore that hides no tracked file."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import clorch

pytestmark = pytest.mark.timeout(60)
CHECKOUT = Path(clorch.__file__).resolve().parents[1]


def test_run_local_shows_its_real_signature_and_docstring():
    from clorch.engine.api import run_local

    assert clorch.run_local is run_local
    params = inspect.signature(clorch.run_local).parameters
    assert list(params)[:3] == ["devices", "nproc_per_node", "recipe"] and "run_dir" in params
    assert clorch.run_local.__doc__.startswith("Compose a recipe with overrides")


def test_import_clorch_stays_light():
    code = "import sys, clorch; print(sorted(m for m in ('hydra', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(shutil.which("git") is None or not (CHECKOUT / ".git").exists(), reason="needs a git checkout")
def test_gitignore_lists_no_tracked_file():
    ignored = subprocess.run(
        ["git", "-C", str(CHECKOUT), "ls-files", "--cached", "--ignored", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ignored.stdout == ""
