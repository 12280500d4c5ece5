"""Every bad-config error, with its message, collected together before anything launches."""

from __future__ import annotations

import pytest

import clorch
from clorch.config import ConfigError, check_config, compose, register_target_prefix, resolve_target
from clorch.config.composer import hydra_overrides
from clorch.config.overrides import compose_once, check_overrides
from clorch.config.targets import check_target
from clorch.plan.plan import resolve, resolve_errors

pytestmark = pytest.mark.timeout(120)


def _errors(*overrides: str) -> list[str]:
    return check_overrides(list(overrides), resolve_errors)


def _has(errors: list[str], *parts: str) -> bool:
    return any(all(p in e for p in parts) for e in errors)


def test_the_issue_examples_are_reported_together(tmp_path):
    errors = _errors(
        "precision=fp4", "ddp.bucket_cap_mb=0", "batch_size=700", f"checkpoint.resume={tmp_path / 'missing.ckpt'}"
    )
    assert _has(errors, "precision=fp4", "choose one of: bf16, fp16, fp32")
    assert _has(errors, "ddp.bucket_cap_mb must be > 0 (MiB), got 0")
    assert _has(
        errors,
        "checkpoint.resume=",
        "missing.ckpt",
        "no such checkpoint",
        "none, latest, or an existing checkpoint path",
    )
    assert len(errors) == 3, errors
    # The errors found without torch are reported first, alone (before torch is imported); the
    # batch against a rank's shard needs the data's sizes and comes once they are fixed.
    assert _errors("batch_size=700") == [
        "batch_size=700 is larger than a rank's shard: 1024 training samples over 2 ranks give 512 per rank "
        "(use batch_size <= 512, more data, or fewer ranks)"
    ]


