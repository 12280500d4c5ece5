"""The documentation's DDP + AMP library example under real torchrun (2 gloo ranks on the CPU).

The block is taken as written from whichever file of README.md and docs/*.md
holds it (now docs/library.md, "Data parallelism and mixed precision") and
started with `python -m torch.distributed.run --standalone --nproc_per_node 2`
(standalone: torchrun picks a free port itself). With the
block as written the two ranks must end with the same weights (they start
from different random weights and train on different random data, so only
averaging makes them equal); with its process-group call taken out, every
rank must stop with clorch's error naming WORLD_SIZE instead of training alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme_examples import ROOT, _JOB_VARIABLES, doc_blocks

pytestmark = pytest.mark.timeout(300)

TORCHRUN_TIMEOUT_S = 240  # two ranks importing torch on 2 busy CPU cores take about 20 s
# After the block: each rank prints its final weights (the block leaves the model in `model`)
# as one write of one line, so the two ranks' lines on the shared stdout pipe cannot interleave.
_REPORT = (
    '\nimport os as _os, sys as _sys\n'
    '_sys.stdout.write(f"WEIGHTS {_os.environ[\'RANK\']} {model.weight.double().sum().item()}\\n")\n'
    '_sys.stdout.flush()\n'
)
_WEIGHTS = re.compile(r"^WEIGHTS (\d) (\S+)$", re.M)
# The calls that join the job, replaced to run the block without a group.
_INIT_CALL = re.compile(r"(?:\w+\.)*init_process_group\([^)]*\)")
_GROUP_BLOCK = re.compile(r"(?:\w+\.)*process_group\([^)]*\)")


def ddp_amp_block() -> str:
    """The DDP + AMP example: the python block that wraps a model in DistributedDataParallel."""
    found = [b for b in doc_blocks() if "DistributedDataParallel(model" in b.code and "adopt(ddp" in b.code]
    assert len(found) == 1, (
        f"expected one DDP + AMP example in README.md and docs/*.md, found {[b.where for b in found]}"
    )
    return found[0].code


def _torchrun(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "ddp_amp.py"
    script.write_text(code)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _JOB_VARIABLES and not k.startswith(("SLURM_", "TORCHELASTIC_", "SUBMITIT_"))
    }
    env.update(
        PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES=""
    )  # gloo on the CPU, also on a GPU machine
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script.name]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S)


def test_the_example_as_written_averages_over_two_torchrun_ranks(tmp_path):
    code = ddp_amp_block()
    assert _INIT_CALL.search(code) or _GROUP_BLOCK.search(code), (
        "the DDP + AMP example never joins a process group, so under torchrun it cannot "
        f"average (clorch refuses to train each rank alone):\n{code}"
    )
    proc = _torchrun(code + _REPORT, tmp_path)
    assert proc.returncode == 0, f"torchrun exit status {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    weights = dict(_WEIGHTS.findall(proc.stdout))
    assert sorted(weights) == ["0", "1"], proc.stdout
    assert weights["0"] == weights["1"], f"the ranks' weights differ: {weights}"


def test_the_example_without_a_group_stops_every_rank_with_a_clear_error(tmp_path):
    code = _INIT_CALL.sub("None", ddp_amp_block())
    code = _GROUP_BLOCK.sub('__import__("contextlib").nullcontext()', code)
    assert "process_group(" not in code.replace("destroy_process_group(", "")
    proc = _torchrun(code + _REPORT, tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "WEIGHTS" not in proc.stdout  # no rank trained alone
    errors = re.findall(r"RuntimeError: DistributedDataParallel: .*WORLD_SIZE=2.*", proc.stderr)
    assert len(errors) == 2, proc.stderr  # each rank says why
    assert "clorch.distributed.init_process_group()" in errors[0]
