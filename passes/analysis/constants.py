"""Constant ranges: keep in FP32 every vertex that reads a constant the target cannot represent.

Guarantees: no initializer or Constant value is clamped or flushed silently. A vertex that reads a
constant with a finite value beyond the target's range (it would become inf), or with non-zero values
that would flush to zero (a ``Clip(1e-9, ...)`` bound, an epsilon), is pinned to FP32 (DENY) with the
offending values in its reason. Infinities are representable and convert exactly. ``ensures`` checks
that only free vertices changed, to DENY, and that no vertex left free reads a constant that a plain
conversion makes infinite (attention masks rewritten as below aside).

One exception, stated in the decision: a large negative constant (float32's lowest, -3.4e38, or
-1e9) that only feeds an additive attention mask into a Softmax stands for -infinity. Pinning it
would keep every attention block in FP32; converting it to -inf gives NaN on fully masked rows. It
becomes ``MASK_LOWEST`` (-32768, exact in FP16 and BF16): masked weights still come out exactly 0 on every
row that keeps a key. A fully masked row (a padding query) is uniform in FP32, where the scores vanish
beside -3.4e38; at -32768, FP16's spacing is 32 and scores of magnitude 16 or more survive the rounding,
so such a row differs (18-38% of the output's range measured on padded batches, its output unused).

Flushing matters only where it changes the tensor beyond FP16's own relative precision: the rule
fires when a flushed value is at least ``significant`` (2^-10) of the tensor's largest magnitude (an
epsilon, a clip bound, a scale: the tensor is all tiny values), or when the flushed values carry more
than ``significant`` of the tensor's L2 norm. Tiny leftovers in a weight or bias tensor (a bias of
1.8e-37 next to values of 0.1) flush harmlessly and do not pin.

What the node computes decides too. A bias added by a Conv, ConvTranspose or Gemm (its third input)
or a BatchNormalization (its bias) moves each output value by the flushed value itself, less
than FP16's smallest subnormal (6e-8): below FP16's own rounding of any output of magnitude 2^-13
(1.2e-4) or more. Such a flush pins only when the output, per channel, is smaller than that: its scale
is the observed range of the node's output when calibration or the range probe observed it, else the
largest weight of the channel (Conv/Gemm: the output for inputs of unit scale) or the BatchNorm's
scale. A bias of 3e-10 (a BatchNorm folded into a Conv, mean and shift near zero) is not an epsilon:
the Conv stays FP16 and the flush is noted on it. An epsilon added under a Sqrt, a Div or a Log, and a
Clip bound, keep the tensor-relative test above (they decide what happens near zero).

A quantization scale (the policy's ``scale_inputs``: a weight-only DequantizeLinear's ``x_scale``) is a
factor of every value it dequantizes, judged value by value (:mod:`.scale_factors`): a value the target
holds only as a subnormal (FP16: below 6.1e-5) rounds by more than the target's own 2^-11, and pins
its reader FP32 (``constant.underflow``) even where nothing flushes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.onnx.ir.constants import SCREEN_BYTES, constant_array, raw_float32_bytes
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.scale_factors import scale_constants, scale_verdict
from amp_compiler.targets import Target

__all__ = ["ConstantRangePass", "mask_paths", "range_stats"]

MASK_LOWEST = -32768.0
# Ops an additive mask passes through on its way to the Softmax, and the ops it must end in.
MASK_PATH_OPS = frozenset(
    {"Where", "Add", "Sub", "Mul", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Cast", "Concat",
     "Slice", "Transpose", "Tile", "Identity", "Max", "Min"}
)
MASK_SINK_OPS = frozenset({"Softmax", "LogSoftmax"})


def feeds_only_softmax(graph: PrecisionGraph, start: Vertex) -> bool:
    """True when every path from ``start`` runs through mask-building ops into a Softmax."""
    seen, stack, reached = {start.id}, [start.id], False
    while stack:
        vertex = graph.vertices[stack.pop()]
        op = vertex.node.op_type if vertex.node is not None else None
        if op in MASK_SINK_OPS and vertex is not start:
            reached = True
            continue
        if op not in MASK_PATH_OPS:
            return False
        succ = graph.digraph.succ[vertex.id]
        if not succ:
            return False  # the mask goes nowhere but a graph output
        for w in succ:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return reached


def mask_paths(graph: PrecisionGraph, plan: PrecisionPlan) -> dict[int, float]:
    """The vertices an attention mask rewritten by :class:`ConstantRangePass` flows through, from the
    vertices that read the rewritten constant, through mask-building ops, to the Softmax (included:
    it reads the masked scores), each with the most negative value rewritten (observed values at or
    below half of it come from the mask, and become ``MASK_LOWEST`` multiples in the output model)."""
    floor: dict[int, float] = {}
    for vertex in graph.vertices:
        rewritten = [
            float(np.min(array)) for c in vertex.constants
            if c in plan.constant_rewrites and (array := constant_array(c)) is not None
        ]
        if not rewritten:
            continue
        lowest = min(rewritten)
        stack = [vertex.id]
        while stack:
            vid = stack.pop()
            if floor.get(vid, 0.0) <= lowest:
                continue
            floor[vid] = lowest
            v = graph.vertices[vid]
            if v.node is not None and v.node.op_type in MASK_SINK_OPS:
                continue
            stack.extend(w for w in graph.digraph.succ[vid])
    return floor


#: Values per FP32 dot product in :func:`_norm_at_least` (a sum of this many positive terms in FP32
#: rounds down by at most this many ulps: 6%).
_NORM_CHUNK = 1 << 20


def _norm_at_least(flat: np.ndarray) -> float:
    """A lower bound of the L2 norm of an FP32 vector: FP32 dot products of chunks (fast, no copy)
    summed in FP64, each taken as 90% of itself (a sum of n positive FP32 terms rounds down by at most
    n ulps, 6% for a chunk). A chunk whose squares pass FP32's range gives inf (its norm is past 1.8e19:
    the constant overflows FP16 by far, which the overflow rule judges), without numpy's warning."""
    total = 0.0
    with np.errstate(over="ignore"):
        for start in range(0, flat.size, _NORM_CHUNK):
            chunk = flat[start:start + _NORM_CHUNK]
            total += 0.9 * float(np.dot(chunk, chunk))
    return math.sqrt(total)


