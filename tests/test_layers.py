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
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "import_graph.py")],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
    )
    modules = re.search(r"module cycles \(.*\): (\d+)", done.stdout)
    packages = re.search(r"package cycles \(.*\): (\d+)", done.stdout)
    assert modules and packages, done.stdout
    assert (modules.group(1), packages.group(1)) == ("0", "0"), done.stdout


def test_only_the_launcher_the_ranks_and_the_command_line_import_the_plan():
    # The ranks (clorch.train) read the plan file the launching process wrote, and resume by its rules;
    # the sweeps, above the engine, size their trials' share of a GPU by the plan's estimate.
    above = ("plan", "engine", "train", "cli", "bench", "sweep", "__init__.py")
    for path in (ROOT / "clorch").rglob("*.py"):
        if path.relative_to(ROOT / "clorch").parts[0] in above:
            continue
        assert not re.search(r"^\s*(from|import) clorch\.plan\b", path.read_text(), re.M), path


def test_nothing_below_the_engine_imports_it():
    # the runner, its command line, its benchmarks, and the sweeps that run its runs
    above = ("engine", "cli", "bench", "sweep", "__init__.py")
    for path in (ROOT / "clorch").rglob("*.py"):
        part = path.relative_to(ROOT / "clorch").parts[0]
        if part in above:
            continue
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) clorch\.engine\b", text, re.M), path
        assert not re.search(r"^\s*import clorch\s*$", text, re.M), path


def test_the_ranks_code_sits_below_the_launching_process():
    # clorch.train is what every rank runs: the launching process (clorch.engine), its command line,
    # the sweeps and the benchmarks start or drive it; it imports none of them (only the plan below).
    above = ("train", "engine", "cli", "bench", "sweep", "__init__.py")
    for path in (ROOT / "clorch").rglob("*.py"):
        if path.relative_to(ROOT / "clorch").parts[0] in above:
            continue
        assert not re.search(r"^\s*(from|import) clorch\.train\b", path.read_text(), re.M), path
    for path in (ROOT / "clorch" / "train").rglob("*.py"):
        found = re.search(r"^\s*(from|import) clorch\.(engine|cli|sweep|bench)\b", path.read_text(), re.M)
        assert not found, (path, found.group(0))


def test_strategies_take_what_they_act_on_and_import_nothing_of_the_rank_or_the_plan():
    # A parallel mode's strategy is handed the model, batches, sampler and state: it never reaches
    # up into the rank's loop and components (clorch.train), the launching process (clorch.engine),
    # the plan, or the command line.
    for path in (ROOT / "clorch" / "strategies").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) clorch\.(train|engine|plan|cli|sweep|bench)\b", text, re.M), path
        assert "Components" not in text, path
    # ...and what the strategies drive below them does not import the precision object back.
    for name in ("ddp.py", "fsdp.py"):
        text = (ROOT / "clorch" / "nn" / "parallel" / name).read_text()
        assert not re.search(r"^\s*(from|import) clorch\.amp\b", text, re.M), name


def test_the_builders_sit_below_the_plan_the_ranks_and_the_strategies():
    # The plan (on meta) and the ranks (for real) build through clorch.builders; it reaches up into none of them.
    for path in (ROOT / "clorch" / "builders").rglob("*.py"):
        text = path.read_text()
        found = re.search(r"^\s*(from|import) clorch\.(train|engine|plan|strategies|cli|sweep|bench)\b", text, re.M)
        assert not found, (path, found.group(0))


def _imports_in_functions(tree):
    """(import node, its try-handlers' names) for every import inside a function body."""
    import ast

    found = []

    def visit(node, in_function, handlers):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            caught = handlers
            if isinstance(node, ast.Try) and child in node.body:
                caught = handlers + [ast.unparse(h.type) for h in node.handlers if h.type is not None]
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, caught))
            visit(child, inside, caught)

    visit(tree, False, [])
    return found


def _has_reason(lines, index):
    """A `# lazy:` comment on the import's line, or above it and the imports just before it."""
    if "# lazy:" in lines[index]:
        return True
    index -= 1
    while index >= 0 and lines[index].strip().startswith(("from ", "import ")):
        index -= 1
    return index >= 0 and lines[index].strip().startswith("# lazy:")


def test_every_lazy_import_says_why_and_only_modules_without_torch_have_them():
    """An import inside a function is an optional package's fallback (`except ImportError`) or
    keeps torch (or Hydra) out of a command's start, with a `# lazy:` line saying so; a
    module that imports torch itself has nothing to keep out, so it imports at the top."""
    import ast

    problems = []
    for path in sorted((ROOT / "clorch").rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        lines = text.splitlines()
        torch_at_top = any(
            isinstance(n, ast.Import)
            and any(a.name.split(".")[0] == "torch" for a in n.names)
            or isinstance(n, ast.ImportFrom)
            and (n.module or "").split(".")[0] == "torch"
            for n in tree.body
        )
        where = path.relative_to(ROOT)
        for node, caught in _imports_in_functions(tree):
            if any("ImportError" in c for c in caught):
                continue  # a fallback for an optional package
            if torch_at_top:
                problems.append(f"{where}:{node.lineno}: a lazy import in a module that imports torch")
                continue
            if not _has_reason(lines, node.lineno - 1):
                problems.append(f"{where}:{node.lineno}: a lazy import without a '# lazy:' reason")
    assert not problems, "\n".join(problems)


def test_config_describes_and_checks_without_torch_or_builders():
    """clorch.config never imports torch, not even lazily, nor the packages that build what a
    config names (data, models, nn, checkpoint, plan, engine, train): that is clorch.plan's work."""
    builders = r"clorch\.(data|models|nn|checkpoint|plan|engine|train|amp|optim|distributed|builders|strategies)\b"
    problems = []
    for path in sorted((ROOT / "clorch" / "config").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            statement = line.strip()
            if not statement.startswith(("import ", "from ")):
                continue
            if re.match(r"(import|from) torch\b", statement) or re.match(rf"(import|from) {builders}", statement):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {statement}")
    assert not problems, "\n".join(problems)


def test_the_sweep_lives_in_one_package_and_its_library_internals_in_one_module():
    # Sweeps: clorch.sweep alone (its summary and plots included); Hydra's and Optuna's private APIs
    # only in clorch/sweep/_private_apis.py, where a test checks each one.
    assert not (ROOT / "clorch" / "engine" / "sweep.py").exists()
    private = re.compile(r"^\s*(from|import) hydra\._internal\b|\._trial_id\b|\bstudy\.sampler\s*=[^=]", re.M)
    for path in (ROOT / "clorch").rglob("*.py"):
        if path == ROOT / "clorch" / "sweep" / "_private_apis.py":
            continue
        found = private.search(path.read_text())
        assert not found, (path, found.group(0))


def test_only_config_reads_the_parallel_options_shards_flag_and_the_layout_needs_only_the_standard_library():
    """How the ranks are arranged is one object, `clorch.config.layout.ParallelLayout`, which the
    plan builds from the `parallel` option: outside clorch/config/ nothing reads the option's
    `shards` flag (`parallel.shards`, `cfg.parallel.shards`, ...); they ask the layout's `sharded`,
    `dp_size`, `shard_size`. The layout itself imports the standard library only."""
    import ast

    found = []
    for path in sorted((ROOT / "clorch").rglob("*.py")):
        if path.relative_to(ROOT / "clorch").parts[0] == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "shards" and "parallel" in ast.unparse(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
    tree = ast.parse((ROOT / "clorch" / "config" / "layout.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "dataclasses"}, imported
