"""What is measured of a model's tensors: observed ranges, per-node errors and output accuracy against FP32.

Shared by the analysis (calibration and static ranges pin what overflows), ``--tolerance``, the FP8
statistics, the accuracy checks and the report, which renders them.
"""

from __future__ import annotations

import dataclasses

__all__ = ["LOW_EXPONENT", "LOW_SHARE", "NodeError", "OutputAccuracy", "TensorRange"]

#: :attr:`TensorRange.low`: at most this share of a tensor's non-zero values lie between 2^LOW_EXPONENT
#: (down to which FP16's subnormals keep BF16's 8 significant bits) and it.
LOW_SHARE = 0.01
LOW_EXPONENT = -17


@dataclasses.dataclass
class TensorRange:
    """Observed values of one tensor over the calibration samples (FP32 model)."""

    min: float
    max: float
    absmax: float
    underflow_share: float  # share of non-zeros that would flush to zero in FP16 (< 2^-24)
    subnormal_share: float  # share of non-zeros below FP16's smallest normal (6.1e-5)
    count: int  # values seen
    # ||fp16(x) - x|| / ||x|| over the values below FP16's smallest normal (flushed or subnormal): what
    # FP16's exponent range moves the tensor by, against the tensor's own L2 norm (0: not measured)
    underflow_error: float = 0.0
    # a power of two at most 1% of its non-zero values lie between 2^-17 and (from a sample of its values;
    # 0: not measured): how far down its values may be shifted, whatever its extremes, before more of them
    # than that fall below what FP16 holds with BF16's precision (:mod:`amp_compiler.passes.analysis.range_scaling`)
    low: float = 0.0


@dataclasses.dataclass
class NodeError:
    """What this node's output differs from FP32 in the converted model, on the calibration data."""

    rel_l2: float  # ||mixed - fp32|| / ||fp32|| of the node's first float output
    max_abs: float
    added: float  # rel_l2 minus the worst rel_l2 among its float inputs: the error this node adds


@dataclasses.dataclass(frozen=True)
class OutputAccuracy:
    """One float output of a converted model against the FP32 model's (on one sample: the checks; the
    worst sample: the report)."""

    name: str
    cosine: float
    max_abs_error: float  # inf when the output has NaN/inf where FP32 has a finite value
    value_range: float  # max - min of the FP32 output (its finite values)
    finite: bool  # no NaN/inf where FP32 has a finite value (or another one)
    rel_l2: float | None = None  # ||converted - fp32|| / ||fp32|| (inf when not finite; None: not measured)

    @property
    def error_of_range(self) -> float:
        """``max_abs_error`` as a share of ``value_range`` (inf for an error on a constant output)."""
        return self.max_abs_error / self.value_range if self.value_range > 0 else (
            0.0 if self.max_abs_error == 0 else float("inf")
        )