#: The bits of an FP32 value but its sign.
_MAGNITUDE = np.uint32(0x7FFFFFFF)


@dataclasses.dataclass(frozen=True)
class RangeStats:
    size: int
    overflow: int  # finite values that become inf
    overflow_max: float  # the largest of them (negative when all overflow downwards)
    flushed: int  # non-zero values that become zero
    flushed_max: float  # the largest |x| among them
    flushed_norm_share: float  # L2 norm of the flushed values / L2 norm of the tensor
    nonzero: int
    absmax: float
    min_nonzero_abs: float


def range_stats(array: np.ndarray, target: Target) -> RangeStats:
    arr = np.asarray(array, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore"):
        low = arr.astype(target.numpy_dtype).astype(np.float32)
    finite = np.isfinite(arr)
    nonzero = arr != 0
    absval = np.abs(arr[finite & nonzero])
    over = finite & ~np.isfinite(low)
    flushed = nonzero & (low == 0)
    norm = float(np.linalg.norm(arr[finite].astype(np.float64)))
    return RangeStats(
        size=int(arr.size),
        overflow=int(np.count_nonzero(over)),
        overflow_max=float(arr[over].max()) if over.any() else 0.0,
        flushed=int(np.count_nonzero(flushed)),
        flushed_max=float(np.abs(arr[flushed]).max()) if flushed.any() else 0.0,
        flushed_norm_share=float(np.linalg.norm(arr[flushed].astype(np.float64))) / norm if norm > 0 else 0.0,
        nonzero=int(np.count_nonzero(nonzero)),
        absmax=float(absval.max()) if absval.size else 0.0,
        min_nonzero_abs=float(absval.min()) if absval.size else 0.0,
    )


_PINNABLE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})
#: Inputs that a node adds to its output (a bias), by op: a flush there moves the output by the flushed value.
_ADDITIVE_SLOTS: dict[str, tuple[int, ...]] = {
    "Conv": (2,), "ConvTranspose": (2,), "Gemm": (2,), "BatchNormalization": (2,),
}


