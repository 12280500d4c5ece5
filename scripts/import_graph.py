#!/usr/bin/env python3
"""The graph of imports between clorch's modules, its cycles, and what pulls in a package.

A maintainer's tool (standard library only). It parses every module under
clorch/ (nothing is imported) and records each import of a clorch module:

    module   an import that runs when the importing module is imported
             (module level, class bodies, `try:` and `if` blocks included)
    lazy     an import inside a function body: it runs when the function is called
    typing   an import under `if TYPE_CHECKING:` (never runs; reported apart and
             left out of every cycle)

Resolution: `from clorch.x import y` is an edge to clorch.x.y when y is a
submodule (a .py file or a package), else to clorch.x; `import clorch.x.y` is an
edge to clorch.x.y; relative imports resolve against the importing module's
package. Importing clorch.x.y runs clorch/__init__.py and clorch/x/__init__.py
first: `--with-parents` adds those edges too (an edge to a package the importer
itself lives in is left out: that package is already initialising when the
importer runs).

Usage (from the repository root):

    python3 scripts/import_graph.py                     the report
    python3 scripts/import_graph.py --with-parents      ... with the parent-package edges
    python3 scripts/import_graph.py --check             exit 1 if a module-level cycle exists
    python3 scripts/import_graph.py --pulls torch --root clorch.cli
                                                        the modules clorch.cli imports at
                                                        module level that import torch at
                                                        module level, each with its chain

The report: (1) counts of intra-clorch imports; (2) strongly connected
components (Tarjan) of more than one module over the executing edges (module
and lazy), each with the edges inside it (file:line, module or lazy), a
shortest cycle through each of them, and whether it is still a cycle on module-level edges alone;
(3) package-level cycles, modules collapsed to clorch.X, with the edges behind
each direction; (4) the strings that name a clorch module ("clorch.x:worker",
an importlib table, a _target_), which run-time imports the graph cannot see,
each marked `!` with the module or package cycle it would close if it were an
import. `--check` looks at module-level edges only (plus parent edges
with `--with-parents`), so a test can call it:

    subprocess.run([sys.executable, "scripts/import_graph.py", "--check"]).returncode == 0

`--pulls` always follows parent-package edges (that is what Python runs).
Strings naming modules (part 4) are never edges: not in the cycles, not in
`--check`, not in `--pulls`.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT_PACKAGE = "clorch"
MODULE, LAZY, TYPING = "module", "lazy", "typing"
NAMED = "named"  # a string naming a clorch module ("clorch.x" or "clorch.x:fn"): not an import
NAME_PATTERN = re.compile(r"clorch(\.\w+)+(:\w+)?")


@dataclass(frozen=True)
class Edge:
    """One resolved import of a clorch module by a clorch module."""

    src: str
    dst: str
    path: str
    line: int
    kind: str  # MODULE, LAZY or TYPING
    parent: bool = False  # added by --with-parents: dst is a package above the imported module

    def where(self) -> str:
        """`file:line (kind)`, as the report prints it."""
        kind = f"{self.kind}, parent package" if self.parent else self.kind
        return f"{self.path}:{self.line} ({kind})"


@dataclass(frozen=True)
class ExternalImport:
    """One import of a package outside clorch (its first name only: `torch`)."""

    src: str
    name: str
    path: str
    line: int
    kind: str


# --- finding the modules ------------------------------------------------------------------


def discover_modules(package_dir: Path) -> dict[str, Path]:
    """Map each dotted module name under `package_dir` to its file (packages: __init__.py)."""
    modules = {}
    base = package_dir.parent
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_package(module: str, modules: dict[str, Path]) -> bool:
    """True when `module` is a package (its file is an __init__.py)."""
    return modules[module].name == "__init__.py"


# --- reading the imports of one file ------------------------------------------------------


def is_type_checking(test: ast.expr) -> bool:
    """True for the test `TYPE_CHECKING` or `typing.TYPE_CHECKING`."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


