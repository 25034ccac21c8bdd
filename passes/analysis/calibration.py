"""Calibration ranges: keep in FP32 what observed values say FP16 cannot hold.

Guarantees, given per-tensor ranges observed on the FP32 model (``amp_compiler.onnx.measure.calibrate``):
- a tensor whose absmax, times ``margin``, exceeds the target's largest finite value keeps its
  producer and all its consumers FP32 (rule ``calibration.overflow``);
- a tensor more than ``max_underflow_share`` of whose non-zero values would flush to zero in FP16
  keeps its producer and consumers FP32 (rule ``calibration.underflow``; FP16 only: BF16 has FP32's
  exponent range, so neither rule can fire for it); a constant's values (an initializer, a Constant
  node's output: weights some exporters write as Constant nodes, PP-OCR's) are
  :class:`~amp_compiler.passes.analysis.constants.ConstantRangePass`' to judge, not this share (46%
  of a PP-OCRv4 recogniser's Conv weights are below 6e-8 and flush harmlessly: 4 Convs kept FP32 for
  nothing);
- fixed vertices and vertices already pinned keep their role and reason;
- on the path of an attention mask that :class:`~amp_compiler.passes.ConstantRangePass` rewrote
  (float32's lowest becomes -32768: calibration data with padding observes -3.4e38 there), observed
  values at or below half of the rewritten constant come from the mask and do not count.
``ensures`` checks the overflow rule and that only free vertices changed, and only to DENY.

With ``generated`` the ranges come from the range probe's run on generated inputs
(:mod:`amp_compiler.onnx.measure.range_probe`): the same two rules, as ``probe.overflow`` and
``probe.underflow``, with reasons that say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.constants import mask_paths
from amp_compiler.targets import Target

__all__ = ["CalibrationRangePass"]

_PINNABLE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})


def _constant(value) -> bool:
    """An initializer or a Constant node's output: its flush is :class:`~amp_compiler.passes.analysis.
    constants.ConstantRangePass`' to judge (against what the node computes), not a share of it."""
    producer = value.producer()
    return value.const_value is not None or (producer is not None and producer.op_type == "Constant")


def _magnitude(r: TensorRange, mask_floor: float | None) -> float:
    """The observed magnitude that counts: on a rewritten mask's path (``mask_floor``: the most
    negative constant rewritten), values at or below half of it are the mask's and do not."""
    if mask_floor is not None and r.min <= mask_floor / 2:
        return max(abs(r.max), 0.0)
    return r.absmax


@dataclasses.dataclass
class CalibrationRangePass(AnalysisPass):
    ranges: Mapping[str, TensorRange]
    target: Target
    margin: float = 2.0
    max_underflow_share: float = 0.25
    generated: bool = False  # the ranges come from generated inputs (the range probe), not data

    @property
    def rules(self) -> tuple[Rule, Rule]:
        """The (overflow, underflow) rule ids this pass decides with."""
        if self.generated:
            return Rule.PROBE_OVERFLOW, Rule.PROBE_UNDERFLOW
        return Rule.CALIBRATION_OVERFLOW, Rule.CALIBRATION_UNDERFLOW

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        rules = frozenset(self.rules)
        ensure_only_pinned(self, graph, plan, before, _PINNABLE, Role.DENY, rules)
        masks = mask_paths(graph, plan)

        def within_range(vertex: Vertex) -> bool:
            return plan.roles[vertex.id] not in _PINNABLE or all(
                _magnitude(r, masks.get(vertex.id)) * self.margin <= self.target.max
                for s in vertex.slots
                if s.value is not None and s.value.name and (r := self.ranges.get(s.value.name)) is not None
            )

        ensure_all(self, graph.vertices, within_range, "is left free with a tensor beyond the target's range")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        name = self.target.value.upper()
        masks = mask_paths(graph, plan)
        overflow, underflow = self.rules
        seen = "generated inputs (the range probe)" if self.generated else "the calibration data"
        for vertex in graph.vertices:
            if plan.roles[vertex.id] in (Role.FIXED, Role.DENY):
                continue
            for slot in vertex.slots:
                value = slot.value
                r = self.ranges.get(value.name) if value is not None else None
                if r is None:
                    continue
                where = "input" if slot.kind in (SlotKind.NODE_IN, SlotKind.GRAPH_OUT) else "output"
                magnitude = _magnitude(r, masks.get(vertex.id))
                if magnitude * self.margin > self.target.max:
                    plan.set_role(
                        vertex.id, Role.DENY, overflow,
                        f"HIGH: {where} {value.name!r} reaches |x| = {magnitude:.3g} on {seen}, beyond "
                        f"{name}'s range ({self.target.max:g}) with a {self.margin:g}x margin",
                    )
                    break
                if self.target is Target.FP16 and r.underflow_share > self.max_underflow_share and not _constant(value):
                    plan.set_role(
                        vertex.id, Role.DENY, underflow,
                        f"HIGH: {r.underflow_share:.0%} of the non-zero values of {where} "
                        f"{value.name!r} would flush to zero in FP16 on {seen}",
                    )
                    break
