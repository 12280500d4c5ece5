"""The package's imports flow one way: no circles among modules or packages, lazy imports counted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(60)
def test_no_import_circles():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")],
                          capture_output=True, text=True, timeout=50, check=True)
    modules = re.search(r"module cycles \(.*\): (\d+)", done.stdout)
    packages = re.search(r"package cycles \(.*\): (\d+)", done.stdout)
    assert modules and packages, done.stdout
    assert (modules.group(1), packages.group(1)) == ("0", "0"), done.stdout


def test_nothing_below_the_engine_imports_it():
    above = ("engine", "cli", "bench", "__init__.py")  # the runner, its command line, its benchmarks
    for path in (ROOT / "clorch").rglob("*.py"):
        part = path.relative_to(ROOT / "clorch").parts[0]
        if part in above:
            continue
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) clorch\.engine\b", text, re.M), path
        assert not re.search(r"^\s*import clorch\s*$", text, re.M), path
