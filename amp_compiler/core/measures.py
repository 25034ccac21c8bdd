"""What is measured of a model's tensors: observed ranges and per-node errors against FP32.

Shared by the analysis (calibration and static ranges pin what overflows), ``--tolerance``, the FP8
statistics and the report, which renders them.
"""

from __future__ import annotations

import dataclasses

__all__ = ["NodeError", "TensorRange"]


@dataclasses.dataclass
class TensorRange:
    """Observed values of one tensor over the calibration samples (FP32 model)."""

    min: float
    max: float
    absmax: float
    underflow_share: float  # share of non-zeros that would flush to zero in FP16 (< 2^-24)
    subnormal_share: float  # share of non-zeros below FP16's smallest normal (6.1e-5)
    count: int  # values seen


@dataclasses.dataclass
class NodeError:
    """What this node's output differs from FP32 in the converted model, on the calibration data."""

    rel_l2: float  # ||mixed - fp32|| / ||fp32|| of the node's first float output
    max_abs: float
    added: float  # rel_l2 minus the worst rel_l2 among its float inputs: the error this node adds
