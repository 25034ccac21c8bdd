"""Error statistics of a tensor against its FP32 reference, accumulated over samples.

One :class:`ErrorStats` per tensor, fed one (reference, converted) pair per sample: relative L2,
largest absolute error, cosine similarity, the reference's range (for the error as a share of it)
and the values that are NaN or infinite where the reference is finite. ``--tolerance``
(:mod:`amp_compiler.onnx.tolerance.refine`) and ``compare`` (:mod:`amp_compiler.onnx.compare`) read the same numbers.
:func:`relative_l2` is the one definition of the relative L2 error from its two sums (the FP8
statistics of both paths use it too); :class:`OutputErrors` is how the switched probes compare a
model's outputs, the one place a run's error at the outputs is computed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["ErrorStats", "OutputErrors", "relative_l2"]


def relative_l2(err2: float, ref2: float) -> float:
    """``sqrt(err2 / ref2)``: the relative L2 error from the sum of squared errors and the sum of
    squared reference values (0 when both are 0, infinite for an error on a zero reference or an
    infinite error; NaN stays NaN)."""
    if math.isinf(err2):
        return math.inf
    if ref2 > 0:
        return math.sqrt(err2 / ref2)
    return 0.0 if err2 == 0 else math.inf


@dataclasses.dataclass
class ErrorStats:
    """Running sums over every sample seen (see the module docstring)."""

    diff2: float = 0.0  # sum of squared errors (infinite once a value is non-finite where FP32 is not)
    ref2: float = 0.0  # sum of squared finite reference values
    got2: float = 0.0  # ... and converted values, where both are finite
    dot: float = 0.0
    max_abs: float = 0.0
    ref_min: float = math.inf
    ref_max: float = -math.inf
    nonfinite: int = 0  # NaN/inf where the reference is finite
    count: int = 0

    def add(self, reference: np.ndarray, got: np.ndarray) -> None:
        r = np.asarray(reference, dtype=np.float64)
        g = np.asarray(got, dtype=np.float64)
        if r.shape != g.shape:
            return
        r, g = r.ravel(), g.ravel()
        self.count += r.size
        finite = np.isfinite(r)
        d = np.where(finite, g - r, np.where(r == g, 0.0, np.inf))
        with np.errstate(over="ignore", invalid="ignore"):
            self.diff2 += float(np.sum(d * d))
            both = finite & np.isfinite(g)
            self.ref2 += float(np.sum(np.where(finite, r * r, 0.0)))
            self.got2 += float(np.sum(np.where(both, g * g, 0.0)))
            self.dot += float(np.sum(np.where(both, r * g, 0.0)))
        self.nonfinite += int(np.count_nonzero(finite & ~np.isfinite(g)))
        if d.size:
            self.max_abs = max(self.max_abs, float(np.max(np.abs(d))))
        if finite.any():
            self.ref_min = min(self.ref_min, float(r[finite].min()))
            self.ref_max = max(self.ref_max, float(r[finite].max()))

    @property
    def rel_l2(self) -> float:
        """||converted - FP32|| / ||FP32|| (0 when both are 0, inf for an error on a zero reference)."""
        return relative_l2(self.diff2, self.ref2)

    @property
    def cosine(self) -> float:
        """Cosine similarity over the values finite in both (1 when both are all zero)."""
        if self.ref2 == 0 and self.got2 == 0:
            return 1.0
        if self.ref2 == 0 or self.got2 == 0:
            return 0.0
        return self.dot / math.sqrt(self.ref2 * self.got2)

    @property
    def value_range(self) -> float:
        return self.ref_max - self.ref_min if self.ref_max >= self.ref_min else 0.0

    @property
    def error_of_range(self) -> float:
        """The largest absolute error as a share of the reference's range (max - min)."""
        span = self.value_range
        if span > 0:
            return self.max_abs / span
        return 0.0 if self.max_abs == 0 else math.inf


class OutputErrors:
    """A model's float outputs against their references, over samples: the relative L2 of each,
    leaving out the positions where the reference is not finite; an output that is not finite where
    its reference is has an infinite error. What the switched probe of ``--tolerance`` and the FP8
    budget (:mod:`amp_compiler.onnx.measure.probe`) and the FX path's end-to-end runs
    (:mod:`amp_compiler.fx.fp8.stats`) compare their runs by."""

    def __init__(self, outputs: int):
        self.err2 = [0.0] * outputs
        self.ref2 = [0.0] * outputs

    def add(self, reference: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> bool:
        """One sample's outputs (float64); False when one is not finite where its reference is."""
        finite_everywhere = True
        for j, (r, g) in enumerate(zip(reference, got, strict=True)):
            finite = np.isfinite(r)
            if not np.all(np.isfinite(g[finite])):
                self.err2[j] = math.inf
                finite_everywhere = False
                continue
            self.err2[j] += float(np.sum((g[finite] - r[finite]) ** 2))
            self.ref2[j] += float(np.sum(r[finite] ** 2))
        return finite_everywhere

    def relative(self) -> list[float]:
        """Each output's relative L2 (0 when both sums are 0, infinite for an error on a zero reference)."""
        return [relative_l2(e, r) for e, r in zip(self.err2, self.ref2, strict=True)]

    def worst(self) -> float:
        return max(self.relative(), default=0.0)
