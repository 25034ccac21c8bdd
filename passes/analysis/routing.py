"""Routing scores: keep FP32 what computes the scores a selection picks the computation to run from.

A mixture-of-experts layer scores every expert per token (``logits = hidden @ W_router``, N = the number
of experts), normalises the scores (Softmax, Sigmoid, a bias Add such as DeepSeek's
``e_score_correction_bias``), and a TopK picks k experts whose indices drive OneHot, Gather or Scatter:
which experts run for the token. A TopK's or an ArgMax's indices (the policy table's ``selects``) are
exact for the values they read but not for the precision those were computed in: router probabilities
sit near 1/E, where FP16's step (2.4e-4 at 0.25) is coarser than the gap between two experts, so
two of them round to one value, tie exactly, and the lower index wins. The token then runs another
expert, and its output moves by the whole difference of two experts' outputs. Measured under exact
emulation with every router op painted or placed FP16 (Softmax by min-cut cast placement, gpt-oss's
TopK by painting): tiny Qwen3-MoE 2 of 576 expert choices changed, 2.07% of the logits' range (the probe
stated 0.03%), OLMoE 3 of 576 (2.11%), gpt-oss 1 of 576 (6.89%), DBRX 3 of 576 (3.65%); a 9-node
router over 64 experts changed 32 of 4096 tokens' experts.

So where a selection's indices reach an index input inside the graph (the policy's ``index_inputs``:
Gather's indices, OneHot's, a Scatter's, or an Equal building a mask; found by the frontend,
:attr:`~amp_compiler.core.graph.PrecisionGraph.index_readers`), the selection's own vertex and the chain
of ops that carry its scores (the policy's ``scores``: Softmax, Sigmoid, Add, Div, Cast, reshapes,
ReduceSum/TopK of group scores), walked upstream at most :data:`MAX_CHAIN` ops, stay FP32 (DENY, rule
``routing.score``), and so does the product at the head of that chain when it is a matmul (MatMul,
Gemm) of at most :data:`MAX_CHOICES` output columns, the router. A classifier's ArgMax written only to a
graph output routes nothing: its labels are measured and reported, not pinned.

Why :data:`MAX_CHOICES` = 256: a router's columns are its experts (Mixtral 8, DBRX 16, gpt-oss 32/128,
OLMoE 64, Qwen3-MoE 128, DeepSeek-V3 256). Its product costs 2·H·E FLOPs per token against the k experts'
2·k·3·H·ffn, a share of E / (3·k·ffn): 1e-4 for Mixtral (E 8, k 2, ffn 14336), 7e-3 for Qwen3-MoE
(128, 8, 768), 5e-3 for DeepSeek-V3 (256, 8, 2048), so FP32 there is noise in the model's FLOPs. A
vocabulary-sized product (an LM head feeding an in-graph TopK sampler, N in the thousands) is a large
share of a model's FLOPs and is left to the other rules; the chain after it still stays FP32. Without
the router product in FP32, its FP16 rounding alone changed 11 of 4096 tokens' experts in the 64-expert
router (1 of 4096 with 4 experts); with it, 0.

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``) or another pass fixed it, is DENY with ``routing.score``; nothing else changes.
"""

from __future__ import annotations

import dataclasses

from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.policy import GemmKind

__all__ = ["MAX_CHAIN", "MAX_CHOICES", "RoutingScorePass", "Route", "routing_scores"]

# The most output columns (choices) a matmul heading a routing chain may have to be kept FP32 with it: the
# largest routers have 256 experts; vocabulary-sized products (thousands) are not routers (module docstring).
MAX_CHOICES = 256
# The most ops walked upstream from a selection: routers measured have at most five between the product
# and the selection (DeepSeek-V3: Sigmoid, bias Add, Reshape, TopK of groups, ReduceSum); the bound keeps a
# selection without a product nearby from walking back through a residual stream.
MAX_CHAIN = 8


@dataclasses.dataclass(frozen=True)
class Route:
    """Why a vertex computes routing scores: the selection (TopK, ArgMax) whose input it computes, the op
    reading the selection's indices, and, for a product, its number of columns (0 for other ops)."""

    selection: object
    reader: object
    columns: int = 0


def _op_name(op: object) -> str:
    return f"{getattr(op, 'op_type', '?')} node {getattr(op, 'name', None)!r}"


def _columns(vertex: Vertex) -> int | None:
    """The static last dim of a matmul's result (its choices), else None."""
    policy = vertex.policy
    if policy is None or policy.gemm is None or policy.gemm.kind is not GemmKind.MATMUL:
        return None
    for slot in vertex.slots:
        if slot.kind is SlotKind.NODE_OUT and slot.value is not None and slot.value.shape is not None:
            shape = slot.value.shape
            dim = shape[len(shape) - 1] if len(shape) else None
            return dim if isinstance(dim, int) else None
    return None


def routing_scores(graph: PrecisionGraph) -> dict[int, Route]:
    """Per free vertex computing what a routing selection reads (its own vertex, the ``scores`` chain into
    it, a router matmul of at most :data:`MAX_CHOICES` columns at its head): why."""
    found: dict[int, Route] = {}
    pred, vertices, node_vertices = graph.digraph.pred, graph.vertices, graph.node_vertices
    for selection, (reader, _) in graph.index_readers.items():
        seen: set[int] = set()
        stack = [(vid, 0) for vid in node_vertices.get(selection, ())]
        while stack:
            vid, depth = stack.pop()
            if vid in seen:
                continue
            seen.add(vid)
            vertex = vertices[vid]
            node, policy = vertex.node, vertex.policy
            if node is None or policy is None:
                continue  # a graph input: nothing computes it here
            if policy.tensor_core:
                columns = _columns(vertex)
                if columns is not None and columns <= MAX_CHOICES and vertex.free:
                    found.setdefault(vid, Route(selection, reader, columns))
                continue  # the chain's head: what the product reads is the model's, not the router's
            if not (policy.scores or node is selection) or depth > MAX_CHAIN:
                continue
            if vertex.free:
                found.setdefault(vid, Route(selection, reader))
            for own in node_vertices.get(node, ()):  # a Cast's input is a vertex of its own
                stack.append((own, depth))
                stack.extend((up, depth + 1) for up in pred[own])
    return found


@dataclasses.dataclass
class RoutingScorePass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        found = routing_scores(graph)

        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.ROUTING_SCORE}), found)
        ensure_pinned(self, graph, plan, found, "computes the scores of a selection whose indices route")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        for vid, route in sorted(routing_scores(graph).items()):
            if not pinnable(plan, vid):
                continue
            policy = next((graph.vertices[v].policy for v in graph.node_vertices.get(route.selection, ())), None)
            why = policy.selects if policy is not None else ""
            cost = (f"; a product of {route.columns} columns (one per choice), a small share of the FLOPs"
                    if route.columns else "")
            plan.set_role(vid, Role.DENY, Rule.ROUTING_SCORE,
                          f"FP32: it computes the scores {_op_name(route.selection)} selects from, and "
                          f"{_op_name(route.reader)} reads the indices (they pick which computation runs, as "
                          f"a mixture-of-experts router picks experts): {why}{cost}")