@pytest.mark.parametrize(
    "overrides, parts",
    [
        (["backend=nccl"], ["backend=nccl", "needs CUDA", "gloo"]),
        (["launcher.devices=[0,1]"], ["launcher.devices", "no CUDA GPU is visible"]),
        (["launcher.nproc_per_node=many"], ["launcher.nproc_per_node must be auto or an integer >= 1, got 'many'"]),
        (["launcher.nproc_per_node=0"], ["launcher.nproc_per_node must be auto or an integer >= 1, got 0"]),
        (["launcher.devices=[0]"], ["no CUDA GPU is visible on this machine: leave launcher.devices=null"]),
        (["model.foo=1"], ["model.foo is not a known key", "allowed: name, hidden_features, depth"]),
        (["epochs=two"], ["epochs must be int, got 'two'"]),
        (["epochs=0"], ["epochs must be >= 1, got 0"]),
        (["accumulation=-1"], ["accumulation must be >= 1, got -1"]),
        (["optim.lr=0"], ["optim.lr must be > 0, got 0"]),
        (["optim=rmsprop"], ["optim=rmsprop", "choose one of: adamw, sgd"]),
        (["+recipe=nope"], ["recipe=nope", "choose one of:", "ddp_bf16"]),
        (["ddp.reduce_dtype=fp8"], ["ddp.reduce_dtype='fp8'", "null, fp32, float32, bf16, bfloat16, fp16, float16"]),
        (["optim.lr=inf"], ["optim.lr must be a finite number, got inf"]),
        (["ddp.bucket_cap_mb=inf"], ["ddp.bucket_cap_mb must be a finite number, got inf"]),
        (["launcher.timeout=inf"], ["launcher.timeout must be a finite number, got inf"]),
        (["optim.weight_decay=nan"], ["optim.weight_decay must be a finite number, got nan"]),
        (["optim.betas=[0.9,-inf]"], ["optim.betas must hold only finite numbers, got [0.9, -inf]"]),
        (
            ["++optim._target_=torch.optim.SGD"],
            [
                "optim._target_ is not supported: only model._target_, data._target_, "
                "data.collate_fn._target_, loss._target_, step._target_ are honoured",
                "got optim._target_='torch.optim.SGD'",
            ],
        ),
        (
            ["++precision.scaler._target_=clorch.amp.GradScaler"],
            [
                "precision.scaler._target_ is not supported: only model._target_, data._target_, "
                "data.collate_fn._target_, loss._target_, step._target_ are honoured"
            ],
        ),
        (
            ["++model._target_=torch.nn.Linear", "++model.bias=false", "++model.hidden_features=512"],
            [
                "model.hidden_features=512 is not an argument of model._target_=torch.nn.Linear",
                "its arguments: in_features, out_features, bias, device, dtype",
                "remove it with ~model.hidden_features",
            ],
        ),
        (
            ["++model._target_=torch.nn.Linear", "~model.hidden_features", "~model.depth", "++model.bias=inf"],
            ["model.bias must be a finite number, got inf"],
        ),
        (["ddp.first_bucket_cap_mb=-1"], ["ddp.first_bucket_cap_mb must be > 0 (MiB), got -1"]),
        (["precision.scaler.growth_factor=0.5", "precision=fp16"], ["precision.scaler.growth_factor must be > 1"]),
        (["precision=fp16", "precision.scaler.enabled=false"], ["precision.scaler.enabled=false", "fp16"]),
        (
            ["compile_mode=fast"],
            ["compile_mode='fast'", "default, max-autotune-no-cudagraphs, reduce-overhead, max-autotune"],
        ),
        (
            ["compile=true", "compile_mode=reduce-overhead", "accumulation=2"],
            ["compile_mode=reduce-overhead replays CUDA graphs", "got accumulation=2", "use accumulation=1"],
        ),
        (
            ["precision=fp16", "ddp.step_in_backward=true"],
            ["ddp.step_in_backward=true cannot run with precision=fp16", "ddp.step_in_backward=false"],
        ),
        (
            ["optim.grad_clip=1.0", "ddp.step_in_backward=true"],
            [
                "optim.grad_clip=1.0 cannot run with ddp.step_in_backward=true",
                "optim.grad_clip=null or ddp.step_in_backward=false",
            ],
        ),
        (["parallel=fsdp", "ddp.bucket_cap_mb=1"], ["ddp.bucket_cap_mb=1 does nothing with parallel=fsdp"]),
        (["data=arithmetic"], ["model=mlp cannot train data=arithmetic", "use model=gpt"]),
        (
            ["model=gpt", "data=arithmetic", "model.d_model=30", "model.n_head=4"],
            ["model.d_model (30) must be divisible by model.n_head (4)"],
        ),
        (["model=gpt", "data=text"], ["data.path is required for data=text"]),
        (["model=gpt", "data=text", "data.path=/no/such/file.txt"], ["data.path='/no/such/file.txt' does not exist"]),
        (["checkpoint=periodic", "checkpoint.every_n_steps=0"], ["checkpoint.every_n_steps must be >= 1"]),
        (["launcher.max_restarts=2"], ["launcher.max_restarts=2", "use checkpoint=periodic"]),
        (["schedule=cosine", "schedule.warmup_steps=500"], ["schedule.warmup_steps=500", "must be < the run's 64"]),
        (["++model._target_=logging.os.system"], ["model._target_='logging.os.system' is not allowed"]),
        (["logger.progress=loud"], ["logger.progress='loud'", "auto, bar, lines, off"]),
    ],
)
def test_each_error_names_key_value_and_what_is_allowed(overrides, parts):
    errors = _errors(*overrides)
    assert _has(errors, *parts), errors


def test_a_sweep_checks_every_value():
    errors = _errors("precision=bf16,fp4", "optim.lr=1e-3,-1")
    assert _has(errors, "precision=fp4 is not allowed")
    assert _has(errors, "optim.lr must be > 0, got -1")


def test_resolve_raises_all_errors_as_one_config_error():
    cfg = compose(["ddp.bucket_cap_mb=0", "++epochs=0", "++sampler.shuffle=maybe"])
    with pytest.raises(ConfigError) as info:
        resolve(cfg)
    assert len(info.value.errors) == 3
    assert "3 config error(s)" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_run_local_launches_nothing_on_a_bad_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        clorch.run_local(recipe="cpu_smoke", precision="float16", batch_size=0, **{"ddp.bucket_cap_mb": 0})
    assert {"batch_size must be >= 1, got 0", "ddp.bucket_cap_mb must be > 0 (MiB), got 0"} <= set(info.value.errors)
    assert not (tmp_path / "outputs").exists()
    with pytest.raises(ValueError, match="precision must be one of .* got 'fp8'"):
        clorch.run_local(recipe="cpu_smoke", precision="fp8")


