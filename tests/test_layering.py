"""The package's imports form one tower: no circle of modules, and no folder imports one that imports
it back (``benchmarks/import_graph.py`` reads them the way the architecture study did)."""

from __future__ import annotations

import textwrap

from benchmarks import import_graph
from tests.support import REPO_ROOT


def test_no_import_circles_and_none_running_back_up():
    building = import_graph.measure(REPO_ROOT)
    assert building.circles == [], building.circles
    assert building.back_up == [], [
        f"{a} -> {b}: {sorted({f'{i.source} -> {i.target}' for i in building.arrows[(a, b)]})}"
        for a, b in building.back_up
    ]


def test_the_shared_base_imports_no_frontend():
    """Vocabulary, runtime, policy, core and the analysis passes stand below both frontends."""
    building = import_graph.measure(REPO_ROOT)
    base = ("amp_compiler.core", "amp_compiler.policy", "amp_compiler.runtime", "amp_compiler.passes.analysis",
            "amp_compiler.errors", "amp_compiler.targets", "amp_compiler.dtypes", "amp_compiler.sizes",
            "amp_compiler.options")
    wrong = [(a, b) for a, b in building.arrows if a.startswith(base) and b.startswith("amp_compiler.fx")]
    assert wrong == []


def test_a_circle_is_found(tmp_path):
    """The measure is not vacuous: two modules importing each other are a circle, and a folder
    importing one that imports it back is an arrow running back up."""
    pkg = tmp_path / "amp_compiler"
    (pkg / "low").mkdir(parents=True)
    (tmp_path / "passes").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("from amp_compiler.high import f\n")
    (pkg / "high.py").write_text(textwrap.dedent("""
        from amp_compiler.low.a import g

        def f():
            from amp_compiler.low import a
    """))
    building = import_graph.measure(tmp_path)
    assert building.circles == [["amp_compiler.high", "amp_compiler.low.a"]]
    assert len(building.back_up) == 1
