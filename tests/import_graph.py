"""The import graph of the project's packages, read from the source with :mod:`ast` (nothing is
imported), and its cycles.

Every ``import`` statement counts, wherever it stands: at module level, inside a function (a lazy
import) or under ``if TYPE_CHECKING:``: a lazy or type-only import still ties two modules together.
``from package import name`` points at ``package.name`` when that is a module, else at the
package's ``__init__``. Importing a module is not counted as importing its parent packages.

Run ``python -m tests.import_graph`` for the edges between top-level subpackages and any cycle.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("realtime_omni", "realtime_omni_bench")

Graph = dict[str, set[str]]


def module_files(packages: Iterable[str] = PACKAGES, root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under the given packages."""
    found: dict[str, Path] = {}
    for package in packages:
        base = root / package
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_package(module: str, files: dict[str, Path]) -> bool:
    return files[module].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom, files: dict[str, Path]) -> str:
    """The absolute name that a (possibly relative) ``from ... import`` starts from."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    if not _is_package(module, files):
        parts.pop()  # a plain module's imports are relative to its package
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _targets(module: str, tree: ast.AST, files: dict[str, Path]) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, files)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in files else base


def build_graph(files: dict[str, Path] | None = None) -> Graph:
    """Edges between the project's own modules (third-party and stdlib imports are left out)."""
    files = module_files() if files is None else files
    graph: Graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = graph.setdefault(module, set())
        for target in _targets(module, tree, files):
            # ``import a.b.c`` of a name that is not a module: keep the longest known prefix
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_of(module: str) -> str:
    """``realtime_omni.session.runner`` -> ``session``; top-level modules keep their own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_graph(graph: Graph) -> Graph:
    """Edges between top-level subpackages (and top-level modules), per package."""
    layers: Graph = {}
    for module, targets in graph.items():
        src = f"{module.split('.')[0]}.{layer_of(module)}" if "." in module else module
        for target in targets:
            dst = f"{target.split('.')[0]}.{layer_of(target)}" if "." in target else target
            if dst != src:
                layers.setdefault(src, set()).add(dst)
    return layers


def main() -> int:
    graph = build_graph()
    for src, dsts in sorted(layer_graph(graph).items()):
        print(f"{src} -> {', '.join(sorted(dsts))}")
    found = cycles(graph)
    for component in found:
        print("cycle:", " <-> ".join(component))
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} cycles")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
