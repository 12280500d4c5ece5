"""A sweep runs however clorch was installed, also where Hydra's plugin scan cannot see its sweepers.

setuptools' default editable install (`pip install -e .`) puts no folder of
clorch's on `sys.path`, only an import hook that maps `clorch` and
`hydra_plugins.clorch_sweepers` to the checkout. Hydra finds plugins by walking
the `hydra_plugins` folders on `sys.path`, so it never sees clorch's sweepers
there. The test starts clorch-train in such an interpreter: the checkout taken
off `sys.path` and the same kind of hook in its place.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# As setuptools' editable finder (__editable___clorch_*_finder.py) maps the packages: clorch and
# hydra_plugins.clorch_sweepers by an import hook, hydra_plugins a namespace without clorch's folder
# (other plugins' folders mirrored, so that an ordinary install's copy of the sweepers is unseen too).
EDITABLE = """
import importlib.abc, importlib.machinery, importlib.util, os, pkgutil, sys, tempfile

root = sys.argv[1]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != root]
MAPPING = {"clorch": root + "/clorch", "hydra_plugins.clorch_sweepers": root + "/hydra_plugins/clorch_sweepers"}


class EditableFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in MAPPING:
            folder = MAPPING[name]
            return importlib.util.spec_from_file_location(
                name, folder + "/__init__.py", submodule_search_locations=[folder]
            )
        if name == "hydra_plugins":  # other plugins' folders (site-packages) without clorch's
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [other_plugins()]
            return spec
        return None


def other_plugins():
    # One folder mirroring every installed hydra_plugins folder but clorch_sweepers (which an
    # ordinary install of clorch, as CI's, puts in site-packages).
    mirror = tempfile.mkdtemp(prefix="hydra_plugins-")
    for entry in sys.path:
        folder = os.path.join(entry or ".", "hydra_plugins")
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                target = os.path.join(mirror, name)
                if name not in ("clorch_sweepers", "__pycache__", "__init__.py") and not os.path.exists(target):
                    os.symlink(os.path.join(folder, name), target)
    return mirror


sys.meta_path.insert(0, EditableFinder())
import hydra_plugins

scanned = [m.name for m in pkgutil.walk_packages(hydra_plugins.__path__, "hydra_plugins.")]
assert "hydra_plugins.clorch_sweepers" not in scanned, f"Hydra's scan sees clorch's sweepers: {scanned}"
sys.argv = ["clorch-train", *sys.argv[2:]]
from clorch.cli import main

main()
"""


@pytest.mark.timeout(150)
def test_a_grid_sweep_runs_where_hydra_plugin_scan_misses_the_sweepers(tmp_path):
    args = ["-m", "+recipe=cpu_smoke", "launcher.nproc_per_node=1", "data.sample_count=32", "optim.lr=1e-3,3e-3"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", EDITABLE, str(ROOT), *args, "hydra.sweep.dir=sweep"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert "Unknown plugin class" not in done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()} >= {"0", "1"}
    assert "succeeded" in (tmp_path / "sweep" / "1" / "summary.json").read_text()
