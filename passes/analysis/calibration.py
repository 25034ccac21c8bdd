"""Calibration ranges: keep in FP32 what observed values say FP16 cannot hold.

Guarantees, given per-tensor ranges observed on the FP32 model (``amp_compiler.onnx.measure.calibrate``):
- a tensor whose absmax, times ``margin``, exceeds the target's largest finite value keeps its
  producer and all its consumers FP32 (rule ``calibration.overflow``);
- a tensor whose values below FP16's smallest normal (flushed to zero, or held as subnormals with
  fewer bits) move it, against its own L2 norm, by more than ``underflow_factor`` times FP16's unit
  roundoff (2^-11, the most FP16's rounding moves any normal value) keeps its producer and consumers
  FP32 (rule ``calibration.underflow``; FP16 only: BF16 has FP32's exponent range, so neither rule can
  fire for it). A flushed value changes by less than 6e-8, FP16 rounds a value of magnitude m by up to
  m * 2^-11: how many values flush says nothing, their weight against the tensor's own scale does (a
  linear consumer scales both alike). 43% of a PP-OCRv4 recogniser's Conv output flushes and moves it
  by 4e-6 of FP16's rounding: it stays FP16;
- a tensor with any value that flushes to zero, on its way (through ops that keep zeros: Mul, Sqrt,
  data movement) to an input singular at zero (a Div's divisor, Reciprocal, Log, Pow's base with a
  negative exponent: the policy table's ``zero_singular``), keeps its producer and that path FP32
  (the same rule): one flushed value there becomes inf or NaN;
- a constant's values (an initializer, a Constant node's output: weights some exporters write as
  Constant nodes, PP-OCR's) are
  :class:`~amp_compiler.passes.analysis.constants.ConstantRangePass`' to judge, not this share (46%
  of a PP-OCRv4 recogniser's Conv weights are below 6e-8 and flush harmlessly: 4 Convs kept FP32 for
  nothing);
- fixed vertices and vertices already pinned keep their role and reason;
- on the path of an attention mask that :class:`~amp_compiler.passes.ConstantRangePass` rewrote
  (float32's lowest becomes -32768: calibration data with padding observes -3.4e38 there), observed
  values at or below half of the rewritten constant come from the mask and do not count.
``ensures`` checks both rules and that only free vertices changed, and only to DENY.

With ``generated`` the ranges come from the range probe's run on generated inputs
(:mod:`amp_compiler.onnx.measure.range_probe`), or the FX conversion's run on its example inputs
(:mod:`amp_compiler.fx.graph.ranges`): the same two rules, as ``probe.overflow`` and
``probe.underflow``, with reasons that say so (``seen``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import numpy as np

from amp_compiler.core.graph import OpView, PrecisionGraph, SlotKind, SlotView, Vertex
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.constants import mask_paths
from amp_compiler.targets import Target

__all__ = ["CalibrationRangePass", "observed_magnitude"]

_PINNABLE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})
#: FP16's unit roundoff: the most its rounding moves a normal value, relative to the value.
FP16_UNIT_ROUNDOFF = 2.0**-11


def _constant(value) -> bool:
    """An initializer or a Constant node's output: its flush is :class:`~amp_compiler.passes.analysis.
    constants.ConstantRangePass`' to judge (against what the node computes), not a share of it."""
    # An FX graph's activations (FxValue) have neither: they are never constants here.
    producer = value.producer() if hasattr(value, "producer") else None
    return getattr(value, "const_value", None) is not None or (producer is not None and producer.op_type == "Constant")


def observed_magnitude(r: TensorRange, mask_floor: float | None) -> float:
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
    # A tensor's underflow pins when it moves the tensor by more than this many FP16 unit roundoffs
    # (relative L2): 1, the error FP16's rounding alone can reach. On the catalog (range probe) the
    # largest underflow error is 0.0044 of it (a CTC head's 18k-class softmax); a tensor whose values
    # all flush is 2048 of it (docs/converting.md).
    underflow_factor: float = 1.0
    generated: bool = False  # the ranges come from generated inputs (the range probe), not data
    # What the ranges were seen on, as reasons name it (default: the calibration data, or the probe's
    # generated inputs): the FX conversion's "the example inputs", "3 calibration samples".
    seen: str = ""

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
                observed_magnitude(r, masks.get(vertex.id)) * self.margin <= self.target.max
                for s in vertex.slots
                if s.value is not None and s.value.name and (r := self.ranges.get(s.value.name)) is not None
            )

        ensure_all(self, graph.vertices, within_range, "is left free with a tensor beyond the target's range")

        def underflow_held(vertex: Vertex) -> bool:
            return plan.roles[vertex.id] not in _PINNABLE or self.target is not Target.FP16 or not any(
                self._moves(r) and not _constant(s.value)
                for s in vertex.slots
                if s.value is not None and s.value.name and (r := self.ranges.get(s.value.name)) is not None
            )

        ensure_all(self, graph.vertices, underflow_held, "is left free with a tensor FP16's underflow moves")
        on_ways = [v for *_, vertices, _ in self._singular_ways(graph) for v in vertices]
        ensure_all(self, on_ways, lambda v: plan.roles[v.id] not in _PINNABLE,
                   "is left free on a flushed value's way to an input singular at zero")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        name = self.target.value.upper()
        masks = mask_paths(graph, plan)
        overflow, underflow = self.rules
        seen = self.seen or ("generated inputs (the range probe)" if self.generated else "the calibration data")
        for vertex in graph.vertices:
            if plan.roles[vertex.id] in (Role.FIXED, Role.DENY):
                continue
            for slot in vertex.slots:
                value = slot.value
                r = self.ranges.get(value.name) if value is not None else None
                if r is None:
                    continue
                where = "input" if slot.kind in (SlotKind.NODE_IN, SlotKind.GRAPH_OUT) else "output"
                magnitude = observed_magnitude(r, masks.get(vertex.id))
                if magnitude * self.margin > self.target.max:
                    plan.set_role(
                        vertex.id, Role.DENY, overflow,
                        f"HIGH: {where} {value.name!r} reaches |x| = {magnitude:.3g} on {seen}, beyond "
                        f"{name}'s range ({self.target.max:g}) with a {self.margin:g}x margin",
                    )
                    break
                if self.target is Target.FP16 and self._moves(r) and not _constant(value):
                    plan.set_role(
                        vertex.id, Role.DENY, underflow,
                        f"HIGH: on {seen}, FP16 would flush {r.underflow_share:.0%} of the non-zero values of "
                        f"{where} {value.name!r} (or hold them as subnormals), moving it by "
                        f"{r.underflow_error:.2g} of its L2 norm, {r.underflow_error / FP16_UNIT_ROUNDOFF:.3g}x "
                        f"FP16's own rounding ({FP16_UNIT_ROUNDOFF:.2g}): FP32 saves that error",
                    )
                    break
        if self.target is Target.FP16:
            self._pin_singular(graph, plan, underflow, seen)

    def _moves(self, r: TensorRange) -> bool:
        """True when ``r``'s values below FP16's normal range move it by more than its rounding does."""
        return r.underflow_error > self.underflow_factor * FP16_UNIT_ROUNDOFF

    def _pin_singular(self, graph: PrecisionGraph, plan: PrecisionPlan, rule: Rule, seen: str) -> None:
        """Pin the producer of each tensor with a value FP16 flushes to zero, and the vertices on its
        way through ops that keep zeros to an input singular at zero, with the singular input named."""
        for name, r, vertices, sink in self._singular_ways(graph):
            reason = (
                f"HIGH: on {seen}, FP16 would flush {r.underflow_share:.0%} of the non-zero values of "
                f"{name!r} to zero, and {sink} is singular at zero: FP32 saves an inf or NaN for each "
                "flushed value"
            )
            for vertex in vertices:
                if plan.roles[vertex.id] in _PINNABLE:
                    plan.set_role(vertex.id, Role.DENY, rule, reason)

    def _singular_ways(self, graph: PrecisionGraph) -> Iterator[tuple[str, TensorRange, list[Vertex], str]]:
        """Each non-constant tensor with a value FP16 flushes (whose flush does not move it beyond
        FP16's rounding: :meth:`_moves` pins every vertex of those) that reaches an input singular at
        zero: its name, range, producer and the vertices on its way, and that input described."""
        if self.target is not Target.FP16:
            return
        slots = _slots_by_value(graph)
        for name, users in slots.items():
            r = self.ranges.get(name)
            if r is None or r.underflow_share <= 0 or self._moves(r):
                continue
            value = users[0][1].value
            if value is None or _constant(value):
                continue
            path = _singular_path(graph, slots, name)
            if path is not None:
                vertices, sink = path
                yield name, r, [*(v for v, s in users if s.defines), *vertices], sink


def _slots_by_value(graph: PrecisionGraph) -> dict[str, list[tuple[Vertex, SlotView]]]:
    """Every named tensor's slots, each with its vertex."""
    out: dict[str, list[tuple[Vertex, SlotView]]] = {}
    for vertex in graph.vertices:
        for slot in vertex.slots:
            if slot.value is not None and slot.value.name:
                out.setdefault(slot.value.name, []).append((vertex, slot))
    return out


def _singular_path(
    graph: PrecisionGraph, slots: Mapping[str, list[tuple[Vertex, SlotView]]], name: str
) -> tuple[list[Vertex], str] | None:
    """The vertices on the ways from the tensor ``name`` through ops that keep zeros (the policy's
    ``keeps_zeros``) to an input singular at zero (``zero_singular``), and the first such input
    described; None when no way reaches one."""
    sinks: list[tuple[Vertex, str]] = []
    carriers: list[tuple[Vertex, list[str]]] = []  # a vertex that keeps zeros, and the tensors it makes
    stack, seen = [name], {name}
    while stack:
        for vertex, slot in slots.get(stack.pop(), []):
            policy, node = vertex.policy, vertex.node
            if slot.kind is not SlotKind.NODE_IN or node is None or policy is None:
                continue
            if slot.index in policy.zero_singular and _singular_exponent(node):
                sinks.append((vertex, f"input {slot.index} of {vertex.describe()}"))
            elif policy.keeps_zeros:
                made = [out.value.name for vid in graph.node_vertices.get(node, ()) for out in graph.vertices[vid].slots
                        if out.kind is SlotKind.NODE_OUT and out.value is not None and out.value.name]
                carriers.append((vertex, made))
                stack.extend(n for n in made if n not in seen)
                seen.update(made)
    if not sinks:
        return None
    # the tensors from which a sink is reached (through carriers), to a fixed point
    consumers_of = {v.id: {s.value.name for s in v.slots if s.kind is SlotKind.NODE_IN and s.value is not None}
                    for v, _ in [*sinks, *carriers]}
    reaching = set().union(*(consumers_of[v.id] for v, _ in sinks))
    kept = [v for v, _ in sinks]
    changed = True
    while changed:
        changed = False
        for vertex, made in carriers:
            if vertex not in kept and reaching.intersection(made):
                kept.append(vertex)
                reaching |= consumers_of[vertex.id]
                changed = True
    return kept, sinks[0][1]


def _singular_exponent(node: OpView) -> bool:
    """False for a Pow whose exponent is a constant with no negative value (zero to it is finite)."""
    if node.op_type != "Pow" or len(node.inputs) < 2 or node.inputs[1] is None:
        return True
    const = getattr(node.inputs[1], "const_value", None)
    if const is None:
        return True
    return bool((np.asarray(const.numpy()) < 0).any())
