"""Static ranges: interval bounds of an ONNX model's tensors from ranges of its graph inputs, and the
input magnitudes above which tensors provably overflow the target.

:func:`static_bounds` propagates :class:`~amp_compiler.onnx.graph.interval_ops.Bound` through the main graph
from the graph inputs whose range is known (stated, or observed in calibration data), op by op
(:mod:`amp_compiler.onnx.graph.interval_ops`), as far as some input provably reaches a non-zero magnitude:
through a signal-processing front end (filters over raw samples, powers, sums) the bounds are tight,
and past the first layers of a learned network nothing is provable and the walk stops. A tensor
whose *attained* magnitude exceeds the target's range provably overflows for some input within the
ranges (the analysis pass :class:`~amp_compiler.passes.StaticRangePass` keeps it FP32).

Without ranges, :func:`overflow_thresholds` finds, per float graph input, the smallest ``s`` such
that inputs within ``[-s, s]`` provably overflow a given tensor (the walk repeated at a few scales:
bounds grow monotonically with ``s``), up to ``CEILING``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

import numpy as np
import onnx_ir as ir

from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import PrecisionPlan
from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.onnx.graph.integer_flow import cast_to_float
from amp_compiler.onnx.graph.interval_ops import Bound, apply, exact
from amp_compiler.onnx.graph.precision_graph import OnnxPrecisionGraph
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import is_constant
from amp_compiler.options import check_input_ranges
from amp_compiler.targets import Target

__all__ = ["known_input_ranges", "overflow_warnings", "reached_magnitudes", "static_bounds"]

# Input magnitudes considered for warnings: up to 256, raw 8-bit pixels. A tensor that overflows only
# above that (the first convolution of an image model past |x| = 1e4) is no risk for inputs that are
# normalized or 8-bit; one that overflows below it (the power of an STFT past |audio| = 4) is a risk
# for inputs at int16 scale or any other raw scale.
CEILING = 256.0
_FLOOR_LOG2 = -20  # ... and down to 2^-20
_REFINE_STEPS = 7  # bisection steps inside a factor of 2: about 1% precision
_FP32_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class Threshold:
    """``tensor`` provably overflows when graph input ``input`` spans ``[-magnitude, magnitude]`` (or more)."""

    tensor: str
    input: str
    magnitude: float


class _Constants:
    """Constant values read once, for every walk of one model."""

    def __init__(self) -> None:
        self._cache: dict[int, np.ndarray | None] = {}

    def get(self, value: ir.Value | None) -> np.ndarray | None:
        if value is None or not is_constant(value) or value.dtype not in FLOAT_TYPES | {ir.DataType.INT64}:
            return None
        key = id(value)
        if key not in self._cache:
            array = constant_array(value)
            self._cache[key] = None if array is None else np.asarray(array)
        return self._cache[key]


def static_bounds(
    model: ir.Model, input_ranges: Mapping[str, tuple[float, float]], constants: _Constants | None = None
) -> dict[str, Bound]:
    """Bounds of the main graph's tensors reachable from the graph inputs with a range (by name),
    for as long as some input provably reaches a non-zero magnitude (see the module docstring)."""
    constants = constants or _Constants()
    known: dict[ir.Value, Bound] = {}
    for value in model.graph.inputs:
        if value.name and value.name in input_ranges and value.dtype in FLOAT_TYPES:
            lo, hi = input_ranges[value.name]
            known[value] = exact(lo, hi, box=True)
    if not known:
        return {}
    for node in model.graph:
        ins = [known.get(v) if v is not None else None for v in node.inputs]
        if not any(b is not None and b.reached > 0 for b in ins):
            continue
        out = apply(node, ins, [constants.get(v) if b is None else None for v, b in zip(node.inputs, ins, strict=True)])
        for value, bound in zip(node.outputs, out or (), strict=False):
            if value is not None and bound.reached > 0:
                known[value] = bound
    return {v.name: b for v, b in known.items() if v.name}


def reached_magnitudes(bounds: Mapping[str, Bound]) -> dict[str, float]:
    """Per tensor, the magnitude some input within the ranges provably makes it reach."""
    return {name: b.reached for name, b in bounds.items()}


def overflow_thresholds(
    model: ir.Model, inputs: Iterable[str], tensors: Iterable[str], limit: float
) -> list[Threshold]:
    """For each of ``tensors``, the smallest input magnitude (per graph input in ``inputs``, up to
    ``CEILING``) above which it provably exceeds ``limit`` while FP32 still holds it (a tensor that
    only FP32 overflows too, an ``Exp`` of a large input, is the model's own limit, not the
    target's); tensors that stay within ``limit`` are left out."""
    wanted = set(tensors)
    constants = _Constants()
    found: list[Threshold] = []
    for name in inputs:
        seen: dict[float, dict[str, float]] = {}

        def reached(log2: float, name: str = name, seen: dict = seen) -> dict[str, float]:
            if log2 not in seen:
                s = 2.0**log2
                bounds = static_bounds(model, {name: (-s, s)}, constants)
                seen[log2] = {t: b.reached for t, b in bounds.items() if t in wanted}
            return seen[log2]

        def over(log2: float, tensor: str) -> bool:
            return limit < reached(log2).get(tensor, 0.0) <= _FP32_MAX

        top = math.log2(CEILING)
        pending = {t for t, r in reached(top).items() if r > limit}
        # Upwards in factors of 2 from the floor: each tensor's threshold lies below the first scale
        # where it overflows the target (and not FP32), within a factor of 2.
        log2 = _FLOOR_LOG2
        while pending and log2 <= top:
            for tensor in sorted(t for t in pending if over(log2, t)):
                pending.discard(tensor)
                lo, hi = log2 - 1.0, float(log2)
                for _ in range(_REFINE_STEPS if log2 > _FLOOR_LOG2 else 0):
                    mid = (lo + hi) / 2
                    lo, hi = (lo, mid) if over(mid, tensor) else (mid, hi)
                found.append(Threshold(tensor, name, 2.0**hi))
            log2 += 1
    return sorted(found, key=lambda t: (t.magnitude, t.tensor))


def known_input_ranges(
    model: ir.Model, stated: Mapping[str, tuple[float, float]], observed: Mapping[str, TensorRange] | None
) -> dict[str, tuple[float, float]]:
    """The graph inputs' ranges: ``stated`` ones (checked: float graph inputs or integer ones cast to float,
    finite, lo <= hi), and for the other float inputs the range ``observed`` in calibration data, if any."""
    floats = {v.name: v.dtype in FLOAT_TYPES for v in model.graph.inputs if v.name}
    check_input_ranges({v.name: floats[v.name] or (v.name in stated and cast_to_float(v, model.opset_imports))
                        for v in model.graph.inputs if v.name}, stated)
    out = {name: (r.min, r.max) for name, r in (observed or {}).items() if floats.get(name) and r.count}
    out.update(stated)
    return out


def overflow_warnings(
    model: ir.Model, graph: OnnxPrecisionGraph, plan: PrecisionPlan, target: Target, inputs: Iterable[str]
) -> list[str]:
    """One sentence per low-precision node with a tensor that provably overflows the target above some
    magnitude of a graph input in ``inputs`` (those without a known range), smallest magnitude first: it
    *can* overflow there (some input of that magnitude makes it: a worst case, every value at once, that a
    filter over raw audio attains and a classifier's standardized features need not; sweep T)."""
    low = [v for v in graph.vertices if v.node is not None and plan.decisions[v.id].dtype == target.dtype]
    names = {s.value.name for v in low for s in v.slots if s.value is not None and s.value.name}
    first: dict[str, Threshold] = {}
    for t in overflow_thresholds(model, inputs, names, target.max):
        first.setdefault(t.tensor, t)
    found = []
    for v in low:
        hits = [first[s.value.name] for s in v.slots if s.value is not None and s.value.name in first]
        if hits:
            t = min(hits, key=lambda h: h.magnitude)
            # "can": some input of that magnitude overflows it (every value of it at once, signs aligned with
            # the weights): a bound it attains, which real inputs of that size need not reach
            found.append((t.magnitude, v.id, f"{v.describe()} can overflow {target.value.upper()} once "
                          f"|{t.input}| > {t.magnitude:.3g}"))
    return [text for _, _, text in sorted(found)]
