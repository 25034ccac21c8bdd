"""Static ranges: keep FP32 what provably overflows the target for the graph inputs' known ranges.

The frontend bounds every tensor it can from the ranges of the graph inputs (stated by the user, or
observed in calibration data; :mod:`amp_compiler.onnx.graph.intervals`) and gives, per tensor name, a
magnitude that some input within those ranges provably makes it reach. An STFT as a convolution
over audio at int16 scale reaches 2e6 (FP16's largest value is 65504) and its power 4e12: both are
certain to overflow for loud enough input, whatever calibration samples happened to contain.

Guarantees (checked by ``ensures``): every free vertex with a slot whose tensor provably exceeds the
target's largest finite value is pinned to FP32 (DENY, rule ``input-range.overflow``) with the
tensor and its magnitude in the reason; fixed and already pinned vertices keep theirs; vertices on a
rewritten attention mask's path are left to the mask rule (their bounds hold float32's lowest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.constants import mask_paths
from amp_compiler.targets import Target

__all__ = ["StaticRangePass"]

_PINNABLE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})


@dataclasses.dataclass
class StaticRangePass(AnalysisPass):
    reached: Mapping[str, float]  # tensor name -> a magnitude some input within the ranges makes it reach
    target: Target

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure_only_pinned(self, graph, plan, before, _PINNABLE, Role.DENY, frozenset({Rule.RANGE_OVERFLOW}))
        masks = mask_paths(graph, plan)
        ensure_all(
            self, graph.vertices,
            lambda v: plan.roles[v.id] not in _PINNABLE or v.id in masks or self._overflow(v) is None,
            f"is left free with a tensor that provably exceeds {self.target.value}'s range",
        )

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        masks = mask_paths(graph, plan)
        name = self.target.value.upper()
        for vertex in graph.vertices:
            if plan.roles[vertex.id] not in _PINNABLE or vertex.id in masks:
                continue
            found = self._overflow(vertex)
            if found is not None:
                where, tensor, magnitude = found
                plan.set_role(
                    vertex.id, Role.DENY, Rule.RANGE_OVERFLOW,
                    f"FP32: {where} {tensor!r} reaches |x| = {magnitude:.3g} for some input within the graph "
                    f"inputs' ranges (a static bound it attains), beyond {name}'s range ({self.target.max:g})",
                )

    def _overflow(self, vertex: Vertex) -> tuple[str, str, float] | None:
        for slot in vertex.slots:
            value = slot.value
            name = value.name if value is not None else None
            magnitude = self.reached.get(name) if name else None
            if name and magnitude is not None and magnitude > self.target.max:
                where = "input" if slot.kind in (SlotKind.NODE_IN, SlotKind.GRAPH_OUT) else "output"
                return where, name, magnitude
        return None
