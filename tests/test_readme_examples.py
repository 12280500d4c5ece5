"""Every ```python block of README.md and of docs/*.md runs as written on CPU.

Each block runs in a fresh interpreter, as its own test, named by its file and
the line of its opening fence (`docs/library.md:9`).

A block runs as a script in an empty temporary directory (its current
directory and TMPDIR, so run directories, checkpoints and launcher logs land
there), with this checkout on PYTHONPATH and OMP_NUM_THREADS=1. A block whose
first line names a file (`# train.py: ...`) is saved under that name, since its
ranks import it as a module. It passes when it exits 0 and prints no failed job
state. A block may be skipped only by an HTML comment on the line before its
fence: `<!-- readme-test: skip (the reason) -->`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The files whose examples run: the README and every page of the manual.
DOC_FILES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT_S = 240  # the slowest block takes about 15 s on 2 CPU cores

_FENCE = re.compile(
    r"(?:^<!-- readme-test: skip \((?P<skip>.*?)\) -->\n)?^```python\n(?P<code>.*?)^```[ \t]*$", re.S | re.M
)
# A skip comment, wherever it stands at the start of a line (attached to a fence or not).
_MARKER = re.compile(r"^<!-- readme-test:", re.M)
_FILE_NAME = re.compile(r"#\s*(?P<name>[A-Za-z_]\w*\.py)\b")
# A launched job's state as the examples print it, first on its line.
_BAD_STATE = re.compile(r"^(failed|timed_out|stopped)\b", re.M)
# Variables that would make a block's processes join someone else's job.
_JOB_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CLORCH_RESTART_COUNT",
)


class Block(NamedTuple):
    line: int  # the line of the opening fence in its file
    code: str
    skip: str | None
    file: str = "README.md"  # the file, relative to the checkout

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def readme_blocks(text: str, file: str = "README.md") -> list[Block]:
    """The ```python blocks of `text` (the contents of `file`), in order, with any skip reason."""
    return [
        Block(text.count("\n", 0, m.start("code")), m.group("code"), m.group("skip"), file)
        for m in _FENCE.finditer(text)
    ]


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def doc_blocks() -> list[Block]:
    """The ```python blocks of README.md and of every docs/*.md, file by file."""
    return [b for path in DOC_FILES for b in readme_blocks(path.read_text(), _relative(path))]


def _script_name(code: str) -> str:
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    match = _FILE_NAME.match(first)
    return match.group("name") if match else "example.py"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _JOB_VARIABLES and not k.startswith(("SLURM_", "TORCHELASTIC_", "SUBMITIT_"))
    }
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1")
    return env


def run_block(code: str, tmp_path: Path, timeout: float = BLOCK_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Save `code` under its file name in `tmp_path` and run it there with `python`."""
    script = tmp_path / _script_name(code)
    script.write_text(code)
    return subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout
    )


def check_block(block: Block, proc: subprocess.CompletedProcess) -> None:
    """Fail, showing the block and its output, unless it exited 0 and no job failed."""
    bad_state = _BAD_STATE.search(proc.stdout)
    if proc.returncode == 0 and bad_state is None:
        return
    why = f"exit status {proc.returncode}" if proc.returncode else f"a job ended {bad_state.group(1)!r}"
    pytest.fail(
        f"{block.file} block at line {block.line} failed ({why}):\n{block.code}\n"
        f"--- stdout (tail) ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-8000:]}",
        pytrace=False,
    )


BLOCKS = doc_blocks()


def test_readme_has_python_blocks_and_every_marker_is_attached():
    assert len(BLOCKS) >= 5, f"found only {len(BLOCKS)} ```python blocks in {[_relative(p) for p in DOC_FILES]}"
    assert any(b.file == "README.md" for b in BLOCKS), "README.md has no ```python block"
    for path in DOC_FILES:
        markers = len(_MARKER.findall(path.read_text()))
        skips = sum(b.skip is not None for b in BLOCKS if b.file == _relative(path))
        assert markers == skips, (
            f"{_relative(path)}: a `<!-- readme-test: skip (reason) -->` comment must sit on the line "
            "right before a ```python fence"
        )


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_readme_block_runs(block, tmp_path):
    if block.skip is not None:
        pytest.skip(f"{block.where}: {block.skip}")
    try:
        proc = run_block(block.code, tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{block.file} block at line {block.line} ran past {exc.timeout} s:\n{block.code}\n"
            f"--- stderr ---\n{exc.stderr or ''}",
            pytrace=False,
        )
    check_block(block, proc)


@pytest.mark.parametrize(
    "code",
    [
        "raise ValueError('an example that raises')\n",
        "print('failed', {'loss': None})\n",
    ],
)
def test_a_failing_block_fails_its_test(code, tmp_path):
    block = Block(0, code, None)
    with pytest.raises(pytest.fail.Exception):
        check_block(block, run_block(code, tmp_path, timeout=60))


def test_a_block_is_saved_under_the_file_name_it_gives(tmp_path):
    code = (
        "# my_worker.py: a module the ranks import\nimport pathlib, sys\n"
        "assert pathlib.Path(sys.argv[0]).name == 'my_worker.py'\n"
    )
    check_block(Block(0, code, None), run_block(code, tmp_path, timeout=60))
