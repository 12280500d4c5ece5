"""Every launcher argument is checked before any process starts; messages name the argument."""

from __future__ import annotations

import os

import pytest

from clorch.launch import launch
from clorch.launch.config import build_config
from clorch.launch.gpus import visible_gpus
from clorch.launch.slurm import first_host, port_for_job, read_slurm
from tests.launch import workers

pytestmark = pytest.mark.timeout(30)

OK = "tests.launch.workers:report"


def _children() -> set[int]:
    """Pids of this process's children, from /proc (to show nothing was started)."""
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.add(int(entry))
            except (OSError, IndexError):
                pass
    return found


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"grace_period": -1}, "grace_period must be seconds in [0, 31536000] (a year), got -1"),
        ({"nnodes": 0}, "nnodes must be an integer >= 1, got 0"),
        ({"nnodes": 2, "node_rank": 2, "master_port": 29500}, "node_rank must be an integer in [0, 2) (nnodes), got 2"),
        ({"node_rank": -1}, "node_rank must be an integer in [0, 1) (nnodes), got -1"),
        ({"nnodes": 2, "node_rank": 1}, "master_port is required when nnodes > 1 (got nnodes=2)"),
        ({"timeout": 0}, "timeout must be None or seconds in (0, 31536000] (a year), got 0"),
        ({"timeout": 1e300}, "timeout must be None or seconds in (0, 31536000] (a year), got 1e+300"),
        ({"rdzv_timeout": 0}, "rdzv_timeout must be seconds in (0, 31536000] (a year), got 0"),
        ({"collective_timeout": "10"}, "collective_timeout must be seconds in (0, 31536000] (a year), got '10'"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0, got -1"),
        ({"master_port": 70000}, "master_port must be None or an integer in [1, 65535], got 70000"),
        ({"backend": "mpi"}, "backend must be one of 'auto', 'nccl', 'gloo' or None, got 'mpi'"),
        ({"nproc_per_node": 0}, "nproc_per_node must be None or an integer >= 1, got 0"),
        ({"master_addr": ""}, "master_addr must be a non-empty host name or address, got ''"),
    ],
)
def test_bad_argument_is_named(kwargs, message, tmp_path):
    before = _children()
    with pytest.raises(ValueError) as info:
        launch(OK, log_dir=tmp_path / "logs", **kwargs)
    assert message in str(info.value)
    assert not (tmp_path / "logs").exists(), "nothing is created for an invalid launch"
    assert _children() == before


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError) as info:
        launch(OK, grace_period=-2, nnodes=0, timeout=-1)
    text = str(info.value)
    for part in ("grace_period", "nnodes", "timeout"):
        assert part in text


def test_log_dir_that_is_a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("x")
    with pytest.raises(ValueError, match="log_dir must be a directory, got .*a_file.*which is a file"):
        launch(OK, log_dir=path)


@pytest.mark.parametrize(
    "main, message",
    [
        ("tests.launch.no_such_module:fn", "no module named 'tests.launch.no_such_module'"),
        ("no_such_package.mod:fn", "module 'no_such_package.mod' does not import"),
        ("tests.launch.workers:no_such_function", "module 'tests.launch.workers' has no function 'no_such_function'"),
        (
            "tests.launch.torchrun_worker:no_such_function",
            "module 'tests.launch.torchrun_worker' defines no 'no_such_function'",
        ),
        ("not a target", "main must be 'package.module:function', got 'not a target'"),
        ("tests.launch.workers", "main must be 'package.module:function'"),
    ],
)
def test_entry_point_that_does_not_import(main, message):
    with pytest.raises(ValueError) as info:
        launch(main, backend=None)
    assert message in str(info.value)


def test_callable_main_must_be_module_level():
    def local(ctx):
        return ctx

    with pytest.raises(ValueError, match="main must be a module-level function, got .*local"):
        launch(local, backend=None)
    with pytest.raises(ValueError, match="module-level function, got .*<lambda>"):
        launch(lambda ctx: ctx, backend=None)
    with pytest.raises(TypeError, match="main must be 'package.module:function' or a module-level function, got 42"):
        launch(42)
    config = build_config(workers.report, **_defaults())
    assert config.main == "tests.launch.workers:report"


