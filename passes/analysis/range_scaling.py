"""Range scaling: run in FP16, on power-of-two scaled operands, the Tensor Core ops only FP16's range keeps out.

Runs after painting, before the BF16 range fallback and cast placement, in FP16 conversions of ONNX
models with ``--range-fallback scaled`` and observed ranges (calibration data or the range probe), and
the static bounds of the graph inputs' stated ranges where there are any. A matrix product is linear in
each operand, and multiplying by a power of two is exact in binary floating point for every value that
stays a normal number: ``op(x * 2^-a, w * 2^-b) + bias * 2^-(a+b) = (op(x, w) + bias) * 2^-(a+b)``. So a
MatMul, Gemm, Conv or ConvTranspose whose operands or product overflow FP16 runs on FP16 Tensor Cores
(FP32 accumulation) with its operands shifted down, and a Mul by ``2^(a+b)`` after the Cast back to FP32
restores the product exactly. Against BF16 (the fallback where scaling cannot hold the values) it keeps
FP16's 11-bit significand: 8x finer rounding of the same Tensor Core FLOPs; against FP32 it keeps the
FLOPs on Tensor Cores, and it needs no BF16 kernel (onnxruntime's CUDA provider has none for Conv before
opset 22).

What a shift costs is at the bottom of the range: a value pushed below FP16's smallest normal (2^-14)
keeps fewer bits (a subnormal's spacing is 2^-24, its relative error up to ``2^-25 / |x|``), below
2^-25 it flushes (relative error 1). The alternative is the BF16 fallback, which costs every value
``2^-8 - 2^-11`` of relative precision against FP16. A shift k is admitted for a tensor when it costs
its non-zero values, on average, no more than that (:func:`~amp_compiler.core.measures.shift_room`, its
:attr:`~amp_compiler.core.measures.TensorRange.shift_room`: from a histogram of a sample of its
magnitudes, a constant's from all of them); what plain FP16 already loses of its smallest values, which
the underflow rules judged, does not count. The bulk is what matters, not the extremes or the energy
(both a few outliers' in a decoder with massive activations: admitting shifts by the tensor's energy
cost that decoder 7x the error, benchmarks/RESULTS.md).

Which vertices (data, never the reasons' text): those :func:`~amp_compiler.passes.analysis.range_fallback.
range_fallback_candidate` names pinned FP32 by an overflow rule (:data:`~amp_compiler.core.plan.OVERFLOW_RULES`:
a shift down would only push an underflow pin's flushed values further),
of an ONNX op whose policy ``gemm`` layout is a matmul, conv or conv_transpose with every float input an
operand or its bias, not tied to a Transpose by ``runtime.ort-transpose-matmul``, with a known
magnitude and shift room for each of its tensors (a constant's from its values, others from the
observed ranges). The shifts:

- each operand's shift brings its magnitude within FP16's largest finite value: a constant's exactly,
  an observed one's times ``margin`` (8: a value 8x beyond what was observed still fits; the catalog's
  decoder reached 2.5x its calibration samples' largest activation on a held-out sample, and the
  probe's generated inputs are not the user's) and its static bound, if any (below), and, where its
  room allows, ``2^headroom_bits`` more than the observed magnitude times ``margin``;
- the product's shift, the operands' shifts added up, brings its magnitude times ``margin`` and its
  static bound (and ``2^headroom_bits`` where the rooms allow) within it too: what it lacks goes to
  constants first (converted offline, no Mul at run time), then to activations; what its room (and the
  bias's) cannot take comes off the activations' headroom first. Every shift is within its tensor's room.

Static bounds: where the user states graph inputs' ranges (``input_ranges``, ``--input-range``), the
frontend bounds the tensors they reach (:mod:`amp_compiler.onnx.graph.intervals`) with a magnitude some
input within those ranges provably attains: what
:class:`~amp_compiler.passes.analysis.static_ranges.StaticRangePass` pins these vertices for (rule
``input-range.overflow``), and what this pass reads too (``reached``). A stated range is a guarantee,
not a sample: the observed ranges then come from the range probe's few draws within it (one row at batch
1), which say little about its ends. Scaled from the observed channel peaks alone, a tabular model's
income feature (stated up to 3e5, drawn at 12292) was only halved, and 115 of 192 held-out rows within
the stated range came out NaN (sweep Q, B); with its static bound every channel of x is shifted by 2^-3
at least, and every held-out row is finite (0.18% of range at most). A static bound needs no margin (it
is attained, not estimated), and it is the tensor's, so it holds for every channel: per channel, each
shift is at least the one the static bound needs. A static bound no shift within the tensor's room
brings within FP16 refuses the scaling: the vertex stays FP32 (or takes the BF16 fallback). The bounds
of calibration's observed input ranges (StaticRangePass reads those too) are not read here: they are the
data's own, one box for every channel, where the data's channel peaks say more (an input whose channel 0
holds 4e5 and whose others hold O(1) and tiny values would shift every channel by 2^-3, push the tiny
ones below BF16's precision, and take BF16 instead of FP16 scaled per channel).

Per channel, first: a MatMul of an activation by a constant matrix, or a Gemm of one (its bias
scaled as the product), as a decoder's projections are, whose massive activations lie in a few
channels as trained LLMs' do, is scaled per channel where the
observed channel peaks allow it
(:attr:`~amp_compiler.core.measures.TensorRange.channel_peaks`, recorded for tensors reaching 1024):
the activation's channel k by 2^-a_k and the product's channel n by 2^-c_n, each the least shift that
brings the channel's peak times ``margin``, and its tensor's static bound, within FP16, the weight's
entries by 2^(a_k - c_n), converted offline. Only the channels that hold large values are shifted, so
the others keep FP16's precision whole; what the shifted ones cost is judged as a uniform shift's is:
on average over the tensor's channels (each shifted channel's values taken to be distributed as the
tensor's), the activation and the product each at most BF16's loss against FP16; the weight's stored
values, exactly, at most that too, and none beyond FP16's range. No channel is shifted further than a uniform
shift would shift it, and most not at all: on the catalog's decoder, per channel first gives 3.457e-4
mean relative L2 over 5 held-out samples against 3.461e-4 uniform first and 3.456e-4 with the two
projections in FP32 (benchmarks/RESULTS.md); a uniform shift remains for the rest (Conv, a Gemm that
transposes its activation, two activations, every channel shifted alike).

Guarantees (checked by ``ensures``): only range-fallback candidates pinned for overflow are scaled,
and their decisions are unchanged (FP32: what their neighbours see); every scaled tensor's magnitude
(an observed one's times ``margin``) fits FP16 and its shift is within its room; every scaled tensor's
static bound fits FP16 at its least shifted channel; the product's shift is the operands' shifts added
up, the bias's too.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.measures import (
    SHIFT_BUDGET,
    TensorRange,
    binade_counts,
    mean_fp16_error,
    shift_cost,
    shift_room,
)
from amp_compiler.core.plan import OVERFLOW_RULES, PrecisionPlan, Rule, Scaling
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import is_constant
from amp_compiler.passes.analysis.base import AnalysisPass, ensure, ensure_all, require, require_roles
from amp_compiler.passes.analysis.range_fallback import range_fallback_candidate
from amp_compiler.policy import GemmKind
from amp_compiler.policy.schemas import is_onnx_domain
from amp_compiler.targets import Target

__all__ = ["FP16_MAX", "RangeScalingPass", "least_shift"]

#: FP16's largest finite value.
FP16_MAX = Target.FP16.max
_ANY_SHIFT = 1 << 10  # a tensor of zeros: every shift leaves it as it is
_SCALED_KINDS = frozenset({GemmKind.MATMUL, GemmKind.CONV, GemmKind.CONV_TRANSPOSE})


def least_shift(magnitude: float, margin: float) -> int:
    """The least k >= 0 with ``magnitude * margin * 2^-k <= FP16_MAX``."""
    if not magnitude * margin > FP16_MAX:
        return 0
    return max(0, math.ceil(math.log2(magnitude * margin / FP16_MAX)))


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """What a shift is chosen from: a tensor's largest magnitude and how far it may be shifted (``room``,
    :func:`~amp_compiler.core.measures.shift_room`)."""

    name: str
    magnitude: float
    room: int
    constant: bool
    static: float = 0.0  # what the graph inputs' stated ranges make it reach (a bound it attains; 0: none)

    def fits(self, margin: float) -> float:
        """The magnitude its shift must bring within FP16: a constant's own (its values are known), an
        observed one's times ``margin``, and at least its static bound (attained: no margin)."""
        return max(self.magnitude * (1.0 if self.constant else margin), self.static)

    @property
    def bound(self) -> int:
        """The largest shift it admits (-1: none; any, for a tensor of zeros)."""
        return _ANY_SHIFT if self.magnitude == 0 else self.room


