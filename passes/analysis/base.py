"""The contract of an analysis pass: ``call`` does the work, ``requires`` and ``ensures`` check it.

An analysis pass reads a :class:`~amp_compiler.core.graph.PrecisionGraph` and writes the
:class:`~amp_compiler.core.plan.PrecisionPlan`; it never edits the model. As in onnx_ir's pass
infrastructure (``onnx_ir.passes.PassBase``), ``requires`` states what must hold before the pass runs
(raising ``PreconditionError``) and ``ensures`` turns the guarantees its docstring promises into a
check of the plan it wrote (raising ``PostconditionError``), given the plan as it was before the pass
(``before``, a :meth:`~amp_compiler.core.plan.PrecisionPlan.snapshot`). The pipeline
(:mod:`amp_compiler.passes.analysis.pipeline`) runs the checks when asked; calling a pass runs only ``call``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Container, Iterable
from typing import NoReturn

import networkx as nx
from onnx_ir.passes import PostconditionError, PreconditionError

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule

__all__ = [
    "AnalysisPass", "PostconditionError", "PreconditionError", "ensure", "ensure_all", "ensure_only_pinned",
    "paths_into", "require", "require_roles",
]


class AnalysisPass(abc.ABC):
    """A pass from precision graph to plan (see the module docstring)."""

    def __call__(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        self.call(graph, plan)

    @abc.abstractmethod
    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        """Read ``graph``, write ``plan``."""

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        """Raise :class:`PreconditionError` unless the plan holds what the pass reads."""
        del graph, plan

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        """Raise :class:`PostconditionError` unless ``plan`` keeps the pass's guarantees
        (``before``: the plan as it was when the pass started)."""
        del graph, plan, before


def require(ok: bool, pass_: AnalysisPass, message: str) -> None:
    """A precondition of ``pass_``."""
    if not ok:
        raise PreconditionError(f"{type(pass_).__name__}: {message}")


def ensure(ok: bool, pass_: AnalysisPass, message: str) -> None:
    """A postcondition of ``pass_``."""
    if not ok:
        fail(pass_, message)


def fail(pass_: AnalysisPass, message: str) -> NoReturn:
    """A postcondition of ``pass_`` that does not hold."""
    raise PostconditionError(f"{type(pass_).__name__}: {message}")


def ensure_all(pass_: AnalysisPass, vertices: Iterable[Vertex], ok: Callable[[Vertex], bool], what: str) -> None:
    """A postcondition on every vertex: the first one that is not ``ok`` is named, followed by ``what``."""
    for vertex in vertices:
        if not ok(vertex):
            ensure(False, pass_, f"vertex {vertex.id} ({vertex.describe()}) {what}")


def require_roles(pass_: AnalysisPass, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
    """Every vertex has a role (classification ran)."""
    for vertex in graph.vertices:
        if vertex.id not in plan.roles:
            require(False, pass_, f"vertex {vertex.id} ({vertex.describe()}) has no role: classification runs first")


def ensure_only_pinned(
    pass_: AnalysisPass, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan,
    pinnable: frozenset[Role], role: Role, rules: frozenset[Rule], found: Container[int] | None = None,
) -> None:
    """Roles changed only from a ``pinnable`` role to ``role``, by one of ``rules``, with a reason (and,
    given ``found``, only of vertices in it: what the pass's own search found)."""

    def kept_or_pinned(vertex: Vertex) -> bool:
        vid = vertex.id
        if plan.roles[vid] is before.roles[vid] and plan.role_rules[vid] == before.role_rules[vid]:
            return True
        rule, reason = plan.role_rules[vid]
        return (before.roles[vid] in pinnable and plan.roles[vid] is role and rule in rules and bool(reason)
                and (found is None or vid in found))

    allowed = f"only {role.value} by {sorted(r.value for r in rules)} may"
    ensure_all(pass_, graph.vertices, kept_or_pinned, f"changed role, where {allowed}")


def paths_into(
    graph: PrecisionGraph, sink: Vertex, is_source: Callable[[Vertex], bool], passes: Callable[[Vertex], bool],
    digraph: nx.DiGraph | None = None, starts: Iterable[int] | None = None,
) -> dict[int, int]:
    """The vertices on paths into ``sink`` from sources (``is_source``) through vertices that ``passes``
    lets by, each with the source it comes from (a vertex reached from several: the first, in id order):
    backwards from the sink through passing vertices to the sources, then forwards from each source
    within what the backward walk found. Sources are included; the sink is not. ``digraph``: the edges
    walked (default ``graph.digraph``; :func:`~amp_compiler.core.graph.dataflow` also crosses a Cast
    between float types); ``starts``: the sink's predecessors the backward walk starts from (default: all)."""
    digraph = graph.digraph if digraph is None else digraph
    back: set[int] = set()
    sources: list[int] = []
    stack = list(digraph.pred[sink.id] if starts is None else starts)
    while stack:
        vid = stack.pop()
        if vid in back:
            continue
        vertex = graph.vertices[vid]
        if is_source(vertex):
            back.add(vid)
            sources.append(vid)
        elif passes(vertex):
            back.add(vid)
            stack.extend(digraph.pred[vid])
    path: dict[int, int] = {}
    for start in sorted(sources):
        stack = [start]
        while stack:
            vid = stack.pop()
            if vid in path:
                continue
            path[vid] = start
            stack.extend(w for w in digraph.succ[vid] if w in back and w not in path)
    return path