def overflows(value: ir.Value, target: Target) -> bool:
    """True when an FP32 constant holds a finite value that becomes infinite in ``target``: a plain
    conversion, the check :class:`ConstantRangePass` is held to."""
    array = constant_array(value) if value.dtype is ir.DataType.FLOAT else None
    if array is None:
        return False
    array = np.asarray(array, dtype=np.float32)
    with np.errstate(over="ignore"):
        return bool((np.isfinite(array) & ~np.isfinite(array.astype(target.numpy_dtype))).any())


@dataclasses.dataclass
class ConstantRangePass(AnalysisPass):
    target: Target
    significant: float = 2.0**-10
    # Observed ranges (calibration's or the range probe's) by tensor name: a node's output scale.
    ranges: Mapping[str, TensorRange] | None = None

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        rules = frozenset({Rule.CONSTANT_OVERFLOW, Rule.CONSTANT_UNDERFLOW})
        ensure_only_pinned(self, graph, plan, before, _PINNABLE, Role.DENY, rules)
        verdicts: dict[int, bool] = {}

        def unrepresentable(value: ir.Value) -> bool:
            key = id(value)
            if key not in verdicts:
                verdicts[key] = value not in plan.constant_rewrites and overflows(value, self.target)
            return verdicts[key]

        ensure_all(
            self, graph.vertices,
            lambda v: plan.roles[v.id] not in _PINNABLE or not any(map(unrepresentable, v.constants)),
            f"is left free while it reads a constant beyond {self.target.value}'s range",
        )
        ensure_all(
            self, graph.vertices, lambda v: plan.roles[v.id] not in _PINNABLE or self._scale_verdict(v) is None,
            f"is left free while it reads a quantization scale that {self.target.value} holds only as subnormals",
        )

    def _scale_verdict(self, vertex: Vertex) -> tuple[Rule, str] | None:
        """The verdict on the first quantization scale ``vertex`` reads that the target cannot hold (its
        policy's ``scale_inputs``: see :mod:`.scale_factors`), or None."""
        positions = vertex.policy.scale_inputs if vertex.policy is not None else ()
        for value in scale_constants(vertex.node, positions) if positions else ():
            verdict = scale_verdict(value, self.target)
            if verdict is not None:
                return verdict
        return None

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        cache: dict[int, RangeStats | None] = dict.fromkeys(self._plainly_representable(graph, plan))
        for vertex in graph.vertices:
            if plan.roles[vertex.id] in (Role.FIXED, Role.DENY):
                continue
            scale = self._scale_verdict(vertex)
            if scale is not None:
                plan.set_role(vertex.id, Role.DENY, *scale)
                continue
            for value in vertex.constants:
                if value.dtype is not ir.DataType.FLOAT:
                    continue
                key = id(value)
                if key not in cache:
                    arr = constant_array(value)
                    cache[key] = None if arr is None or self._representable(arr) else range_stats(arr, self.target)
                stats = cache[key]
                if stats is None:
                    continue
                if stats.overflow and stats.overflow_max < 0 and feeds_only_softmax(graph, vertex):
                    note = (
                        f"constant {value.name!r} ({stats.absmax:.3g} below zero) is an attention "
                        f"mask's -infinity: it becomes {MASK_LOWEST:g} in {self.target.value}, which "
                        "gives the same softmax on every row that keeps a key"
                    )
                    plan.constant_rewrites[value] = (MASK_LOWEST, note)
                    plan.notes[vertex.id] = note
                    continue
                verdict = self._verdict(value, stats)
                if verdict is not None and verdict[0] is Rule.CONSTANT_UNDERFLOW:
                    note = self._flush_below_rounding(vertex, value, stats)
                    if note:
                        plan.notes[vertex.id] = f"{plan.notes[vertex.id]}; {note}" if vertex.id in plan.notes else note
                        continue
                if verdict is not None:
                    plan.set_role(vertex.id, Role.DENY, *verdict)
                    break

    def _flush_below_rounding(self, vertex: Vertex, value: ir.Value, s: RangeStats) -> str:
        """Why the flush of ``value``'s tiny values is below the target's rounding of ``vertex``'s output
        (a bias a Conv, ConvTranspose, Gemm or BatchNormalization adds: see the module doc), or ""."""
        node = vertex.node
        if node is None or self.target is not Target.FP16:
            return ""
        slots = _ADDITIVE_SLOTS.get(node.op_type, ())
        positions = [i for i, v in enumerate(node.inputs) if v is value]
        if not positions or not all(i in slots for i in positions):
            return ""
        scale = self._output_scale(node)
        if scale is None:
            return ""
        rounding = scale * 2.0**-11  # FP16's rounding of outputs of this scale (half an ulp)
        if not s.flushed_max < rounding:
            return ""
        return (
            f"constant {value.name!r}: {s.flushed} value(s) down to |x| = {s.min_nonzero_abs:.3g} flush to zero in "
            f"FP16; a bias moves the output by at most {s.flushed_max:.2g}, below FP16's rounding ({rounding:.2g}) "
            f"of outputs of scale {scale:.3g}: kept FP16"
        )

    def _output_scale(self, node: ir.Node) -> float | None:
        """The smallest scale of the node's output over its channels: observed (ranges), else the
        smallest per-channel largest weight (Conv/ConvTranspose/Gemm) or BatchNorm scale; None when unknown."""
        out = node.outputs[0] if node.outputs else None
        observed = self.ranges.get(out.name) if self.ranges is not None and out is not None and out.name else None
        op = node.op_type
        w = node.inputs[1] if len(node.inputs) > 1 else None  # the weights; a BatchNorm's scale
        array = constant_array(w) if w is not None else None
        if array is None:
            return observed.absmax if observed is not None and observed.absmax > 0 else None
        a = np.abs(np.asarray(array, dtype=np.float64))
        if a.size == 0:
            return None
        if op in ("Conv", "BatchNormalization"):
            per_channel = a.reshape(a.shape[0], -1).max(axis=1) if a.ndim else a
        elif op == "ConvTranspose" and a.ndim >= 2:
            per_channel = np.moveaxis(a, 1, 0).reshape(a.shape[1], -1).max(axis=1)
        else:
            per_channel = np.array([a.max()])
        static = float(per_channel.min())
        if observed is not None and observed.absmax > 0:
            # The observed output, per channel in proportion to its weights.
            return float(observed.absmax * static / float(per_channel.max())) if per_channel.max() > 0 else None
        return static if static > 0 else None

    def _plainly_representable(self, graph: PrecisionGraph, plan: PrecisionPlan) -> list[int]:
        """The ids of FP32 initializers stored as raw little-endian bytes in the model whose every
        value is within the target's range and none small enough to flush (zero aside): screened
        over their bytes, without building an array per tensor, in groups of about ``SCREEN_BYTES``
        (small tensors share numpy calls; a copy of every weight at once is never made)."""
        found: list[int] = []
        keys: list[int] = []
        chunks: list[bytes] = []
        pending = 0
        for vertex in graph.vertices:
            if plan.roles[vertex.id] in (Role.FIXED, Role.DENY):
                continue
            for value in vertex.constants:
                data = raw_float32_bytes(value.const_value)
                if data:
                    keys.append(id(value))
                    chunks.append(data)
                    pending += len(data)
                    if pending >= SCREEN_BYTES:
                        found += self._screen(keys, chunks)
                        keys, chunks, pending = [], [], 0
        return found + self._screen(keys, chunks) if keys else found

    def _screen(self, keys: list[int], chunks: list[bytes]) -> list[int]:
        """The keys whose chunk (FP32 bytes) :meth:`_representable` would pass, screened over all
        chunks at once: every value within the target's range, and any that flushes harmless."""
        sizes = np.fromiter((len(c) // 4 for c in chunks), np.int64, len(chunks))
        magnitudes = np.frombuffer(chunks[0] if len(chunks) == 1 else b"".join(chunks), dtype="<u4") & _MAGNITUDE
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        top = np.maximum.reduceat(magnitudes, starts)
        plain = top <= self._bit_limits[0]  # NaN and inf: above
        open_question = plain & ~self._flushes_harmless(top.view("<f4"), sizes)
        if open_question.any():
            np.subtract(magnitudes, 1, out=magnitudes)  # zeros wrap around to the largest
            plain &= ~open_question | (np.minimum.reduceat(magnitudes, starts) >= self._bit_limits[1] - 1)
        return [key for key, ok in zip(keys, plain.tolist(), strict=True) if ok]

    def _flushes_harmless(self, absmax: np.ndarray, size: np.ndarray, norm: np.ndarray | None = None) -> np.ndarray:
        """Whether whatever flushes to zero in a tensor of this largest |x|, this many values and this
        L2 norm (at least ``absmax``) is too small for :meth:`_verdict` to pin it, whatever its
        values: each flushed value is below the smallest subnormal and there are at most ``size`` of
        them, so their norm is below ``sqrt(size)`` smallest subnormals (half of it is allowed)."""
        limit = self.significant * absmax.astype(np.float64)
        norm = limit / self.significant if norm is None else np.maximum(norm, absmax)
        smallest = float(self._limits[1])
        return (smallest < limit) & (np.sqrt(size) * smallest <= 0.5 * self.significant * norm)

    def _representable(self, arr: np.ndarray) -> bool:
        """A quick exact screen (a few passes over the data, none of them a conversion of the whole
        tensor): True when :func:`range_stats` would find nothing to act on, i.e. every value is
        finite and within the target's range, and the values that flush to zero (if any) are too
        small to matter by :meth:`_verdict`'s two tests. False means "look closer", never "bad"."""
        if arr.dtype != np.float32 or arr.size == 0:
            return False
        flat = arr.reshape(-1)
        top, bottom = flat.max(), flat.min()  # passes over the data, no copy
        if not (top <= self._limits[0] and -bottom <= self._limits[0]):  # NaN compares False
            return False
        norm = _norm_at_least(flat)
        if self._flushes_harmless(np.array([max(top, -bottom)]), np.array([flat.size]), np.array([norm]))[0]:
            return True
        absval = np.abs(arr)
        absmax = absval.max()
        if not absmax <= self._limits[0]:  # NaN compares False: look closer
            return False
        small = absval < self._limits[1]  # only these can flush
        if not small.any():
            return True
        tiny = arr[small]
        with np.errstate(under="ignore"):
            flushed = tiny[(tiny != 0) & (tiny.astype(self.target.numpy_dtype) == 0)]
        if not flushed.size:
            return True
        # _verdict pins when the largest flushed value is at least `significant` of the largest one,
        # or when the flushed values carry more than `significant` of the L2 norm; their norm is at
        # most sqrt(count) * their largest, the tensor's at least its largest (half for rounding).
        flushed_max = float(np.abs(flushed).max())
        limit = self.significant * float(absmax)
        return flushed_max < limit and math.sqrt(flushed.size) * flushed_max <= 0.5 * limit

    @functools.cached_property
    def _limits(self) -> tuple[np.float32, np.float32]:
        return np.float32(self.target.max), np.float32(self.target.smallest_subnormal)

    @functools.cached_property
    def _bit_limits(self) -> tuple[np.uint32, np.uint32]:
        """:attr:`_limits` as FP32 bit patterns (both positive)."""
        high, low = np.array(self._limits, dtype="<f4").view("<u4")
        return high, low

    def _verdict(self, value: ir.Value, s: RangeStats) -> tuple[Rule, str] | None:
        name = self.target.value.upper()
        if s.overflow:
            return (
                Rule.CONSTANT_OVERFLOW,
                f"FP32: constant {value.name!r} holds {s.overflow} value(s) up to |x| = {s.absmax:.3g}, "
                f"beyond {name}'s range ({self.target.max:.6g})",
            )
        relative = s.flushed_max >= self.significant * s.absmax
        if s.flushed and (relative or s.flushed_norm_share > self.significant):
            return (
                Rule.CONSTANT_UNDERFLOW,
                f"FP32: constant {value.name!r} holds {s.flushed} non-zero value(s) down to "
                f"|x| = {s.min_nonzero_abs:.3g} that would flush to zero in {name}",
            )
        return None
