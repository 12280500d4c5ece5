"""Defaults read from the source of the class or function that owns them, without importing it.

A config key that configures a clorch class takes its default from that class's
signature (`GradScaler(init_scale=65536.0)`, `MLP(depth=2)`), so the two cannot
disagree. Importing those classes would import torch, and `clorch-train --help`
or `--cfg job` must not pay for that (nor need torch at all): the schema reads
the default expression from the module's source instead, through `ast`. A
default is a literal, a name bound at the module's top level to one, or
arithmetic on those (`365 * 24 * 3600.0`); anything else is a TypeError when
the schema is imported, never a silent wrong value. tests/config/test_source_defaults.py
compares every value read this way with the imported class's own.
"""

from __future__ import annotations

import ast
import importlib.util
import operator
from functools import lru_cache
from pathlib import Path
from typing import Any

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def source_default(module: str, owner: str, name: str) -> Any:
    """The default of argument (or dataclass field) `name` of `owner` in `module`.

    Args:
        module: a dotted module name ("clorch.amp.scaler"); found, not imported.
        owner: a class (its `__init__`, or its fields for a dataclass) or a function.
        name: the argument or field.

    Raises:
        LookupError: no such owner or argument, or the argument has no default.
        TypeError: the default is not a constant expression.
    """
    tree = _module_tree(module)
    node = next((n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == owner), None)
    if node is None:
        raise LookupError(f"{module} defines no {owner}")
    expression = _default_expression(node, name)
    if expression is None:
        raise LookupError(f"{module}.{owner} has no default for {name!r}")
    return _evaluate(expression, _constants(module), f"{module}.{owner}({name}=...)")


def source_constant(module: str, name: str) -> Any:
    """The value of `module`'s top-level constant `name` (`NAME = 25.0`), read from its source.

    Raises:
        LookupError: no such constant. TypeError: it is not a constant expression.
    """
    constants = _constants(module)
    if name not in constants:
        raise LookupError(f"{module} binds no {name} at its top level")
    return _evaluate(constants[name], constants, f"{module}.{name}")


@lru_cache(maxsize=None)
def _module_tree(module: str) -> ast.Module:
    # find_spec of a submodule would import its parent packages (clorch.launch imports torch):
    # find the top-level package alone and walk its folders.
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"no package {top}")
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
    if path is None:
        raise LookupError(f"no module {module} (looked for {base}.py)")
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _default_expression(node: ast.ClassDef | ast.FunctionDef, name: str) -> ast.expr | None:
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:  # a dataclass: `name: type = value` or `= field(default=value)`
            return next(
                (
                    _field_value(n.value)
                    for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name
                ),
                None,
            )
        node = init
    args = node.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return next((d for a, d in pairs if a.arg == name), None)


def _field_value(value: ast.expr | None) -> ast.expr | None:
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        return next((k.value for k in value.keywords if k.arg == "default"), None)
    return value


@lru_cache(maxsize=None)
def _constants(module: str) -> dict[str, ast.expr]:
    """The module's top-level `NAME = expression` bindings."""
    out: dict[str, ast.expr] = {}
    for node in _module_tree(module).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _evaluate(node: ast.expr, names: dict[str, ast.expr], where: str, depth: int = 0) -> Any:
    if depth > 20:
        raise TypeError(f"{where}: the default refers to itself")
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return _evaluate(names[node.id], names, where, depth + 1)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand, names, where, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](
            _evaluate(node.left, names, where, depth + 1), _evaluate(node.right, names, where, depth + 1)
        )
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_evaluate(item, names, where, depth + 1) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    raise TypeError(
        f"{where}: the default {ast.unparse(node)!r} is not a constant clorch can read "
        "without importing the module; write it as a literal or a module-level constant"
    )
