"""Paint: decide every vertex's precision from its role, by propagation (TensorFlow AMP's painting).

Steps (TensorFlow's auto_mixed_precision painting, with the refinements ARCHITECTURE.md's "How decisions
are made" describes):
1. ALLOW vertices start low precision.
2. DENY spreads forward through INFER vertices, and through CLEAR vertices that lead to a DENY or
   INFER vertex, stopping at ALLOW vertices: an Add fed by Exp stays FP32.
3. INFER/CLEAR vertices with a low-precision ancestor and a low-precision descendant (through
   INFER/CLEAR vertices not painted DENY) become low precision. Vertices that read no other vertex
   (their float inputs are constants, or they make floats from integers: a Cast from int64) count as
   low-precision ancestors: they can produce either dtype at no cost.
   Table lookups (a Gather from a constant table of at least ``TABLE_MIN_ELEMENTS`` elements, an
   embedding) become low precision even when their users are FP32: the table is stored at half the
   size, and a Cast of the rows looked up costs far less than the table.
4. Low precision spreads through CLEAR vertices in both directions.
5. Values that must share a dtype (If outputs, Loop-carried values) are one vertex already.

Guarantees (checked by ``ensures``): every vertex gets a decision with a rule id and a reason; FIXED
vertices keep their dtype; DENY vertices are FP32; ALLOW vertices are low precision; only free
vertices become low precision. Runs in O(V + E).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable

import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure, ensure_all, require, require_roles

__all__ = ["PaintPass"]

# ONNX gathers, and ATen's embedding (the FX frontend names vertices' ops by their ATen packet name).
TABLE_LOOKUP_OPS = frozenset({"Gather", "GatherElements", "GatherND", "embedding"})
TABLE_MIN_ELEMENTS = 16384  # 64 KiB of FP32


def _is_table_lookup(vertex: Vertex) -> bool:
    if vertex.node is None or vertex.node.op_type not in TABLE_LOOKUP_OPS:
        return False
    data = vertex.node.inputs[0]
    return any(
        c is data and c.shape is not None and c.shape.is_static()
        and math.prod(c.shape.numpy()) >= TABLE_MIN_ELEMENTS
        for c in vertex.constants
    )


def _bfs(
    seeds: Iterable[int], neighbours: Callable[[int], Iterable[int]], admit: Callable[[int], bool]
) -> dict[int, int]:
    """Vertices reachable from ``seeds`` through admitted vertices, each with the seed it came from."""
    parent: dict[int, int] = {}
    queue: deque[int] = deque()
    for s in seeds:
        if s not in parent:
            parent[s] = s
            queue.append(s)
    while queue:
        v = queue.popleft()
        for w in neighbours(v):
            if w not in parent and admit(w):
                parent[w] = parent[v]
                queue.append(w)
    return parent


@dataclasses.dataclass
class PaintPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(not plan.decisions, self, "the plan has decisions already")

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure(set(plan.decisions) == {v.id for v in graph.vertices}, self, "not every vertex (only) is decided")
        low = graph.target.dtype
        ensure_all(self, graph.vertices, lambda v: _painted_as_its_role(v, plan, low), "is decided against its role")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        g = graph.digraph
        roles = plan.roles
        low = graph.target.dtype
        # Plain adjacency lists: the searches below visit each vertex's neighbours several times.
        successors = {v: list(nbrs) for v, nbrs in g.adjacency()}
        predecessors = {v: list(nbrs) for v, nbrs in g.pred.items()}
        succ, pred = successors.__getitem__, predecessors.__getitem__
        vertices = graph.vertices

        # 1. Low-precision seeds: ALLOW vertices and vertices already in the low dtype.
        allow = {v.id for v in vertices if roles[v.id] is Role.ALLOW}
        allow |= {v.id for v in vertices if roles[v.id] is Role.FIXED and v.dtype == low}

        # 2. DENY forward through INFER and through CLEAR that lead to DENY/INFER.
        deny_seeds = [v.id for v in vertices if roles[v.id] is Role.DENY]
        upstream = _bfs(
            [v.id for v in vertices if roles[v.id] in (Role.DENY, Role.INFER)],
            pred,
            lambda w: roles[w] is Role.CLEAR,
        )
        painted_deny = _bfs(
            deny_seeds,
            succ,
            lambda w: roles[w] is Role.INFER or (roles[w] is Role.CLEAR and w in upstream),
        )

        def open_(w: int) -> bool:
            return roles[w] in (Role.INFER, Role.CLEAR) and w not in painted_deny

        # 3. Between low-precision vertices.
        free_sources = [v.id for v in vertices if open_(v.id) and not predecessors[v.id]]
        below_low = _bfs(list(allow) + free_sources, succ, open_)
        above_low = _bfs(allow, pred, open_)
        between = {v for v in below_low if v in above_low and open_(v)}
        tables = {
            vid for vid in free_sources if roles[vid] is Role.CLEAR and _is_table_lookup(vertices[vid])
        } - between

        # 4. Through CLEAR vertices, both directions.
        seeds = allow | between | tables
        spread = _bfs(
            seeds,
            lambda v: successors[v] + predecessors[v],
            lambda w: roles[w] is Role.CLEAR and w not in painted_deny,
        )

        for v in vertices:
            vid = v.id
            role = roles[vid]
            rule, reason = plan.role_rules[vid]
            if role is Role.FIXED:
                plan.decide(vid, v.dtype or ir.DataType.UNDEFINED, rule, reason)
            elif role is Role.ALLOW:
                plan.decide(vid, low, rule, reason)
            elif role is Role.DENY:
                plan.decide(vid, ir.DataType.FLOAT, rule, reason)
            elif vid in painted_deny:
                src = painted_deny[vid]
                plan.decide(
                    vid,
                    ir.DataType.FLOAT,
                    Rule.PAINT_DENY,
                    f"FP32: downstream of {vertices[src].describe()}, which is FP32 "
                    f"({plan.role_rules[src][0].value})",
                )
            elif vid in between:
                plan.decide(vid, low, Rule.PAINT_BETWEEN_LOW, f"{_label(plan, vid)}: between low-precision ops")
            elif vid in tables:
                plan.decide(
                    vid, low, Rule.PAINT_TABLE,
                    "PASS: looks up rows of a large constant table: the table is stored in low "
                    "precision and only the rows looked up are cast",
                )
            elif vid in spread:
                src = spread[vid]
                plan.decide(
                    vid, low, Rule.PAINT_PASS,
                    f"PASS: precision neutral, joins low-precision {vertices[src].describe()}",
                )
            else:
                plan.decide(
                    vid, ir.DataType.FLOAT, Rule.PAINT_DEFAULT,
                    f"FP32: {_label(plan, vid)}, without low-precision neighbours on both sides",
                )


def _painted_as_its_role(vertex: Vertex, plan: PrecisionPlan, low: ir.DataType) -> bool:
    """The decision keeps the role: FIXED its dtype, DENY FP32, ALLOW low precision, and low
    precision only where the vertex is free (or already low); a rule id and a reason each."""
    decision, role = plan.decisions[vertex.id], plan.roles[vertex.id]
    if not (isinstance(decision.rule, Rule) and decision.reason):
        return False
    if role is Role.FIXED:
        return decision.dtype == (vertex.dtype or ir.DataType.UNDEFINED)
    if role is Role.DENY:
        return decision.dtype == ir.DataType.FLOAT
    if role is Role.ALLOW:
        return decision.dtype == low
    return decision.dtype in (low, ir.DataType.FLOAT)


def _label(plan: PrecisionPlan, vid: int) -> str:
    rule, reason = plan.role_rules[vid]
    if rule is Rule.POLICY_FP32_INSIDE:
        return f"HIGH op whose kernel computes in FP32 inside ({plan.fp32_inside[vid]})"
    return "FOLLOW op" if plan.roles[vid] is Role.INFER else "PASS op"
