"""Loop accumulators: keep FP32 a loop-carried state that a Loop or Scan body adds into itself.

A Scan body computing ``state_out = Add(state_in, x_t @ W)`` is a running sum over the iterations:
CumSum computed one step at a time, which the policy keeps FP32 (``policy.high.range``). In FP16 the
state's rounding grows with the number of steps and its value with their sum: a Scan summing 64-wide
projected frames, held out against FP32, erred by 0.13% of range at T=100, 0.6% at T=3000 and 15.6%
(cosine 0.992) at T=20000 with the state in FP16. The per-vertex policy cannot see it: the Add is an
ordinary FOLLOW op and the state a precision-neutral carried value; only the cycle through the
control-flow vertex says the Add accumulates.

In the precision graph a carried state is one vertex (the Loop/Scan's input and output, the body's input
and output, tied): the body reading the state is an edge out of it, and the body's next state an edge
back into it. A state is an accumulator when a path leaves it through the body's input and comes back
through the body's output, passing an Add, Sub or Sum, every vertex on the way being linear in the state
(the policy table's ``signal`` ops that are no Tensor Core op: Add, Mul by a decay, Identity, data
movement), at most :data:`MAX_STEPS` of them on either side of the sum. A state updated through an
activation (``tanh(s + x)``, an RNN cell) is bounded and not one; MatMuls reading the state stay low.

Guarantees (checked by ``ensures``): such a state's vertex and every vertex on such a path (the sum among
them) are pinned to FP32 (DENY, rule ``policy.high.loop-accumulator``) with the loop op and the sum in the
reason, unless fixed, already FP32 or forced low by the user; nothing else changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable

__all__ = ["LoopAccumulatorPass", "MAX_STEPS", "loop_accumulators"]

#: How many linear vertices a path may pass on either side of the sum (an EMA's Mul, an Identity).
MAX_STEPS = 4
_LOOPS = frozenset({"Loop", "Scan"})
_SUMS = frozenset({"Add", "Sub", "Sum"})


def _linear(vertex: Vertex) -> bool:
    policy = vertex.policy
    return (
        vertex.node is not None and vertex.node.op_type not in _LOOPS and policy is not None
        and policy.signal and not policy.tensor_core
    )


def _reach(graph: PrecisionGraph, start: int, values: set, forward: bool) -> dict[int, int]:
    """Linear vertices reached from the state ``start`` over edges carrying one of ``values`` first, then
    any edge, at most :data:`MAX_STEPS` + 1 deep: vertex -> depth."""
    digraph = graph.digraph
    first = digraph.succ[start] if forward else digraph.pred[start]
    frontier = [
        v for v, data in first.items() if v != start and any(x in values for x in data["values"])
        and _linear(graph.vertices[v])
    ]
    depth = {v: 1 for v in frontier}
    while frontier:
        nxt = []
        for u in frontier:
            if depth[u] > MAX_STEPS:
                continue
            for v in digraph.succ[u] if forward else digraph.pred[u]:
                if v not in depth and v != start and _linear(graph.vertices[v]):
                    depth[v] = depth[u] + 1
                    nxt.append(v)
        frontier = nxt
    return depth


def loop_accumulators(graph: PrecisionGraph) -> dict[int, tuple[Vertex, Vertex]]:
    """Per vertex of a loop accumulator (the state and the path through its sum): (the state, the sum)."""
    found: dict[int, tuple[Vertex, Vertex]] = {}
    for state in graph.vertices:
        if state.node is None or state.node.op_type not in _LOOPS:
            continue
        body_in = {s.value for s in state.slots if s.kind is SlotKind.GRAPH_IN}
        body_out = {s.value for s in state.slots if s.kind is SlotKind.GRAPH_OUT}
        if not body_in or not body_out:
            continue
        ahead, behind = _reach(graph, state.id, body_in, True), _reach(graph, state.id, body_out, False)
        on_cycle = [v for v in ahead if v in behind and ahead[v] + behind[v] <= 2 * MAX_STEPS + 1]
        sums = [w for v in on_cycle if (w := graph.vertices[v]).node is not None and w.node.op_type in _SUMS]
        if not sums:
            continue
        for vid in [state.id, *on_cycle]:
            found.setdefault(vid, (state, sums[0]))
    return found


@dataclasses.dataclass
class LoopAccumulatorPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.LOOP_ACCUMULATOR}))
        found = loop_accumulators(graph)
        ensure_pinned(self, graph, plan, found, "accumulates a loop-carried state")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        for vid, (state, total) in sorted(loop_accumulators(graph).items()):
            if not pinnable(plan, vid):
                continue
            plan.set_role(vid, Role.DENY, Rule.LOOP_ACCUMULATOR, _reason(state, total))


def _reason(state: Vertex, total: Vertex) -> str:
    loop = state.node.op_type if state.node is not None else "loop"
    names: Iterable[str] = (s.value.name or "" for s in state.slots if s.kind is SlotKind.GRAPH_IN and s.value)
    return (
        f"FP32: a running sum over the {loop}'s iterations (its carried state {next(iter(names), '')!r} is "
        f"added into itself by {total.describe()}), kept FP32 like CumSum: in FP16 its error grows with the "
        "number of steps (15.6% of range at 20000 steps)"
    )
