"""`clorch-train`: compose (Hydra), validate, launch, report.

    clorch-train                                  a small default job
    clorch-train +recipe=ddp_bf16 optim.lr=3e-4   a recipe plus overrides
    clorch-train -m +recipe=ddp_bf16 optim.lr=1e-3,3e-4   a sweep
    clorch-train --help                           recipes, groups and the default config

Every config error is reported together, before anything launches, and the
command exits with status 2; a failed job exits with 1.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from clorch.config.compose import conf_dir, rewrite_recipe_overrides
from clorch.config.validate import ConfigError

EXIT_FAILED, EXIT_CONFIG = 1, 2
# Hydra flags that print or change what is composed: no launch, or configs preflight cannot see.
_NO_PREFLIGHT = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion",
                 "-sc", "--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn",
                 "--resolve", "--package", "-p")
_failures: list[str] = []


def _print_errors(errors: list[str]) -> None:
    print(f"clorch-train: {len(errors)} config error(s); nothing was launched:", file=sys.stderr)
    for error in errors:
        print(f"  - {error}", file=sys.stderr)


def _report(result: dict[str, Any]) -> None:
    summary, status = result["summary"], result["status"]
    if summary["status"] == "succeeded":
        final = summary["final"]
        shown = ", ".join(f"{k} {v:.4g}" for k, v in final.items()
                          if k in ("loss", "eval_loss", "eval_exact") and v is not None)
        print(f"clorch-train: succeeded, {summary['steps']} steps, {shown}; outputs in {result['run_dir']}")
        return
    error = status.get("error") or {}
    print(f"clorch-train: job {summary['status']}: rank {status.get('failed_rank')} failed first "
          f"({error.get('type', '')}: {error.get('message', '')}); logs in {result['run_dir']}/logs",
          file=sys.stderr)
    if error.get("traceback"):
        print(error["traceback"], file=sys.stderr)
    _failures.append(result["run_dir"])


@hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)
def _train(cfg: DictConfig) -> None:
    """The Hydra job: one multi-rank run in Hydra's output directory."""
    from hydra.core.hydra_config import HydraConfig

    from clorch.engine.outputs import write_json
    from clorch.engine.run import execute

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        result = execute(cfg, run_dir)
    except ConfigError as exc:
        _print_errors(exc.errors)
        from pathlib import Path

        write_json(Path(run_dir) / "summary.json", {"status": "config_error", "errors": exc.errors})
        _failures.append(run_dir)
        return
    _report(result)


def train_main(argv: list[str] | None = None) -> int:
    """The `clorch-train` console script. Returns the exit status."""
    from clorch.config.preflight import preflight
    from clorch.engine.resolve import resolve_errors

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        args = rewrite_recipe_overrides(args)
    except ValueError as exc:
        _print_errors([str(exc)])
        return EXIT_CONFIG
    if not any(a.split("=")[0] in _NO_PREFLIGHT for a in args):
        overrides = [a for a in args if "=" in a and not a.startswith("-")]
        errors = preflight(overrides, resolve_errors)
        if errors:
            _print_errors(errors)
            return EXIT_CONFIG
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # preflight composed in-process
    _failures.clear()
    saved = sys.argv
    sys.argv = [saved[0] if saved else "clorch-train", *args]
    try:
        _train()
    except SystemExit as exc:  # Hydra exits after --help and on its own errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_FAILED)
    finally:
        sys.argv = saved
    return EXIT_FAILED if _failures else 0


def main() -> None:
    sys.exit(train_main())


if __name__ == "__main__":
    main()
