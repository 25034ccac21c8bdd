"""The package's import graph read as a building: a room per module (a folder as one room), a floor
per level of imports, and the imports that run back up.

    python -m benchmarks.import_graph [--root DIR] [--modules]

Every ``import amp_compiler...`` and ``from amp_compiler... import`` in ``amp_compiler/`` and
``passes/`` (installed as ``amp_compiler.passes``) is read with :mod:`ast`; an import inside a
function is marked as such, one under ``if TYPE_CHECKING:`` as typing-only. A *room* is a module of
the package root, or a folder below it taken whole (``amp_compiler/onnx/load/`` is one room, its
parent ``amp_compiler/onnx/`` another, holding the folder's own modules). An *arrow* is a pair of
rooms one imports from the other. Rooms on a circle cannot be stacked: the arrows that close circles
are taken out first, the function-level ones before module-level ones (Eades, Lin and Smyth's
ordering among the rest); they are the arrows that *run back up*. A room's *floor* is one more than
the highest floor it imports from; a *circle* is a set of modules (files, not rooms) that import
each other at run time.

Used by ``tests/test_layering.py`` (no circle, no arrow back up) and quoted in issue notes.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import networkx as nx

PACKAGE = "amp_compiler"


@dataclasses.dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    where: str  # "module", "function" or "typing"


def _module_files(root: Path) -> dict[str, Path]:
    files = {}
    for base, prefix in ((root / PACKAGE, PACKAGE), (root / "passes", f"{PACKAGE}.passes")):
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((prefix, *parts))] = path
    return files


def _packages(files: dict[str, Path]) -> set[str]:
    return {name for name, path in files.items() if path.name == "__init__.py"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_of(module: str, path: Path, files: dict[str, Path]) -> list[Import]:
    found: list[Import] = []

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and where == "module":
                inner = "function"
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.body:
                    visit_one(sub, "typing")
                for sub in child.orelse:
                    visit_one(sub, where)
                continue
            visit_one(child, inner)

    def visit_one(child: ast.AST, where: str) -> None:
        targets: list[str] = []
        if isinstance(child, ast.Import):
            targets = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            targets = [f"{child.module}.{alias.name}" for alias in child.names] or [child.module]
        for name in targets:
            if not name.startswith(PACKAGE):
                continue
            target = resolve(name)
            if target and target != module:
                found.append(Import(module, target, where))
        if not isinstance(child, (ast.Import, ast.ImportFrom)):
            visit(child, where)

    visit(ast.parse(path.read_text(), str(path)), "module")
    return found


def room_of(module: str, packages: set[str]) -> str:
    """The room a module stands in: the package root's modules are rooms of their own, a folder
    below it is one room."""
    if module in packages and module != PACKAGE:
        return module
    parent = module.rpartition(".")[0]
    return module if parent == PACKAGE else parent


@dataclasses.dataclass
class Building:
    rooms: list[str]
    arrows: dict[tuple[str, str], list[Import]]
    back_up: list[tuple[str, str]]
    floors: dict[str, int]
    circles: list[list[str]]

    @property
    def floor_count(self) -> int:
        return max(self.floors.values(), default=0)


def _eades_order(graph: nx.DiGraph) -> list[str]:
    """A vertex order with few arrows against it (Eades, Lin and Smyth 1993): sinks go last,
    sources first, else the vertex whose out-degree most exceeds its in-degree."""
    g = graph.copy()
    head: list[str] = []
    tail: list[str] = []
    while g:
        changed = True
        while changed:
            changed = False
            for v in sorted(n for n in g if g.out_degree(n) == 0):
                tail.insert(0, v)
                g.remove_node(v)
                changed = True
            for v in sorted(n for n in g if g.in_degree(n) == 0):
                head.append(v)
                g.remove_node(v)
                changed = True
        if g:
            v = max(sorted(g), key=lambda n: g.out_degree(n) - g.in_degree(n))
            head.append(v)
            g.remove_node(v)
    return head + tail


def measure(root: Path) -> Building:
    files = _module_files(root)
    packages = _packages(files)
    imports = [imp for module, path in files.items() for imp in _imports_of(module, path, files)]

    arrows: dict[tuple[str, str], list[Import]] = {}
    for imp in imports:
        a, b = room_of(imp.source, packages), room_of(imp.target, packages)
        if a != b:
            arrows.setdefault((a, b), []).append(imp)
    rooms = sorted({room_of(m, packages) for m in files})

    # Arrows that close circles: function-level and typing-only arrows first, then Eades' order.
    graph = nx.DiGraph()
    graph.add_nodes_from(rooms)
    graph.add_edges_from(arrows)
    back_up: list[tuple[str, str]] = []
    soft = [edge for edge, imps in arrows.items() if all(i.where != "module" for i in imps)]
    for edge in sorted(soft):
        if nx.has_path(graph, edge[1], edge[0]):  # on a circle
            graph.remove_edge(*edge)
            back_up.append(edge)
    if not nx.is_directed_acyclic_graph(graph):
        # importer above imported: order the rooms so that imported ones come last
        position = {room: i for i, room in enumerate(_eades_order(graph))}
        for a, b in sorted(graph.edges):
            if position[a] > position[b]:
                graph.remove_edge(a, b)
                back_up.append((a, b))

    floors: dict[str, int] = {}
    for room in reversed(list(nx.topological_sort(graph))):
        floors[room] = 1 + max((floors[b] for b in graph.successors(room)), default=0)

    runtime = nx.DiGraph()
    runtime.add_edges_from((i.source, i.target) for i in imports if i.where != "typing")
    circles = sorted(sorted(c) for c in nx.strongly_connected_components(runtime) if len(c) > 1)
    return Building(rooms, arrows, sorted(back_up), floors, circles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--modules", action="store_true", help="list the rooms floor by floor")
    args = parser.parse_args()
    b = measure(args.root)
    print(f"rooms {len(b.rooms)}, floors {b.floor_count}, arrows {len(b.arrows)}, "
          f"back up {len(b.back_up)}, circles {len(b.circles)}")
    for a, c in b.back_up:
        how = ", ".join(sorted({f"{i.source} -> {i.target} ({i.where})" for i in b.arrows[(a, c)]}))
        print(f"  back up: {a} -> {c}: {how}")
    for circle in b.circles:
        print(f"  circle: {' <-> '.join(circle)}")
    if args.modules:
        for floor in range(b.floor_count, 0, -1):
            names = sorted(r.removeprefix(PACKAGE + ".") for r, f in b.floors.items() if f == floor)
            print(f"  {floor:2d}: {' '.join(names)}")


if __name__ == "__main__":
    main()
