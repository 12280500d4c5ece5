"""`clorch.run_local`: train from Python, composing the same config as `clorch-train`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from clorch.config.composer import format_value
from clorch.plan.plan import plan_overrides, run_errors_as_config_errors
from clorch.engine.outputs import new_run_dir
from clorch.engine.run import execute
from clorch.precision import get_precision

# Keyword arguments run_local takes as shorthands, and the config keys they set.
SHORTHANDS = {
    "epochs": "epochs",
    "sample_count": "data.sample_count",
    "batch_size": "batch_size",
    "accumulation": "accumulation",
    "max_steps": "max_steps",
    "seed": "seed",
    "backend": "backend",
}


def _precision(value: Any) -> str:
    name = value.lstrip(":") if isinstance(value, str) else value
    return f"precision={get_precision(name).name}"


def overrides_for(
    devices: Sequence[int] | None, nproc_per_node: int | None, recipe: str | None, kwargs: dict[str, Any]
) -> list[str]:
    """Hydra overrides for run_local's arguments.

    Keyword arguments are shorthands (epochs, sample_count, batch_size,
    accumulation, precision, checkpoint_path), or any config key with dots
    written as `__` (optim__lr=3e-4), or passed as {"optim.lr": 3e-4} with **.
    """
    out = [f"+recipe={recipe}"] if recipe else []
    if devices is not None:
        out.append(f"launcher.devices={format_value(list(devices))}")
    if nproc_per_node is not None:
        out.append(f"launcher.nproc_per_node={format_value(nproc_per_node)}")
    for key, value in kwargs.items():
        if key == "precision":
            out.append(_precision(value))
        elif key == "checkpoint_path":
            path = Path(value).expanduser().resolve()
            out += ["checkpoint=final", f"checkpoint.path={format_value(str(path))}"]
        else:
            out.append(f"{SHORTHANDS.get(key, key.replace('__', '.'))}={format_value(value)}")
    return out


def run_local(
    devices: Sequence[int] | None = None,
    nproc_per_node: int | None = None,
    recipe: str | None = "ddp_bf16",
    *,
    run_dir: str | Path | None = None,
    progress: str = "off",
    **overrides: Any,
) -> dict[str, Any]:
    """Compose a recipe with overrides, launch it on this machine, wait, and report.

    Example:
        >>> import clorch
        >>> result = clorch.run_local([0, 1], epochs=4, sample_count=1024, batch_size=32,
        ...                           accumulation=2, precision="bfloat16",
        ...                           checkpoint_path="/tmp/clorch-ddp.pt")
        >>> result.status, result.status.exit_code, result.run_dir  # Status.SUCCEEDED, 0, ...

    Args:
        devices: CUDA device indices, one rank each; None: auto (all GPUs, or 2 CPU ranks).
        nproc_per_node: ranks on this machine; None: auto.
        recipe: a shipped recipe name, a recipe file path, or None for the plain defaults.
        run_dir: where outputs go; None: a fresh outputs/DATE/TIME under the current directory.
        progress: "off", "lines", "bar" or "auto".
        **overrides: see `overrides_for`.

    Returns:
        A `clorch.engine.summary.RunResult`: `.status` (a clorch.status.Status, with the
        exit code `clorch-train` would give: a failed preflight is PREFLIGHT_FAILED, exit 1),
        `.summary` (summary.json), `.run_dir`, `.logs` ({rank: {"stdout", "stderr"}}) and `.job`;
        `result["status"]["state"]`, `result["summary"]` ... of earlier versions still work.

    Raises:
        ConfigError: every config error at once (nothing is launched).
        ValueError: a bad precision name.
    """
    plan = plan_overrides(overrides_for(devices, nproc_per_node, recipe, overrides), run_dir)
    directory = Path(run_dir) if run_dir is not None else new_run_dir()
    with run_errors_as_config_errors():
        return execute(plan, directory, progress=progress, echo=progress != "off")
