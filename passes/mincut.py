"""Cast placement as a minimum s-t cut: re-decide painting's free choices to move the fewest bytes.

After painting, the vertices painting was free to colour (FOLLOW/PASS vertices not forced FP32 by a
HIGH op upstream, nor made low precision to store an embedding table in half the bytes, a storage
cost this per-run cost model does not see) form a binary labelling problem: FP32 (source side) or low precision (sink side).
Everything else is a terminal: FP32-forced vertices are tied to the source, low-precision ALLOW
vertices and vertices already in the low type to the sink, other fixed vertices by their dtype.

The cost is the bytes Casts move: a tensor whose producer and users differ needs one Cast per
(tensor, dtype), shared by all its users. Two auxiliary vertices per tensor model exactly that:
``a_t`` (a low-precision copy exists: producer -> a_t costs the cast, a_t -> every user is
infinite) and ``b_t`` (an FP32 copy exists, mirrored). A tiny bias towards painting's colour breaks
ties, so the result differs from painting only where it saves bytes.

Guarantees: painting's colouring is a feasible cut, so the optimum moves at most as many cast bytes
as painting (both totals are recorded on the plan); only free vertices change; each connected free
region is solved on its own (networkx ``boykov_kolmogorov``), regions without a cast at stake are
skipped. Tensor sizes come from the inferred shapes; unknown dims count as 1.
"""

from __future__ import annotations

import dataclasses
import math

import networkx as nx
import onnx_ir as ir
from networkx.algorithms.flow import boykov_kolmogorov

from amp_compiler.graph import PrecisionGraph, is_constant
from amp_compiler.plan import PrecisionPlan, Role, Rule

_SOURCE, _SINK = "s", "t"
_BIAS = 1e-3  # bytes; far below any real cast, breaks ties towards painting's choice


def tensor_elements(value: ir.Value) -> int:
    shape = value.shape
    if shape is None:
        return 1
    return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in shape.dims)


def cast_bytes(value: ir.Value) -> int:
    """Bytes a Cast between FP32 and a 16-bit type reads and writes for this tensor."""
    return tensor_elements(value) * (4 + 2)


@dataclasses.dataclass
class _Tensor:
    value: ir.Value
    producer: int
    users: set[int]


def _tensors(graph: PrecisionGraph) -> list[_Tensor]:
    """Every non-constant float tensor with its producing vertex and its using vertices."""
    by_value: dict[ir.Value, _Tensor] = {}
    for slot, vid in graph.slot_vertex.items():
        if slot.defines and slot.value is not None:
            by_value.setdefault(slot.value, _Tensor(slot.value, vid, set())).producer = vid
    for slot, vid in graph.slot_vertex.items():
        if not slot.defines and slot.value is not None and not is_constant(slot.value):
            t = by_value.get(slot.value)
            if t is not None and vid != t.producer:
                t.users.add(vid)
    return [t for t in by_value.values() if t.users]


def total_cast_bytes(graph: PrecisionGraph, low_of: dict[int, bool]) -> int:
    """Bytes moved by the Casts a colouring needs (one per tensor and dtype)."""
    total = 0
    for t in _tensors(graph):
        p = low_of.get(t.producer)
        if p is None:
            continue
        needs_other = any(low_of.get(u, p) != p for u in t.users)
        total += cast_bytes(t.value) if needs_other else 0
    return total


class MinCutPlacementPass:
    def __call__(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        low = graph.target.dtype
        decided_low = {v.id: plan.decisions[v.id].dtype == low for v in graph.vertices}
        free = {
            v.id
            for v in graph.vertices
            if plan.roles[v.id] in (Role.INFER, Role.CLEAR)
            and plan.decisions[v.id].rule not in (Rule.PAINT_DENY, Rule.PAINT_TABLE)
        }
        plan.cast_bytes_painting = total_cast_bytes(graph, decided_low)
        tensors = _tensors(graph)
        # Connected free regions: free vertices joined by the tensors between them.
        regions = nx.utils.UnionFind(free)
        touching: dict[int, list[_Tensor]] = {}
        for t in tensors:
            members = [v for v in (t.producer, *t.users) if v in free]
            for v in members[1:]:
                regions.union(members[0], v)
            for v in members[:1]:
                touching.setdefault(v, []).append(t)
        by_region: dict[int, list[_Tensor]] = {}
        for root, ts in touching.items():
            by_region.setdefault(regions[root], []).extend(ts)
        for ts in by_region.values():
            self._solve(ts, free, decided_low, plan, graph)
        plan.cast_bytes_final = total_cast_bytes(graph, decided_low)

    def _solve(self, tensors, free, decided_low, plan, graph) -> None:
        seen: set[int] = set()
        unique = []
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                unique.append(t)
        g = nx.DiGraph()
        region = set()
        for k, t in enumerate(unique):
            w = float(cast_bytes(t.value))
            a, b = ("a", k), ("b", k)
            g.add_edge(t.producer, a, capacity=w)
            g.add_edge(b, t.producer, capacity=w)
            for u in t.users:
                g.add_edge(a, u)  # infinite (no capacity attribute)
                g.add_edge(u, b)
            for v in (t.producer, *t.users):
                if v in free:
                    region.add(v)
        if not region:
            return
        for v in [n for n in g.nodes if isinstance(n, int)]:
            if v in free:
                # bias: pay a little to leave painting's colour (edge u -> v is cut when u is on
                # the FP32 side and v on the low side)
                if decided_low[v]:
                    g.add_edge(v, _SINK, capacity=_BIAS)
                else:
                    g.add_edge(_SOURCE, v, capacity=_BIAS)
            elif decided_low[v]:
                g.add_edge(v, _SINK)
            else:
                g.add_edge(_SOURCE, v)
        if not g.has_node(_SOURCE):
            g.add_node(_SOURCE)
        if not g.has_node(_SINK):
            g.add_node(_SINK)
        _, (fp32_side, _) = nx.minimum_cut(g, _SOURCE, _SINK, flow_func=boykov_kolmogorov)
        low_type = graph.target.dtype
        for v in region:
            now_low = v not in fp32_side
            if now_low == decided_low[v]:
                continue
            decided_low[v] = now_low
            dtype = low_type if now_low else ir.DataType.FLOAT
            side = graph.target.value if now_low else "FP32"
            plan.decide(
                v, dtype, Rule.MINCUT,
                f"{side}: cast placement (minimum cut) moves fewer bytes this way than painting did",
            )