def test_compose_once_returns_the_config_with_overrides():
    cfg, errors = compose_once(["+recipe=cpu_smoke", "optim.lr=0.05", "precision=fp16"])
    assert errors == [] and resolve_errors(cfg) == []
    assert cfg.optim.lr == 0.05 and cfg.precision.name == "fp16" and check_config(cfg) == []


def test_a_single_run_gives_hydra_forced_value_overrides():
    assert hydra_overrides(
        ["optim=sgd", "optim.lr=0.1", "+recipe=x", "~seed", "hydra.run.dir=d", "--cfg", "++a=1"]
    ) == ["optim=sgd", "++optim.lr=0.1", "+recipe=x", "~seed", "hydra.run.dir=d", "--cfg", "++a=1"]


@pytest.mark.parametrize(
    "overrides, parts",
    [
        (["optim.betas=[0.9]"], ["optim.betas must be 2 numbers in [0, 1), got [0.9]"]),
        (
            ["+recipe=gpt_bf16", "model.seq_len=4"],
            ["model.seq_len=4 is smaller than data=arithmetic's 12", "model.seq_len >= 12, or null"],
        ),
        (["~optim.lr"], ["optim.lr is missing (removed with ~optim.lr?)", "default is 0.003"]),
        (
            ["model.hidden_features=100000000"],
            ["model=mlp: 4,100,000,008 parameters need about", "(16 bytes each: weights, gradients, optimizer state"],
        ),
        (
            ["backend=gloo", "launcher.nproc_per_node=100000"],
            ["launcher.nproc_per_node=100000 is far more ranks than this machine's"],
        ),
        (["sample_count=3"], ["sample_count is not a known key; did you mean data.sample_count?"]),
        (["optim.lr=["], ["'optim.lr=[' is not a valid override (no viable alternative at input '[')"]),
        (
            ["launcher.nnodes=2", "launcher.node_rank=2"],
            ["launcher.master_port is required when nnodes > 1 (got nnodes=2)"],
        ),
        (
            ["launcher.nnodes=2", "launcher.node_rank=2", "launcher.master_port=29500"],
            ["launcher.node_rank must be an integer in [0, 2) (nnodes), got 2"],
        ),
        (["precison=bf16"], ["precison is not a known key; did you mean precision?", "precision (group)"]),
        (
            ["optim=sgd", "optim.betas=[0.9,0.99]"],
            ["optim.betas is not a key of optim=sgd (it belongs to optim=adamw)", "takes: name, lr"],
        ),
        (
            ["schedule=constant", "++schedule.min_lr_ratio=0.2"],
            ["schedule.min_lr_ratio is not a key of schedule=constant (it belongs to schedule=cosine)"],
        ),
        (["optim=adamx"], ["optim=adamx is not allowed; did you mean adamw? choose one of: adamw, sgd"]),
        (
            ["checkpoint=final", "checkpoint.path=/proc/x.ckpt"],
            ["checkpoint.path=/proc/x.ckpt: cannot write there", "/proc"],
        ),
    ],
)
def test_errors_found_before_launch(overrides, parts):
    errors = _errors(*overrides)
    assert _has(errors, *parts), errors


