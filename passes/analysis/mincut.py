"""Cast placement as a minimum s-t cut: re-decide painting's free choices to move the fewest bytes.

After painting, the vertices painting was free to colour (FOLLOW/PASS vertices not forced FP32 by a
HIGH op upstream, nor made low precision to store an embedding table in half the bytes, a storage
cost this per-run cost model does not see) form a binary labelling problem: FP32 (source side) or
low precision (sink side). Everything else is a terminal: FP32-forced vertices belong to the
source, low-precision ALLOW vertices and vertices already in the low type to the sink, other fixed
vertices go by their dtype.

The cost is the bytes Casts move: a tensor whose producer and users differ needs one Cast per
(tensor, dtype), shared by all its users. Two auxiliary vertices per tensor model exactly that:
``a_t`` (a low-precision copy exists: producer -> a_t costs the cast, a_t -> every user is
infinite) and ``b_t`` (an FP32 copy exists, mirrored). A tensor with a single user needs no
auxiliary vertex: one edge each way.

Three types (FP16 conversions with BF16 range fallbacks,
:mod:`amp_compiler.passes.analysis.range_fallback`): an exact reduction to this two-label cut, not a
three-label cut. The BF16 set is fixed by the range rules before placement (those vertices are
terminals of neither side); the free vertices still choose FP32 or FP16, so the problem solved is:
given the BF16 vertices, colour the free ones FP32/FP16 to move the fewest cast bytes, a Cast between
FP32 and a 16-bit type moving 6 bytes per element, one between FP16 and BF16 (direct: the fallback
requires the provider's Cast to convert them) 4. Its terms stay representable exactly: a BF16 tensor
pays a Cast to FP32 when any user is FP32 (``b_t``: users -> b_t infinite, b_t -> sink its cost) and
one to FP16 when any user is FP16 (``a_t``: source -> a_t its cost, a_t -> users infinite); a tensor
that BF16 vertices read pays one Cast to BF16, from FP16 (4) or from FP32 (6): the difference is a
unary term on its producer (producer -> sink). ``tests/passes/analysis/test_mincut_three_types.py``
checks the optimum against exhaustive search on small random graphs.

How it stays fast on 100,000-node graphs, exactly:

- Only connected free regions where painting pays for a Cast are solved; elsewhere painting costs
  nothing and is already optimal.
- Each such region is solved on a *band* around painting's Casts: free vertices within ``k`` steps.
  The band's solution, with everything outside kept as painted, is an upper bound. A lower bound on
  every colouring of the region comes from the same tensors with the band's outer neighbours left
  free too (the costs dropped are never negative). When the two agree the band's solution is
  optimal for the whole region; otherwise ``k`` doubles, up to the whole region.
- Ties between equally cheap cuts go to painting's colour: the cut's FP32 side is the closure, in
  the residual network, of the source and painting's FP32 vertices that are not forced low. So a
  vertex changes colour only where that saves bytes (or is forced by a change that does), and no
  bias capacities are needed (those made augmenting paths walk the whole residual stream of a
  transformer once per vertex: quadratic).
- An op whose results are probabilities that can be tiny (policy flag ``tiny_outputs``: Sigmoid,
  Softmax; FOLLOW, or HIGH computing in FP32 inside) and that produces an FP32 graph output (itself, or
  through data movement: a Slice dropping a detector's "no object" class, a Reshape, a Transpose) counts
  one more Cast of its output when it runs in low precision: FP16 holds a probability of 1e-6 only
  as a subnormal (spaced 6e-8), so the output would lose ~8% of it. The graph output would then take
  a Cast of the op's result, where an FP32 op takes a Cast of its input instead, as many bytes when
  the shapes match, and a second Cast of its result for its low-precision users if it has any. So
  it runs FP32 whenever that costs at most one Cast of its output more (a detector's Sigmoid whose
  probabilities also gate later layers); ties go to FP32 for it. Other ops (a final LayerNorm, data
  movement) round their results to FP16's 11 bits at worst and get no such cost.

Guarantees (checked by ``ensures``, which recounts both totals): painting's colouring is a feasible
cut, so the result costs at most what painting's does (cast bytes, both totals recorded on the plan,
plus one Cast's worth per FP32 graph output a ``tiny_outputs`` op computes in low precision: a
placement moves more bytes than painting only to compute such an output in FP32, at most one Cast of
it more);
only free vertices change. Maximum flows are
networkx's ``boykov_kolmogorov`` on integer byte capacities. Tensor sizes come from the inferred
shapes, or from ``--input-shape`` where dims are dynamic; unknown dims count as 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable, Mapping

import networkx as nx
import onnx_ir as ir
from networkx.algorithms.flow import boykov_kolmogorov

from amp_compiler.core.graph import PrecisionGraph, SlotKind, ValueView
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure, ensure_all, require, require_roles

__all__ = ["MinCutPlacementPass", "total_cast_bytes", "unshaped_tensors"]

_SOURCE, _SINK = "s", "t"  # FP32 side, low-precision side
_THIRD = "bf16"  # the fixed vertices of the third type (BF16 range fallbacks in an FP16 conversion)
#: Colours of a vertex: the FP32 side (FP32, and other fixed types), the target's low type, and the
#: third type: BF16 where the target is FP16 (:mod:`amp_compiler.passes.analysis.range_fallback`).
FP32, LOW, THIRD = 0, 1, 2


def tensor_elements(value: ValueView) -> int:
    shape = value.shape
    if shape is None:
        return 1
    return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in shape.dims)


def cast_bytes(value: ValueView) -> int:
    """Bytes a Cast between FP32 and a 16-bit type reads and writes for this tensor."""
    return tensor_elements(value) * (4 + 2)


@dataclasses.dataclass(eq=False)
class _Tensor:
    value: ValueView
    producer: int
    users: set[int]
    bytes: int = 0  # what a Cast of it moves

    def needs_cast(self, low_of: Mapping[int, int]) -> bool:
        p = low_of.get(self.producer)
        return p is not None and any(low_of.get(u, p) != p for u in self.users)

    def cost(self, low_of: Mapping[int, int]) -> int:
        """Bytes its Casts move under a colouring (one Cast per dtype its users need but its producer's):
        a Cast from or to FP32 moves 6 bytes per element, one between two 16-bit types 4."""
        p = low_of.get(self.producer)
        if p is None:
            return 0
        return sum(self.cast(p, c) for c in {low_of.get(u, p) for u in self.users} - {p})

    def cast(self, a: int, b: int) -> int:
        """Bytes one Cast of it between colours ``a`` and ``b`` moves."""
        return self.bytes if FP32 in (a, b) else self.bytes * 2 // 3


def _tensors(graph: PrecisionGraph, elements: Mapping[str, int] | None = None) -> list[_Tensor]:
    """Every non-constant float tensor with its producing vertex, its using vertices and the bytes a
    Cast of it moves (``elements``: element counts by tensor name that override the inferred shape):
    the precision graph's edges carry them (constants and a vertex's own tensors excluded)."""
    by_value: dict[ValueView, _Tensor] = {}
    for src, dst, values in graph.digraph.edges(data="values"):
        for value in values:
            t = by_value.get(value)
            if t is None:
                by_value[value] = _Tensor(value, src, {dst})
            else:
                t.users.add(dst)
    for t in by_value.values():
        name = t.value.name
        n = elements.get(name) if elements and name is not None else None
        t.bytes = cast_bytes(t.value) if n is None else n * (4 + 2)
    return list(by_value.values())


def unshaped_tensors(graph: PrecisionGraph) -> set[str]:
    """Names of the tensors between vertices that have no shape (placement counts them as one
    element unless told their sizes)."""
    return {
        v.name for _, _, values in graph.digraph.edges(data="values") for v in values
        if v.shape is None and v.name
    }


def total_cast_bytes(tensors: Iterable[_Tensor], low_of: Mapping[int, int]) -> int:
    """Bytes moved by the Casts a colouring needs (one per tensor and dtype; colours :data:`FP32`,
    :data:`LOW`, :data:`THIRD`, or booleans for low precision or not)."""
    return sum(t.cost(low_of) for t in tensors)


def colours(graph: PrecisionGraph, plan: PrecisionPlan) -> dict[int, int]:
    """Every vertex's colour as decided: the target's low type, BF16 where the target is FP16 (a
    range fallback), else the FP32 side."""
    low = graph.target.dtype
    third = ir.DataType.BFLOAT16 if low is ir.DataType.FLOAT16 else None

    def colour(dtype: ir.DataType) -> int:
        return LOW if dtype == low else THIRD if dtype == third else FP32

    return {v.id: colour(plan.decisions[v.id].dtype) for v in graph.vertices}


def _free(plan: PrecisionPlan, vid: int) -> bool:
    """Painting was free to colour the vertex (FOLLOW/PASS, not forced FP32, not a table lookup)."""
    return plan.roles[vid] in (Role.INFER, Role.CLEAR) and plan.decisions[vid].rule not in (
        Rule.PAINT_DENY, Rule.PAINT_TABLE
    )


@dataclasses.dataclass
class MinCutPlacementPass(AnalysisPass):
    """Re-decide painting's free vertices by minimum cut (see the module docstring). ``elements``:
    tensor sizes (element counts by name) for the cost, where the model's dims are dynamic
    (``--input-shape``); other tensors count their unknown dims as 1."""

    elements: Mapping[str, int] | None = None

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(set(plan.decisions) == {v.id for v in graph.vertices}, self, "painting must decide every vertex first")

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        """Never costlier than painting; only free vertices change; both byte totals recounted."""
        painting, final = plan.cast_bytes_painting, plan.cast_bytes_final
        low = graph.target.dtype
        penalties = _output_penalties(graph, before, _tensors(graph, self.elements))

        def rounding(decided: PrecisionPlan) -> int:
            return sum(b for v, b in penalties.items() if decided.decisions[v].dtype == low)

        ensure(
            painting is not None and final is not None
            and final + rounding(plan) <= painting + rounding(before), self,
            f"the Casts move {final} bytes (outputs rounded: {rounding(plan)}), painting's {painting} "
            f"({rounding(before)}) (None: not recorded)",
        )
        ensure_all(
            self, graph.vertices,
            lambda v: plan.decisions[v.id] == before.decisions[v.id]
            or (_free(before, v.id) and plan.decisions[v.id].rule is Rule.MINCUT),
            "changed colour, though painting was not free to choose it",
        )
        tensors = _tensors(graph, self.elements)
        for name, total, decided in (("painting", painting, before), ("placement", final, plan)):
            recount = total_cast_bytes(tensors, colours(graph, decided))
            ensure(recount == total, self, f"{name}'s Casts move {recount} bytes, {total} are recorded")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        low = graph.target.dtype
        low_of = colours(graph, plan)
        free = {v.id for v in graph.vertices if _free(plan, v.id)}
        incident: dict[int, list[_Tensor]] = {}
        regions = nx.utils.UnionFind(free)
        at_stake: list[list[int]] = []  # the free vertices of each tensor that needs a Cast
        painting = 0
        tensors = _tensors(graph, self.elements)
        penalties = _output_penalties(graph, plan, tensors)
        for t in tensors:
            stake = t.needs_cast(low_of)
            painting += t.cost(low_of)
            members = [v for v in (t.producer, *t.users) if v in free]
            for v in members:
                incident.setdefault(v, []).append(t)
            for v in members[1:]:
                regions.union(members[0], v)
            if members and stake:
                at_stake.append(members)
        plan.cast_bytes_painting = painting
        seeds: dict[int, set[int]] = {}  # region -> free vertices of its tensors that need a Cast
        for members in at_stake:
            seeds.setdefault(regions[members[0]], set()).update(members)

        new_low: dict[int, bool] = {}
        for region_seeds in seeds.values():
            new_low.update(_solve_region(region_seeds, incident, low_of, penalties))
        changed = sorted(v for v, now_low in new_low.items() if now_low != low_of[v])
        touched = _unique(t for v in changed for t in incident[v])
        before = total_cast_bytes(touched, low_of)
        name = graph.target.value
        for v in changed:
            now_low = new_low[v]
            low_of[v] = LOW if now_low else FP32
            why = (
                "at most one Cast of its result more this way, and its result is an FP32 graph output: "
                "computing it in low precision would round what the output reads" if v in penalties and not now_low
                else "fewer bytes this way than painting did"
            )
            plan.decide(
                v, low if now_low else ir.DataType.FLOAT, Rule.MINCUT,
                f"{name if now_low else 'FP32'}: cast placement (minimum cut) moves {why}",
            )
        # only the tensors of vertices that changed colour can change cost
        plan.cast_bytes_final = plan.cast_bytes_painting - before + total_cast_bytes(touched, low_of)


def _output_penalties(graph: PrecisionGraph, plan: PrecisionPlan, tensors: Iterable[_Tensor]) -> dict[int, int]:
    """Per free numeric (INFER) vertex of a ``tiny_outputs`` op that produces an FP32 graph output (itself or
    through PASS vertices, data movement): the bytes of a Cast of that output, what computing it in low
    precision counts (see the module docstring)."""
    outputs = {
        v.id for v in graph.vertices
        if not v.free and v.dtype == ir.DataType.FLOAT and any(s.kind is SlotKind.GRAPH_OUT for s in v.slots)
    }
    # and the PASS vertices (data movement: Slice, Reshape, Transpose...) whose values reach one unchanged, so that
    # a Softmax whose last class a Slice drops (a detector's "no object") is its output's producer too
    moving = graph.digraph.subgraph(outputs | {v.id for v in graph.vertices if plan.roles[v.id] is Role.CLEAR})
    outputs |= {u for o in list(outputs) for u in nx.ancestors(moving, o)}
    out: dict[int, int] = {}
    for t in tensors:
        v = t.producer
        policy = graph.vertices[v].policy
        if (
            plan.roles[v] is Role.INFER and _free(plan, v) and policy is not None and policy.tiny_outputs
            and not outputs.isdisjoint(t.users)
        ):
            out[v] = out.get(v, 0) + t.bytes
    return out


def _solve_region(
    seeds: set[int], incident: dict[int, list[_Tensor]], low_of: dict[int, int], penalties: dict[int, int]
) -> dict[int, bool]:
    """The optimal colouring of the free vertices of one region, grown from ``seeds`` as a band
    until the band's upper bound meets the lower bound (see the module docstring)."""
    band = set(seeds)
    layers = 1
    while True:
        tensors = _unique(t for v in band for t in incident[v])
        outer = {v for t in tensors for v in (t.producer, *t.users) if v in incident and v not in band}
        upper, colouring = _min_cut(tensors, band, low_of, penalties, tie_break=True)
        if not outer or _min_cut(tensors, band | outer, low_of, penalties, tie_break=False)[0] == upper:
            return colouring
        for _ in range(layers):  # grow by as many layers as the band has had: doubling
            band |= outer
            outer = {
                v for w in outer for t in incident[w] for v in (t.producer, *t.users)
                if v in incident and v not in band
            }
            if not outer:
                break
        layers *= 2


