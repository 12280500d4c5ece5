"""The install layout: conf/ and recipes/ at the top of the repository ship inside the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from clorch.config import conf_files

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_is_listed():
    """pyproject.toml lists packages by hand (conf/ and recipes/ map into clorch): none forgotten."""
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("clorch", "hydra_plugins")  # hydra_plugins: clorch's sweepers, where Hydra finds plugins
        for p in (ROOT / top).rglob("__init__.py")
    }
    listed = set(_setuptools()["packages"])
    assert found - listed == set(), f"add these packages to pyproject.toml: {sorted(found - listed)}"
    assert listed - found == {"clorch.conf", "clorch.recipes"}
    assert _setuptools()["package-dir"] == {"clorch.conf": "conf", "clorch.recipes": "recipes"}


def test_conf_files_match_the_schemas():
    """Each conf/ file is what the schema dataclasses render (python -m clorch.config.conf_files)."""
    assert conf_files.stale(ROOT / "conf") == []


def test_the_keys_page_and_table_match_the_options():
    """docs/keys.md and docs/training.md's key table are what the options render."""
    from clorch.config import keys_page

    assert keys_page.stale_pages(ROOT / "docs") == []


def test_a_stale_conf_file_is_reported(tmp_path):
    conf_files.write(tmp_path)
    (tmp_path / "optim" / "sgd.yaml").write_text("name: sgd\nlr: 0.5\n")
    (tmp_path / "optim" / "lion.yaml").write_text("name: lion\n")
    assert conf_files.stale(tmp_path) == ["optim/lion.yaml (no such option)", "optim/sgd.yaml"]
    assert conf_files.main(["--check", "--dir", str(tmp_path)]) == 1


@pytest.mark.timeout(300)
def test_the_wheel_ships_conf_and_recipes(tmp_path):
    # Built from a copy: a build writes build/ and *.egg-info beside the sources.
    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".whl", "build", "*.egg-info", "outputs", "multirun", "records", "__pycache__"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=280,
    )
    (wheel,) = tmp_path.glob("clorch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "clorch/conf/config.yaml",
        "clorch/conf/top.yaml",
        "clorch/conf/precision/fp16.yaml",
        "clorch/conf/checkpoint/periodic.yaml",
        "clorch/recipes/ddp_bf16.yaml",
    ):
        assert name in names, f"{name} missing from {wheel.name}"
    assert not any(n.startswith(("conf/", "recipes/")) for n in names)


@pytest.mark.timeout(120)
def test_a_checkout_on_pythonpath_finds_conf_and_recipes(tmp_path):
    """As CI and the GPU scripts run clorch: from this checkout, not from an install of it
    (clorch/conf and clorch/recipes link to the top-level folders)."""
    code = (
        "import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        "import clorch; from clorch.config import compose\n"
        "assert clorch.__file__.startswith(sys.argv[1]), clorch.__file__\n"
        "print(compose(['+recipe=ddp_fp16']).precision.name)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.strip() == "fp16", done.stderr
