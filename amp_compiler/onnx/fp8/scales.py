"""FP8 scales: per output channel for weights (from their values), per tensor for activations (from
the calibration samples' max of |x|, or a percentile of it).

Guarantees:
- every scale is a value of the fallback type (FP16, or BF16 with ``fallback="bf16"``: what the
  Q/DQ nodes store), within its normal range, never 0, inf or NaN: the formulas are
  :mod:`amp_compiler.core.fp8_numbers`'s (a weight's ``amax / 448`` per output channel, along
  :func:`channel_axis`, or per tensor);
- :func:`percentile_amax` is exact: the ``q``-th percentile of |x| over every value of the tensor in
  every sample, as the model holds it (rounded to the fallback type, which is what the
  QuantizeLinear reads), from a histogram with one bin per non-negative value of that 16-bit type.
  Values above it saturate to +-448 once scaled: the outliers are clipped, the rest keep more bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir

from amp_compiler.runtime.runner import Runner
from amp_compiler.targets import Target

__all__ = ["channel_axis", "histogram_percentile", "magnitude_histogram", "percentile_amax"]

_MAGNITUDES = 1 << 15  # non-negative 16-bit float bit patterns (sign bit clear), NaN patterns included


def channel_axis(node: ir.Node, index: int, rank: int) -> int | None:
    """The output-channel axis of a constant data input of a MatMul, Gemm or Conv (None: per tensor)."""
    if index != 1 or (rank != 2 and node.op_type != "Conv"):
        return None
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        attr = node.attributes.get("transB")
        return 0 if attr is not None and attr.value else 1
    return 1  # MatMul [K, N]


def magnitude_histogram(x: np.ndarray, low: Target = Target.FP16) -> np.ndarray:
    """Counts of |x| rounded to ``low``, one bin per non-negative bit pattern (NaN patterns empty)."""
    with np.errstate(over="ignore"):  # beyond the type's range: inf, as the model holds it
        bits = np.asarray(x).astype(low.numpy_dtype).view(np.uint16) & np.uint16(0x7FFF)
    counts = np.bincount(bits.ravel(), minlength=_MAGNITUDES)
    counts[_nan_patterns(low)] = 0
    return counts


def _nan_patterns(low: Target) -> slice:
    inf = np.asarray(np.inf, dtype=low.numpy_dtype).view(np.uint16)
    return slice(int(inf) + 1, _MAGNITUDES)


def histogram_percentile(counts: np.ndarray, q: float, low: Target = Target.FP16) -> float:
    """The smallest magnitude at or below which ``q`` percent of the counted values lie."""
    total = int(counts.sum())
    if total == 0:
        return 0.0
    cumulative = np.cumsum(counts)
    pattern = int(np.searchsorted(cumulative, q / 100.0 * total, side="left"))
    pattern = min(pattern, _MAGNITUDES - 1)
    return float(np.asarray(pattern, dtype=np.uint16).view(low.numpy_dtype).astype(np.float32))


def percentile_amax(
    model: onnx.ModelProto, names: Sequence[str], samples: Iterable[dict[str, np.ndarray]], runner: Runner,
    q: float, low: Target = Target.FP16,
) -> dict[str, float]:
    """The ``q``-th percentile of |x| of each float tensor in ``names`` over ``samples`` (see module doc):
    one run of ``model`` per sample with those tensors as outputs."""
    if not names:
        return {}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    exposed.graph.output.extend(oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    session = runner.load(exposed)
    counts = {n: np.zeros(_MAGNITUDES, dtype=np.int64) for n in names}
    try:
        for sample in samples:
            feeds = {k: v for k, v in sample.items() if k in session.input_names}
            for name, value in zip(names, session.run(feeds), strict=True):
                counts[name] += magnitude_histogram(value, low)
    finally:
        session.close()
    return {n: histogram_percentile(c, q, low) for n, c in counts.items()}