def _constant_tensor(value: ir.Value) -> _Tensor | None:
    array = constant_array(value)
    if array is None or array.size == 0:
        return None
    a = np.abs(np.asarray(array, dtype=np.float64).ravel())
    if not np.all(np.isfinite(a)):
        return None
    nonzero = a[a > 0]
    return _Tensor(value.name or "", float(a.max()), shift_room(binade_counts(nonzero)) if nonzero.size else -1, True)


def _observed(value: ir.Value, ranges: Mapping[str, TensorRange], reached: Mapping[str, float]) -> _Tensor | None:
    r = ranges.get(value.name or "")
    static = reached.get(value.name or "", 0.0)
    if r is None or not math.isfinite(r.absmax) or not math.isfinite(static):
        return None
    return _Tensor(value.name or "", r.absmax, r.shift_room, False, static)


@dataclasses.dataclass
class RangeScalingPass(AnalysisPass):
    """FP16 on power-of-two scaled operands for the Tensor Core ops only FP16's range keeps out of FP16
    (see the module docstring)."""

    ranges: Mapping[str, TensorRange]
    # Per tensor name, the magnitude some input within the graph inputs' stated ranges provably makes it
    # reach (the frontend's static bounds, as StaticRangePass reads them, of the stated ranges alone):
    # every scaled tensor fits FP16 at it too, in every channel, whatever the observed values.
    reached: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # An observed tensor's magnitude times ``margin`` must fit (the calibration rules' margin, 2, times 4:
    # a decoder's held-out sample reached 2.5x its calibration samples' largest activation), and
    # ``headroom_bits`` more where the rooms allow.
    margin: float = 8.0
    headroom_bits: int = 4

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(set(plan.decisions) == {v.id for v in graph.vertices}, self, "painting must decide every vertex first")
        require(graph.target.dtype is ir.DataType.FLOAT16, self, "range scaling is for FP16 conversions")

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure(plan.decisions == before.decisions, self, "changed a decision: scaled vertices stay FP32 outside")
        vertices = {v.id: v for v in graph.vertices}
        new = [vertices[vid] for vid in plan.scalings.keys() - before.scalings.keys()]
        ensure_all(self, new,
                   lambda v: range_fallback_candidate(v, before) and before.role_rules[v.id][0] in OVERFLOW_RULES,
                   "is scaled, though not pinned for overflow")

        def within(v: Vertex) -> bool:
            scaling = plan.scalings[v.id]
            tensors = self._tensors(v)
            if tensors is None:
                return False
            operands, bias, out = tensors
            shifts = dict(scaling.shifts)
            if sum(shifts[i] for i in operands) != scaling.output:
                return False
            if bias is not None and shifts[bias[0]] != scaling.output:
                return False
            pairs = [(t, shifts[i]) for i, t in operands.items()] + [(out, scaling.output)]
            pairs += [(bias[1], scaling.output)] if bias is not None else []
            return all(t.fits(self.margin) * 2.0 ** -k <= FP16_MAX and 0 <= k <= t.bound for t, k in pairs)

        ensure_all(self, new, lambda v: self._statically_within(v, plan.scalings[v.id]),
                   "is scaled so that a tensor's static bound (from the graph inputs' stated ranges) exceeds FP16")
        ensure_all(self, [v for v in new if not plan.scalings[v.id].per_channel], within,
                   "is scaled beyond FP16's range or its tensors' room")
        ensure_all(self, [v for v in new if plan.scalings[v.id].per_channel],
                   lambda v: self._channel_scaling(v) == plan.scalings[v.id],
                   "is scaled per channel beyond FP16's range or its tensors' budget")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        if not isinstance(graph.model, ir.Model) or not self.ranges:
            return
        tied = {v.id for v in graph.vertices if plan.role_rules[v.id][0] is Rule.RUNTIME_TRANSPOSE_MATMUL}
        for vertex in graph.vertices:
            if not range_fallback_candidate(vertex, plan):
                continue
            if plan.role_rules[vertex.id][0] not in OVERFLOW_RULES:
                continue  # kept out for values flushing to zero: shifting down flushes more
            if tied & (set(graph.digraph.pred[vertex.id]) | set(graph.digraph.succ[vertex.id])):
                continue  # a Cast between a tied Transpose and its MatMul crashes onnxruntime
            scaling = self._channel_scaling(vertex) or self._scaling(vertex)
            if scaling is not None:
                plan.scalings[vertex.id] = scaling

    # -- the shifts --------------------------------------------------------------------------------
    def _tensors(self, vertex: Vertex) -> tuple[dict[int, _Tensor], tuple[int, _Tensor] | None, _Tensor] | None:
        """The vertex's operands by input index, its bias (index and tensor), its product; None when the
        op is no scalable product or a tensor's magnitude or shift room is unknown."""
        node = vertex.node
        layout = vertex.policy.gemm if vertex.policy is not None else None
        if not isinstance(node, ir.Node) or layout is None or layout.kind not in _SCALED_KINDS:
            return None
        if not is_onnx_domain(node.domain or "") or len(node.outputs) != 1:
            return None
        floats = {i for i, v in enumerate(node.inputs) if v is not None and v.dtype is ir.DataType.FLOAT}
        operands = {int(i) for i in layout.operands}
        bias_index = int(layout.bias) if layout.bias is not None else None
        if not floats <= operands | {bias_index} or not operands <= floats:
            return None
        found: dict[int, _Tensor] = {}
        for i in floats:
            value = node.inputs[i]
            assert value is not None
            t = _constant_tensor(value) if is_constant(value) else _observed(value, self.ranges, self.reached)
            if t is None:
                return None
            found[i] = t
        out = _observed(node.outputs[0], self.ranges, self.reached)
        if out is None:
            return None
        bias = (bias_index, found.pop(bias_index)) if bias_index in found and bias_index is not None else None
        return found, bias, out

    def _statically_within(self, vertex: Vertex, scaling: Scaling) -> bool:
        """Whether each of the vertex's tensors with a static bound fits FP16 at its least shifted value
        (per channel: its least shifted channel; the bound is the tensor's, any channel may attain it)."""
        node = vertex.node
        if not isinstance(node, ir.Node):
            return True
        channel_in = min(scaling.inputs, default=0)
        channel_out = min(scaling.outputs, default=0)
        pairs: list[tuple[ir.Value | None, int]] = [(node.outputs[0], scaling.output + channel_out)]
        for i, value in enumerate(node.inputs):
            shift = scaling.shifts.get(i, 0)
            shift += channel_in if i == 0 else channel_out if i == 2 and scaling.per_channel else 0
            pairs.append((value, shift))
        return all(value is None or self.reached.get(value.name or "", 0.0) * 2.0**-k <= FP16_MAX
                   for value, k in pairs)

    def _scaling(self, vertex: Vertex) -> Scaling | None:
        tensors = self._tensors(vertex)
        if tensors is None:
            return None
        operands, bias, out = tensors
        spare = 2.0**self.headroom_bits
        least = {i: least_shift(t.fits(self.margin), 1.0) for i, t in operands.items()}
        most = {i: t.bound for i, t in operands.items()}
        if any(least[i] > most[i] for i in operands):
            return None
        # Observed operands start with the headroom their room allows, constants with their least shift.
        shifts = {
            i: least[i] if t.constant else max(least[i], min(most[i], least_shift(t.fits(self.margin * spare), 1.0)))
            for i, t in operands.items()
        }
        top = min(out.bound, bias[1].bound) if bias is not None else out.bound
        need = least_shift(out.fits(self.margin), 1.0)
        want = max(need, min(top, least_shift(out.fits(self.margin * spare), 1.0)))
        order = sorted(operands, key=lambda i: (not operands[i].constant, i))  # constants first
        for i in order:  # up to the product's shift: constants first (converted offline), then activations
            shifts[i] += max(0, min(want - sum(shifts.values()), most[i] - shifts[i]))
        for i in reversed(order):  # down to the product's room: activations' headroom first
            shifts[i] -= max(0, min(sum(shifts.values()) - top, shifts[i] - least[i]))
        total = sum(shifts.values())
        if not need <= total <= top:
            return None
        if bias is not None:
            shifts[bias[0]] = total
        scaled = [t.fits(self.margin) * 2.0 ** -shifts[i] for i, t in operands.items()]
        scaled.append(out.fits(self.margin) * 2.0 ** -total)
        return Scaling(shifts, total, FP16_MAX / max(scaled))

    # -- per channel -------------------------------------------------------------------------------
    def _channel_scaling(self, vertex: Vertex) -> Scaling | None:
        """The per-channel scaling of a MatMul of an activation by a 2-D constant, or of a Gemm (not
        transposing its activation) with a constant B and a bias, if any, the product's channels carry too
        (see the module docstring); None where its channel peaks, its weight or its tensors' budgets
        refuse one."""
        node = vertex.node
        if not isinstance(node, ir.Node) or node.op_type not in ("MatMul", "Gemm"):
            return None
        gemm = node.op_type == "Gemm"
        trans_a: int = node.attributes.get_int("transA", 0)
        trans_b: int = node.attributes.get_int("transB", 0)
        if not is_onnx_domain(node.domain or "") or (gemm and trans_a):
            return None
        x, w = node.inputs[0], node.inputs[1]
        if x is None or w is None or is_constant(x) or not is_constant(w):
            return None
        weight = constant_array(w)
        if weight is None or weight.ndim != 2 or not np.all(np.isfinite(weight)):
            return None
        weight = np.abs(np.asarray(weight, np.float64))
        weight = weight.T if gemm and trans_b else weight  # as [K, N]
        rx, ry = self.ranges.get(x.name or ""), self.ranges.get(node.outputs[0].name or "")
        if rx is None or ry is None:
            return None
        k, n = weight.shape
        sx, sy = self.reached.get(x.name or "", 0.0), self.reached.get(node.outputs[0].name or "", 0.0)
        inputs, outputs = self._channel_shifts(rx, k, sx), self._channel_shifts(ry, n, sy)
        if inputs is None or outputs is None or (len(set(inputs)) <= 1 and len(set(outputs)) <= 1):
            return None  # refused, or one shift for every channel: the uniform scaling's (with its headroom)
        a, c = np.array(inputs, np.float64), np.array(outputs, np.float64)
        scaled = weight * np.exp2(a[:, None] - c[None, :])
        bias = node.inputs[2] if gemm and len(node.inputs) > 2 else None
        biased = self._scaled_bias(bias, c) if bias is not None else 0.0
        if biased is None or not max(float(scaled.max(initial=0.0)), biased) <= FP16_MAX:
            return None
        if weight.any() and (mean_fp16_error(binade_counts(scaled[scaled > 0]))
                             - mean_fp16_error(binade_counts(weight[weight > 0]))) > SHIFT_BUDGET:
            return None
        peaks = [max(b * self.margin, sx) * 2.0**-s for b, s in zip(self._channel_bounds(rx, k), inputs, strict=True)]
        peaks += [max(b * self.margin, sy) * 2.0**-s for b, s in zip(self._channel_bounds(ry, n), outputs, strict=True)]
        top = max([*peaks, float(scaled.max(initial=0.0)), biased])
        shifts = {0: 0, 1: 0, **({2: 0} if bias is not None else {})}
        return Scaling(shifts, 0, FP16_MAX / top if top > 0 else math.inf, tuple(inputs), tuple(outputs))

    def _scaled_bias(self, bias: ir.Value, outputs: np.ndarray) -> float | None:
        """The largest magnitude of a Gemm's bias with the product's channel shifts applied (a constant's
        exactly, an observed one's times ``margin``, or its static bound, at its least shifted channel); None
        where unknown or where it does not broadcast along the product's channels."""
        if not is_constant(bias):
            t = _observed(bias, self.ranges, self.reached)
            return None if t is None else t.fits(self.margin) * 2.0 ** -float(outputs.min())
        array = constant_array(bias)
        if array is None or not np.all(np.isfinite(array)) or (array.ndim and array.shape[-1] not in (1, outputs.size)):
            return None
        return float(np.max(np.abs(np.asarray(array, np.float64)) * np.exp2(-outputs), initial=0.0))

    @staticmethod
    def _channel_bounds(r: TensorRange, channels: int) -> list[float]:
        """Each channel's largest magnitude: its peak, or the tensor's where none were recorded."""
        return r.channel_peaks.bounds() if r.channel_peaks is not None else [r.absmax] * channels

    def _channel_shifts(self, r: TensorRange, channels: int, static: float) -> list[int] | None:
        """Each channel's least shift (the observed tensor ``r``'s last axis of ``channels``): its peak's
        times ``margin``, and at least the one its tensor's ``static`` bound needs (the bound is the
        tensor's: any channel may attain it); None where its peaks are unknown or the shifts cost more
        than the budget."""
        if not math.isfinite(r.absmax) or not math.isfinite(static):
            return None
        floor = least_shift(static, 1.0)
        if r.absmax * self.margin <= FP16_MAX:
            shifts = [floor] * channels  # no channel's observed peak needs a shift
            if not floor:
                return shifts
        else:
            peaks = r.channel_peaks
            if peaks is None or peaks.channels != channels:
                return None
            shifts = [max(floor, least_shift(bound, self.margin)) for bound in peaks.bounds()]
        if not r.binades:
            return None
        cost = sum(n * shift_cost(r.binades, s) for s, n in Counter(shifts).items() if s) / channels
        return shifts if cost <= SHIFT_BUDGET else None