def test_args_must_be_json():
    with pytest.raises(TypeError, match="args must be JSON-serializable .* got set"):
        launch(OK, args={1, 2})
    with pytest.raises(TypeError, match="env must map str to str, got 'A': 1"):
        launch(OK, env={"A": 1})


def _defaults(**overrides):
    kw = dict(
        nproc_per_node=None,
        devices=None,
        args=None,
        backend="auto",
        timeout=None,
        log_dir=None,
        env=None,
        nnodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=None,
        max_restarts=0,
        grace_period=10.0,
        rdzv_timeout=600.0,
        collective_timeout=600.0,
    )
    kw.update(overrides)
    return kw


def test_gpu_ranks_are_checked_before_start(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpus(os.environ) == ["3", "5"]
    config = build_config(OK, **_defaults(devices=[1, 0]))
    assert (config.nproc_per_node, config.cuda_devices, config.backend) == (2, ["5", "3"], "nccl")
    with pytest.raises(ValueError, match=r"devices must be distinct .* got \[1, 1\]: \[1\] appear more than once"):
        build_config(OK, **_defaults(devices=[1, 1]))
    with pytest.raises(ValueError, match=r"devices \[2\] do not exist: 2 CUDA device\(s\) visible"):
        build_config(OK, **_defaults(devices=[0, 2]))
    with pytest.raises(ValueError, match="nproc_per_node=3 asks for 3 GPU ranks but only 2"):
        build_config(OK, **_defaults(nproc_per_node=3))
    with pytest.raises(ValueError, match=r"nproc_per_node=1 does not match devices \[0, 1\]"):
        build_config(OK, **_defaults(nproc_per_node=1, devices=[0, 1]))
    assert build_config(OK, **_defaults(backend="gloo")).cuda_devices is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"devices \[0\] were given but no CUDA GPU is visible"):
        build_config(OK, **_defaults(devices=[0]))
    with pytest.raises(ValueError, match="backend 'nccl' needs CUDA GPUs"):
        build_config(OK, **_defaults(backend="nccl"))
    cpu = build_config(OK, **_defaults())
    assert (cpu.nproc_per_node, cpu.cuda_devices, cpu.backend) == (2, None, "gloo")


def test_slurm_variables_fill_the_defaults(monkeypatch):
    assert first_host("gpu[07-09,12],cpu1") == "gpu07"
    assert first_host("node5") == "node5"
    assert port_for_job("123456") == 10000 + 123456 % 50000
    monkeypatch.setenv("SLURM_NNODES", "4")
    monkeypatch.setenv("SLURM_NODEID", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "trn[003-006]")
    monkeypatch.setenv("SLURM_JOB_ID", "98765")
    layout = read_slurm(os.environ)
    assert (layout.nnodes, layout.node_rank, layout.master_addr, layout.master_port) == (4, 2, "trn003", 58765)
    config = build_config(OK, **_defaults(backend=None, nproc_per_node=2))
    assert (config.nnodes, config.node_rank, config.master_addr, config.master_port) == (4, 2, "trn003", 58765)
    assert (config.world_size, config.global_rank(1)) == (8, 5)
    explicit = build_config(
        OK, **_defaults(backend=None, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500)
    )
    assert (explicit.nnodes, explicit.node_rank, explicit.master_addr) == (2, 1, "10.0.0.1")
    monkeypatch.setenv("SLURM_NODEID", "x")
    with pytest.raises(ValueError, match="environment variable SLURM_NODEID must be an integer, got 'x'"):
        build_config(OK, **_defaults())


def test_opening_a_damaged_job_record_says_so(tmp_path):
    from clorch.launch.job import Job

    (tmp_path / "job.json").write_text('{"version": 1, "status": {"sta')
    with pytest.raises(ValueError, match=r"the job record .*job.json cannot be read \(JSONDecodeError"):
        Job.open(tmp_path)
