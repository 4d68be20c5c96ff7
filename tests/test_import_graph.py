"""The package's modules import each other without cycles (read with ast: nothing is imported)."""

from __future__ import annotations

from pathlib import Path

from .import_graph import build_graph, cycles, layer_graph, module_files


def test_no_import_cycle_between_modules():
    graph = build_graph()
    assert "realtime_omni.session.runner" in graph and len(graph) > 50  # the walker found the package
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_top_level_subpackages_import_in_one_direction():
    layers = layer_graph(build_graph())
    found = cycles(layers)
    assert not found, "subpackage cycles: " + "; ".join(" <-> ".join(c) for c in found)


def _package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files(["pkg"], root)


def test_the_walker_sees_lazy_and_type_only_imports(tmp_path):
    files = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from .sub import b\n",
        "pkg/sub/__init__.py": "from .b import thing\n",
        "pkg/sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\nthing = 1\n",
        "pkg/c.py": "import pkg.a\nimport os\n",
        "pkg/d.py": "from . import c\nfrom .sub.b import thing\n",
    })
    graph = build_graph(files)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}  # stdlib left out
    assert graph["pkg.d"] == {"pkg.c", "pkg.sub.b"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_the_walker_finds_no_cycle_where_there_is_none(tmp_path):
    files = _package(tmp_path, {"pkg/__init__.py": "from . import a\n", "pkg/a.py": "from . import b\n", "pkg/b.py": ""})
    graph = build_graph(files)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert cycles(graph) == []


def test_the_runtime_package_reaches_the_bench_package_only_through_the_cli():
    graph = build_graph()
    assert any(m.startswith("realtime_omni_bench.") for m in graph)  # the walker sees the bench package
    importers = {m for m, targets in graph.items() if m.split(".")[0] == "realtime_omni"
                 and any(t.split(".")[0] == "realtime_omni_bench" for t in targets)}
    assert importers == {"realtime_omni.cli"}  # the lazy import behind ``realtime-omni bench``


def test_the_design_document_shows_the_current_subpackage_graph():
    from .import_graph import DOC, doc_block, layer_markdown

    block = doc_block(DOC.read_text(encoding="utf-8"))
    assert block is not None, f"{DOC} lost its generated import-graph block"
    assert block == layer_markdown(build_graph()), f"{DOC} is out of date: python -m tests.import_graph --update-doc"
