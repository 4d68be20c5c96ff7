"""The import graph of the project's packages, read from the source with :mod:`ast` (nothing is
imported), and its cycles.

Every ``import`` statement counts, wherever it stands: at module level, inside a function (a lazy
import) or under ``if TYPE_CHECKING:``: a lazy or type-only import still ties two modules together.
``from package import name`` points at ``package.name`` when that is a module, else at the
package's ``__init__``. Importing a module is not counted as importing its parent packages.

Run ``python -m tests.import_graph`` for the edges between top-level subpackages and any cycle;
``--update-doc`` rewrites that graph in ``docs/design.md`` (a test checks the copy there is current).
"""

from __future__ import annotations

import ast
import graphlib
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
    """``realtime_omni.session.runner`` -> ``realtime_omni.session``; a top-level module of the
    runtime keeps its name; every module of another package (the bench tooling) is that package."""
    parts = module.split(".")
    if parts[0] != "realtime_omni" or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def layer_graph(graph: Graph) -> Graph:
    """Edges between top-level subpackages (and top-level modules)."""
    layers: Graph = {}
    for module, targets in graph.items():
        src = layer_of(module)
        layers.setdefault(src, set())
        for target in targets:
            dst = layer_of(target)
            if dst != src:
                layers[src].add(dst)
    return layers


DOC = ROOT / "docs" / "design.md"
DOC_BEGIN = "<!-- import-graph: generated by python -m tests.import_graph --update-doc -->"
DOC_END = "<!-- import-graph: end -->"


def _short(name: str) -> str:
    return "realtime_omni/__init__" if name == "realtime_omni" else name.removeprefix("realtime_omni.")


def layer_markdown(graph: Graph) -> str:
    """The subpackage graph as a markdown list, importers before what they import (so it reads
    top-down, from the entry points to the leaves)."""
    layers = layer_graph(graph)
    height: dict[str, int] = {}  # longest import chain below a node (the graph has no cycle)
    for node in graphlib.TopologicalSorter(layers).static_order():  # what a node imports comes first
        height[node] = 1 + max((height[t] for t in layers.get(node, ())), default=-1)
    order = sorted(height, key=lambda n: (-height[n], n))  # deterministic: no set order leaks in
    lines = ["```"]
    width = max(len(_short(n)) for n in order)
    for node in order:
        targets = ", ".join(sorted(_short(t) for t in layers.get(node, ())))
        lines.append(f"{_short(node):<{width}}  -> {targets or '(imports nothing of the project)'}")
    lines.append("```")
    return "\n".join(lines)


def doc_block(text: str) -> str | None:
    """The generated block of ``docs/design.md`` (between the markers), or None."""
    if DOC_BEGIN not in text or DOC_END not in text:
        return None
    return text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0].strip("\n")


def update_doc(graph: Graph) -> None:
    text = DOC.read_text(encoding="utf-8")
    if doc_block(text) is None:
        raise SystemExit(f"{DOC}: no {DOC_BEGIN} ... {DOC_END} block")
    head, rest = text.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    DOC.write_text(f"{head}{DOC_BEGIN}\n{layer_markdown(graph)}\n{DOC_END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    graph = build_graph()
    if "--update-doc" in args:
        update_doc(graph)
    for src, dsts in sorted(layer_graph(graph).items()):
        print(f"{src} -> {', '.join(sorted(dsts))}")
    found = cycles(graph)
    for component in found:
        print("cycle:", " <-> ".join(component))
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} cycles")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