class ImportCollector(ast.NodeVisitor):
    """Collect (node, kind) for every Import/ImportFrom, kind from where the node sits."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
        self._function_depth = 0
        self._typing_depth = 0

    def _kind(self) -> str:
        """TYPING under `if TYPE_CHECKING:`, else LAZY inside a function, else MODULE."""
        if self._typing_depth:
            return TYPING
        return LAZY if self._function_depth else MODULE

    def _visit_function(self, node: ast.AST) -> None:
        """Visit a function body (decorators and defaults run at definition, but hold no imports)."""
        self._function_depth += 1
        self.generic_visit(node)
        self._function_depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_If(self, node: ast.If) -> None:
        """The body of `if TYPE_CHECKING:` is TYPING; its `else:` runs as usual."""
        if not is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._typing_depth += 1
        for child in node.body:
            self.visit(child)
        self._typing_depth -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._kind()))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self._kind()))


def collect_imports(path: Path) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """The import statements of one file, each with its kind."""
    collector = ImportCollector()
    collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return collector.found


# --- resolving an import to clorch modules ------------------------------------------------


def longest_known_prefix(dotted: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `dotted` that is a known module (None when none is)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def relative_base(module: str, level: int, modules: dict[str, Path]) -> str:
    """The package a `from ...` import of `level` dots in `module` is relative to."""
    package = module if is_package(module, modules) else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def resolve_from(node: ast.ImportFrom, module: str, modules: dict[str, Path]) -> list[str]:
    """Targets of `from X import a, b`: X.a for each submodule a, plus X if any name isn't one."""
    base = node.module or ""
    if node.level:
        prefix = relative_base(module, node.level, modules)
        base = f"{prefix}.{base}" if base else prefix
    if base != ROOT_PACKAGE and not base.startswith(ROOT_PACKAGE + "."):
        return []
    targets = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        target = submodule if submodule in modules else longest_known_prefix(base, modules)
        if target is not None and target not in targets:
            targets.append(target)
    return targets


def resolve_import(node: ast.Import, modules: dict[str, Path]) -> list[str]:
    """Targets of `import a.b.c, d`: each clorch name, cut to its longest known module."""
    targets = []
    for alias in node.names:
        if alias.name == ROOT_PACKAGE or alias.name.startswith(ROOT_PACKAGE + "."):
            target = longest_known_prefix(alias.name, modules)
            if target is not None and target not in targets:
                targets.append(target)
    return targets


def external_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    """First names of the non-clorch, absolute packages an import names (`torch`, `hydra`)."""
    if isinstance(node, ast.ImportFrom):
        names = [node.module] if node.module and not node.level else []
    else:
        names = [alias.name for alias in node.names]
    firsts = [name.split(".")[0] for name in names]
    return [name for name in dict.fromkeys(firsts) if name != ROOT_PACKAGE]


def parent_packages(target: str, importer: str) -> list[str]:
    """Packages above `target` that importing it runs, less those `importer` lives in."""
    parts = target.split(".")
    parents = [".".join(parts[:end]) for end in range(1, len(parts))]
    return [p for p in parents if not (importer == p or importer.startswith(p + "."))]


def named_modules(module: str, path: Path, rel: str, modules: dict[str, Path]) -> list[Edge]:
    """Edges (kind NAMED) for the strings in one file that name another clorch module.

    These are the imports the graph cannot see: importlib.import_module() on a name
    from a table, a launch target "clorch.x:worker", a Hydra _target_.
    """
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if NAME_PATTERN.fullmatch(node.value):
                target = longest_known_prefix(node.value.split(":")[0], modules)
                # "clorch.conf", "clorch.ckpt": no module past the root package, so not a name
                if target not in (None, ROOT_PACKAGE, module):
                    edges.append(Edge(module, target, rel, node.lineno, NAMED))
    return edges


# --- the whole graph ----------------------------------------------------------------------


def build_graph(
    modules: dict[str, Path], repo: Path, with_parents: bool
) -> tuple[list[Edge], list[ExternalImport], int]:
    """All intra-clorch edges, the external imports, and the number of import statements."""
    edges: list[Edge] = []
    externals: list[ExternalImport] = []
    statements = 0
    for module, path in modules.items():
        rel = str(path.relative_to(repo))
        edges.extend(named_modules(module, path, rel, modules))
        for node, kind in collect_imports(path):
            if isinstance(node, ast.ImportFrom):
                targets = resolve_from(node, module, modules)
            else:
                targets = resolve_import(node, modules)
            targets = [t for t in targets if t != module]
            statements += bool(targets)
            for target in targets:
                edges.append(Edge(module, target, rel, node.lineno, kind))
                if with_parents:
                    for parent in parent_packages(target, module):
                        edges.append(Edge(module, parent, rel, node.lineno, kind, parent=True))
            externals.extend(ExternalImport(module, name, rel, node.lineno, kind) for name in external_names(node))
    return edges, externals, statements