def test_an_eval_split_smaller_than_the_job_is_found_before_training(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("x" * 300)  # 16-byte windows: 16 to train on, 1 held out
    errors = _errors("model=gpt", "data=text", f"data.path={text}", "data.seq_len=16", "batch_size=4")
    assert _has(errors, "data=text: the eval split has 1 sample(s), fewer than the job's 2 ranks"), errors


def test_a_bad_recipe_entry_names_the_file_and_the_other_errors_still_show(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("# @package _global_\ndefaults:\n  - override /optim: adamx\nbatch_size: 0\n")
    errors = _errors(f"+recipe={recipe}", "ddp.bucket_cap_mb=0")
    assert _has(
        errors, f"recipe {recipe}:", "override /optim: adamx", "optim=adamx is not allowed; choose one of: adamw, sgd"
    ), errors
    assert _has(errors, "batch_size must be >= 1, got 0") and _has(errors, "ddp.bucket_cap_mb must be > 0")


def _resumable(tmp_path):
    """A finished 2-rank cpu_smoke run's final checkpoint."""
    path = tmp_path / "final.ckpt"
    result = clorch.run_local(recipe="cpu_smoke", run_dir=tmp_path / "run", checkpoint_path=str(path))
    assert result["status"]["state"] == "succeeded", result["logs"]
    return path


def test_a_resume_that_does_not_fit_is_refused_before_launch(tmp_path):
    path = _resumable(tmp_path)
    assert _errors("+recipe=cpu_smoke", f"checkpoint.resume={path}") == []
    errors = _errors(
        "+recipe=cpu_smoke",
        f"checkpoint.resume={path}",
        "batch_size=8",
        "model.hidden_features=32",
        "launcher.nproc_per_node=1",
    )
    # (another world size is no longer refused: the global batch is kept instead, and a changed
    # batch_size is refused saying what accumulation the new world size would take)
    assert _has(errors, "keep batch_size=16 (on 1 rank accumulation then becomes 2)"), errors
    assert _has(errors, "batch_size=8 but the checkpoint was trained with batch_size=16"), errors
    assert _has(errors, "another model: model.hidden_features=32 (checkpoint: 16)"), errors


def test_target_allow_list_checks_the_resolved_object():
    assert check_target("model._target_", "torch.nn.Linear") == []
    assert check_target("optim._target_", "torch.optim.AdamW") == []
    assert _has(check_target("x", "os.system"), "x='os.system' is not allowed", "clorch, torch.optim, torch.nn")
    # An allowed-looking prefix that resolves elsewhere is refused.
    assert _has(
        check_target("x", "torch.nn.functional.torch.distributed.rpc"),
        "resolves to torch.distributed.rpc",
        "outside the allow-list",
    )
    assert _has(check_target("x", "torch.nn.NoSuchThing"), "does not import")
    with pytest.raises(ValueError, match="not allowed"):
        resolve_target("subprocess.run")
    assert resolve_target("torch.nn.Linear").__name__ == "Linear"


def test_registered_prefixes_are_allowed():
    import clorch.config.targets as targets

    assert check_target("x", "json.dumps") != []
    register_target_prefix("json")
    try:
        assert check_target("x", "json.dumps") == []
    finally:
        targets._user_prefixes.remove("json")
    with pytest.raises(ValueError, match="prefix must be a dotted module name"):
        register_target_prefix("")


def test_user_model_target_composes_and_validates():
    errors = check_config(
        compose(["++model._target_=torch.nn.Linear", "~model.hidden_features", "~model.depth", "++model.bias=false"])
    )
    assert errors == []


@pytest.mark.parametrize("name", ["fp32", "float32", "bf16", "bfloat16", "fp16", "float16"])
def test_every_reduce_dtype_the_module_accepts_validates(name):
    assert check_config(compose([f"ddp.reduce_dtype={name}"])) == []


def _periodic(directory, *more):
    return compose(["checkpoint=periodic", "checkpoint.every_n_steps=2", f"checkpoint.dir={directory}", *more])


def test_a_checkpoint_dir_holding_another_runs_checkpoints_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("CLORCH_RESTART_COUNT", raising=False)
    assert check_config(_periodic(tmp_path)) == []  # empty: fine
    (tmp_path / "step_00000010.ckpt").write_text("{}")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert check_config(_periodic(tmp_path)) == [
        f"checkpoint.dir={tmp_path} already holds checkpoints (step_00000010.ckpt); pass "
        "checkpoint.resume=latest to continue that run, or choose an empty directory"
    ]
    assert check_config(_periodic(tmp_path, "checkpoint.resume=latest")) == []
    # The launcher's restarts resume from their own directory.
    monkeypatch.setenv("CLORCH_RESTART_COUNT", "1")
    assert check_config(_periodic(tmp_path)) == []


def test_resume_latest_without_a_directory_resumes_from_the_run_directory():
    """checkpoint.dir null is <run dir>/checkpoints, for resuming in place as for saving."""
    assert _errors("checkpoint=periodic", "checkpoint.resume=latest") == []