def _unique(tensors: Iterable[_Tensor]) -> list[_Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _min_cut(
    tensors: list[_Tensor], variables: set[int], low_of: dict[int, int], penalties: dict[int, int],
    tie_break: bool,
) -> tuple[int, dict[int, bool]]:
    """Minimum cost (cast bytes, plus ``penalties`` of the vertices left low) over ``tensors`` with
    ``variables`` free and every other vertex at its colour in ``low_of``; with ``tie_break``, also
    the colouring of ``variables`` (closest to ``low_of`` among the optima, except that penalised
    vertices take FP32 where an optimum allows)."""

    def node(v: int):
        if v in variables:
            return v
        return (_SOURCE, _SINK, _THIRD)[low_of[v]]

    g = nx.DiGraph()
    g.add_nodes_from((_SOURCE, _SINK))
    g.add_nodes_from(variables)
    fixed = 0  # Casts between two terminals (and penalties of fixed vertices): paid whatever the variables do
    ends = {v for t in tensors for v in (t.producer, *t.users)}
    for v in sorted(ends.intersection(penalties)):
        if v in variables:
            _edge(g, _SOURCE, v, penalties[v])
        elif low_of[v] == LOW:
            fixed += penalties[v]
    for k, t in enumerate(tensors):
        p = node(t.producer)
        users = {node(u) for u in t.users} - {p}
        if not users:
            continue
        w = t.bytes
        if p == _THIRD:  # one Cast to FP32 if a user is FP32, one to the low type if one is low
            fixed += _third_producer(g, k, users, t)
            continue
        if _THIRD in users:  # one Cast to the third type: from FP32 costs more than from the low type
            users.discard(_THIRD)
            to_low, to_fp32 = t.cast(THIRD, LOW), t.cast(THIRD, FP32)
            if p == _SOURCE:
                fixed += to_fp32
            else:
                fixed += to_low
                if p != _SINK:
                    _edge(g, p, _SINK, to_fp32 - to_low)  # paid when p takes the FP32 side
            if not users:
                continue
        if p in (_SOURCE, _SINK) and users <= {_SOURCE, _SINK}:
            fixed += w
            continue
        if len(users) == 1:
            (u,) = users
            _edge(g, p, u, w)
            _edge(g, u, p, w)
            continue
        a, b = ("a", k), ("b", k)
        _edge(g, p, a, w)
        _edge(g, b, p, w)
        for u in users:
            _edge(g, a, u, None)
            _edge(g, u, b, None)
    residual = boykov_kolmogorov(g, _SOURCE, _SINK)
    value = fixed + residual.graph["flow_value"]
    if not tie_break:
        return value, {}

    def open_(u, v) -> bool:
        e = residual[u][v]
        return e["capacity"] - e["flow"] > 0

    forced_low = _reach([_SINK], lambda v: (u for u in residual.pred[v] if open_(u, v)))
    seeds = [_SOURCE] + [
        v for v in sorted(variables) if (not low_of[v] or v in penalties) and v not in forced_low
    ]
    fp32_side = _reach(seeds, lambda u: (v for v in residual.succ[u] if open_(u, v)))
    return value, {v: v not in fp32_side for v in variables}


def _third_producer(g: nx.DiGraph, k: int, users: set, t: _Tensor) -> int:
    """Edges for a tensor made by a vertex of the third type (fixed), whose ``users`` are variables or
    the two terminals: a Cast to FP32 exists when a user is on the FP32 side (``b_t``: every user ->
    b_t infinite, b_t -> sink its cost), a Cast to the low type when one is on the low side
    (``a_t``: source -> a_t its cost, a_t -> every user infinite). Returns what the terminals among
    the users pay whatever the variables do."""
    fixed = 0
    to_fp32, to_low = t.cast(THIRD, FP32), t.cast(THIRD, LOW)
    variables = users - {_SOURCE, _SINK}
    if _SOURCE in users:
        fixed += to_fp32
    elif variables:
        b = ("b", k)
        _edge(g, b, _SINK, to_fp32)
        for u in variables:
            _edge(g, u, b, None)
    if _SINK in users:
        fixed += to_low
    elif variables:
        a = ("a", k)
        _edge(g, _SOURCE, a, to_low)
        for u in variables:
            _edge(g, a, u, None)
    return fixed


def _edge(g: nx.DiGraph, u, v, capacity: int | None) -> None:
    """Add capacity to u -> v (``None``: infinite); edges into the source or out of the sink never
    cross an s-t cut and are left out."""
    if v == _SOURCE or u == _SINK:
        return
    if capacity is None:
        if g.has_edge(u, v):
            g[u][v].pop("capacity", None)
        else:
            g.add_edge(u, v)
    elif g.has_edge(u, v):
        data = g[u][v]
        if "capacity" in data:
            data["capacity"] += capacity
    else:
        g.add_edge(u, v, capacity=capacity)


def _reach(seeds: Iterable, neighbours) -> set:
    seen = set(seeds)
    queue = deque(seen)
    while queue:
        for w in neighbours(queue.popleft()):
            if w not in seen:
                seen.add(w)
                queue.append(w)
    return seen