def adjacency(edges: list[Edge], kinds: set[str]) -> dict[str, set[str]]:
    """src -> {dst} over the edges of the given kinds."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if edge.kind in kinds:
            graph.setdefault(edge.src, set()).add(edge.dst)
            graph.setdefault(edge.dst, set())
    return graph


# --- strongly connected components --------------------------------------------------------


def tarjan(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of `graph` (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    components.append(pop_component(node, stack, on_stack))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def pop_component(root: str, stack: list[str], on_stack: set[str]) -> list[str]:
    """Pop Tarjan's stack down to `root`: one component, sorted."""
    component = []
    while True:
        node = stack.pop()
        on_stack.discard(node)
        component.append(node)
        if node == root:
            return sorted(component)


def cyclic_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one node, largest first."""
    return sorted((c for c in tarjan(graph) if len(c) > 1), key=lambda c: (-len(c), c))


def cycles_through_edges(graph: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """For each edge u -> v inside `nodes`, a shortest cycle through it; duplicates dropped."""
    inside = set(nodes)
    found: dict[tuple[str, ...], list[str]] = {}
    for src in sorted(inside):
        for dst in sorted(graph.get(src, set()) & inside):
            back = [dst] if dst == src else shortest_path(graph, dst, src, inside)
            if back:
                cycle = [src, *back]
                found.setdefault(canonical_cycle(cycle), cycle)
    return sorted(found.values(), key=lambda c: (len(c), c))


def canonical_cycle(cycle: list[str]) -> tuple[str, ...]:
    """A cycle (first node repeated last) rotated to start at its smallest node."""
    ring = cycle[:-1]
    start = ring.index(min(ring))
    return tuple(ring[start:] + ring[:start])


def shortest_path(graph: dict[str, set[str]], start: str, goal: str, allowed: set[str] | None = None) -> list[str]:
    """A shortest path start -> ... -> goal of at least one edge (BFS); [] when none."""
    previous: dict[str, str] = {}
    queue = deque([start])
    seen: set[str] = set()
    while queue:
        node = queue.popleft()
        for child in sorted(graph.get(node, ())):
            if allowed is not None and child not in allowed:
                continue
            if child == goal:
                path = [child, node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return path[::-1]
            if child not in seen:
                seen.add(child)
                previous[child] = node
                queue.append(child)
    return []


# --- packages -----------------------------------------------------------------------------


def package_of(module: str) -> str:
    """The first-level name a module collapses to: clorch.engine.run -> clorch.engine."""
    return ".".join(module.split(".")[:2])


def package_edges(edges: list[Edge]) -> dict[tuple[str, str], list[Edge]]:
    """(package, package) -> the module edges behind it, between different packages."""
    grouped: dict[tuple[str, str], list[Edge]] = {}
    for edge in edges:
        pair = (package_of(edge.src), package_of(edge.dst))
        if pair[0] != pair[1]:
            grouped.setdefault(pair, []).append(edge)
    return grouped


# --- the report ---------------------------------------------------------------------------


def edges_within(edges: list[Edge], nodes: set[str], key=lambda name: name) -> list[Edge]:
    """The edges whose two ends (mapped through `key`) both lie in `nodes`."""
    return [e for e in edges if key(e.src) in nodes and key(e.dst) in nodes and key(e.src) != key(e.dst)]


def print_counts(edges: list[Edge], statements: int) -> None:
    """Part (1): how many imports, and of which kinds."""
    print("== (1) intra-clorch imports")
    direct = [e for e in edges if not e.parent and e.kind != NAMED]
    print(f"  import statements naming a clorch module: {statements}")
    print(f"  resolved edges (module imports): {len(direct)}")
    for kind, label in ((MODULE, "at module level"), (LAZY, "inside function bodies"), (TYPING, "under TYPE_CHECKING")):
        print(f"    {label}: {sum(e.kind == kind for e in direct)}")
    parents = sum(e.parent for e in edges)
    if parents:
        print(f"  parent-package edges added (--with-parents): {parents}")
    for edge in (e for e in direct if e.kind == TYPING):
        print(f"    typing only: {edge.src} -> {edge.dst}  {edge.where()}")


def print_edge(edge: Edge, indent: str = "    ") -> None:
    """One edge line: src -> dst  file:line (kind)."""
    print(f"{indent}{edge.src} -> {edge.dst}  {edge.where()}")


def print_components(edges: list[Edge]) -> None:
    """Part (2): module SCCs over executing edges, with their edges and a shortest cycle."""
    running = adjacency(edges, {MODULE, LAZY})
    eager = adjacency(edges, {MODULE})
    components = cyclic_components(running)
    print(f"\n== (2) module cycles (SCCs of more than one module, module + lazy edges): {len(components)}")
    for number, component in enumerate(components, 1):
        inner = cyclic_components({n: eager.get(n, set()) & set(component) for n in component})
        state = "MODULE-LEVEL CYCLE" if inner else "broken at import time by lazy imports"
        print(f"\n  [{number}] {len(component)} modules, {state}")
        for module in component:
            print(f"    {module}")
        for sub in inner:
            if sub != component:
                print(f"  of which module-level: {', '.join(sub)}")
        print("  cycles (a shortest one through each edge):")
        for cycle in cycles_through_edges(running, component):
            print(f"    {' -> '.join(cycle)}  [{cycle_state(cycle, eager)}]")
        print("  edges:")
        members = set(component)
        for edge in sorted(edges_within(edges, members), key=lambda e: (e.src, e.dst, e.line)):
            if edge.kind != TYPING:
                print_edge(edge)


def cycle_state(cycle: list[str], eager: dict[str, set[str]]) -> str:
    """`module-level` when every step of `cycle` has an eager edge, else the lazy steps."""
    lazy = [f"{a} -> {b}" for a, b in zip(cycle, cycle[1:]) if b not in eager.get(a, set())]
    return "lazy: " + ", ".join(lazy) if lazy else "module-level"


def print_named(edges: list[Edge]) -> None:
    """Part (4): strings naming clorch modules, and the cycles they would close if imported."""
    named = [e for e in edges if e.kind == NAMED]
    print(f"\n== (4) clorch modules named by string (run-time imports the graph does not see): {len(named)}")
    running = adjacency(edges, {MODULE, LAZY})
    packages: dict[str, set[str]] = {}
    for src, dst in package_edges([e for e in edges if e.kind in (MODULE, LAZY)]):
        packages.setdefault(src, set()).add(dst)
    for edge in sorted(named, key=lambda e: (e.src, e.line)):
        back = shortest_path(running, edge.dst, edge.src)
        src_pkg, dst_pkg = package_of(edge.src), package_of(edge.dst)
        pkg_back = shortest_path(packages, dst_pkg, src_pkg) if src_pkg != dst_pkg else []
        print_edge(edge, indent="  ! " if back or pkg_back else "    ")
        if back:
            print(f"      would close the module cycle {' -> '.join([edge.src, *back])}")
        if pkg_back:
            print(f"      would close the package cycle {' -> '.join([src_pkg, *pkg_back])}")


def print_package_cycles(edges: list[Edge]) -> None:
    """Part (3): cycles between clorch.X packages, with the module edges of each direction."""
    running = [e for e in edges if e.kind in (MODULE, LAZY)]
    grouped = package_edges(running)
    graph: dict[str, set[str]] = {}
    for src, dst in grouped:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    components = cyclic_components(graph)
    print(f"\n== (3) package cycles (modules collapsed to clorch.X): {len(components)}")
    for number, component in enumerate(components, 1):
        eager_pairs = {p for p, es in grouped.items() if any(e.kind == MODULE for e in es)}
        eager = {n: {d for (s, d) in eager_pairs if s == n and d in component} for n in component}
        state = "module-level" if cyclic_components(eager) else "only through lazy imports"
        print(f"\n  [{number}] {', '.join(component)}  ({state})")
        for cycle in cycles_through_edges(graph, component):
            print(f"    {' -> '.join(cycle)}  [{cycle_state(cycle, eager)}]")
        for (src, dst), pair_edges in sorted(grouped.items()):
            if src in component and dst in component:
                lazy = all(e.kind == LAZY for e in pair_edges)
                print(f"    {src} -> {dst}{'  (lazy only)' if lazy else ''}")
                for edge in sorted(pair_edges, key=lambda e: (e.path, e.line)):
                    print_edge(edge, indent="      ")


def print_pulls(edges: list[Edge], externals: list[ExternalImport], name: str, root: str) -> None:
    """The modules `root` runs at import that import `name` at module level, with chains."""
    graph = adjacency(with_all_parents(edges), {MODULE})
    # importing `root` runs its own packages first: start from them too
    starts = [root, *parent_packages(root, "")]
    reached = set().union(*(reachable(graph, start) for start in starts))
    hits = [x for x in externals if x.name == name and x.kind == MODULE and x.src in reached]
    print(f"\n== modules `import {root}` runs that import {name} at module level: {len({x.src for x in hits})}")
    for hit in sorted(hits, key=lambda x: (x.src, x.line)):
        chain = chain_to(graph, starts, hit.src)
        print(f"  {hit.path}:{hit.line}  via {' -> '.join(chain)}")


def chain_to(graph: dict[str, set[str]], starts: list[str], goal: str) -> list[str]:
    """A shortest import chain from the first of `starts` that reaches `goal`."""
    for start in starts:
        if start == goal:
            return [start]
        path = shortest_path(graph, start, goal)
        if path:
            return path
    return []


def with_all_parents(edges: list[Edge]) -> list[Edge]:
    """`edges` plus the parent-package edges, whether or not --with-parents built them."""
    out = list(edges)
    seen = {(e.src, e.dst, e.line) for e in edges}
    for edge in edges:
        if edge.parent:
            continue
        for parent in parent_packages(edge.dst, edge.src):
            if (edge.src, parent, edge.line) not in seen:
                seen.add((edge.src, parent, edge.line))
                out.append(Edge(edge.src, parent, edge.path, edge.line, edge.kind, parent=True))
    return out


def reachable(graph: dict[str, set[str]], root: str) -> set[str]:
    """Every node reachable from `root`, `root` included."""
    seen = {root}
    queue = deque([root])
    while queue:
        for child in graph.get(queue.popleft(), ()):
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return seen


def has_module_level_cycle(edges: list[Edge]) -> bool:
    """True when the module-level edges (with whatever parents were built) hold a cycle."""
    return bool(cyclic_components(adjacency(edges, {MODULE})))


# --- the command --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repo",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="repository root holding clorch/ (default: this script's parent's parent)",
    )
    parser.add_argument(
        "--with-parents", action="store_true", help="add edges to the parent packages an import runs (clorch, clorch.x)"
    )
    parser.add_argument(
        "--check", action="store_true", help="print nothing but cycles; exit 1 if a module-level cycle exists"
    )
    parser.add_argument(
        "--pulls", metavar="PACKAGE", help="list the modules --root runs at import that import PACKAGE at module level"
    )
    parser.add_argument("--root", default="clorch.cli", help="the module --pulls starts from")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build the graph and print the report (or only check it)."""
    args = parse_args(argv)
    repo = args.repo.resolve()
    modules = discover_modules(repo / ROOT_PACKAGE)
    if not modules:
        print(f"no modules under {repo / ROOT_PACKAGE}", file=sys.stderr)
        return 2
    edges, externals, statements = build_graph(modules, repo, args.with_parents)
    if args.check:
        eager = adjacency(edges, {MODULE})
        for component in cyclic_components(eager):
            for cycle in cycles_through_edges(eager, component):
                print("module-level import cycle: " + " -> ".join(cycle))
        return 1 if has_module_level_cycle(edges) else 0
    if args.pulls:
        print_pulls(edges, externals, args.pulls, args.root)
        return 0
    print(
        f"{len(modules)} modules under {repo / ROOT_PACKAGE}"
        f"{' (with parent-package edges)' if args.with_parents else ''}"
    )
    print_counts(edges, statements)
    print_components(edges)
    print_package_cycles(edges)
    print_named(edges)
    return 0


if __name__ == "__main__":
    sys.exit(main())
