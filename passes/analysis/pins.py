"""Tolerance choices: the nodes ``--tolerance`` decided stay as it measured them, FP32 or low precision.

Runs right after classification. The ``--tolerance`` refinement (:mod:`amp_compiler.onnx.tolerance.refine`)
measures, on a switched probe of the plain conversion, what each *unit* (a Tensor Core op and the
cheap ops it feeds, :mod:`amp_compiler.onnx.tolerance.units`) adds at the outputs, and chooses which
units stay low. The conversion it then makes must be the configuration it measured:

- a free vertex (ALLOW, INFER or CLEAR) of a pinned node becomes FIXED at its FP32 dtype (rule
  ``tolerance.pinned``). FIXED, not DENY: DENY marks a numeric hazard, which painting spreads forward
  through the FOLLOW ops downstream, so pinning one MatMul of a transformer would take the whole
  residual stream after it to FP32;
- a free vertex of a node kept low becomes ALLOW (rule ``tolerance.kept-low``): painting would
  otherwise send a cheap op between two pinned nodes back to FP32 (PP-OCRv4's recogniser: 111 nodes
  the probe measured low went FP32, and the result landed at half its tolerance).

User blocks come first (a blocked node is DENY already and keeps that rule), so do user allows (a
node forced low keeps ``user.allow``; the refinement never offers one as a unit), and the passes
after this one still keep FP32 what ranges rule out (unrepresentable constants, observed overflow).

Guarantees (checked by ``ensures``): only free vertices of pinned or kept nodes change, to FIXED
with ``tolerance.pinned`` or to ALLOW with ``tolerance.kept-low``, with the refinement's reason;
every free vertex of such a node changes, except those the user forced low.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, require, require_roles
from amp_compiler.passes.analysis.classify import user_allowed

__all__ = ["TolerancePinPass"]

_FREE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})


@dataclasses.dataclass
class TolerancePinPass(AnalysisPass):
    pinned: Mapping[Hashable, str] = dataclasses.field(default_factory=dict)  # op -> why (FP32)
    kept: Mapping[Hashable, str] = dataclasses.field(default_factory=dict)  # op -> why (low precision)

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(not set(self.pinned) & set(self.kept), self, "a node is both pinned and kept low")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        for vertex in graph.vertices:
            choice = self._choice(vertex)
            if choice is not None and plan.roles[vertex.id] in _FREE and not user_allowed(plan, vertex.id):
                role, rule, why = choice
                plan.set_role(vertex.id, role, rule, why)

    def _choice(self, vertex: Vertex) -> tuple[Role, Rule, str] | None:
        if vertex.node is None:
            return None
        if vertex.node in self.pinned:
            return Role.FIXED, Rule.TOLERANCE_PINNED, f"FP32: {self.pinned[vertex.node]}"
        if vertex.node in self.kept:
            return Role.ALLOW, Rule.TOLERANCE_KEPT, f"low precision: {self.kept[vertex.node]}"
        return None

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        def as_chosen(vertex: Vertex) -> bool:
            choice = self._choice(vertex)
            if choice is None or before.roles[vertex.id] not in _FREE or user_allowed(before, vertex.id):
                return plan.roles[vertex.id] is before.roles[vertex.id] and (
                    plan.role_rules[vertex.id] == before.role_rules[vertex.id])
            role, rule, _ = choice
            return plan.roles[vertex.id] is role and plan.role_rules[vertex.id][0] is rule

        ensure_all(self, graph.vertices, as_chosen, "does not have the role --tolerance chose for it")
