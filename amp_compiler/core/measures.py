"""What is measured of a model's tensors: observed ranges, per-node errors and output accuracy against FP32.

Shared by the analysis (calibration and static ranges pin what overflows), ``--tolerance``, the FP8
statistics, the accuracy checks and the report, which renders them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

__all__ = [
    "BF16_RELATIVE_ERROR", "BINADE_HIGH", "BINADE_LOW", "FP16_RELATIVE_ERROR", "SHIFT_BUDGET", "ChannelPeaks",
    "NodeError", "OutputAccuracy", "TensorRange", "binade_counts", "fp16_relative_error", "mean_fp16_error",
    "shift_cost", "shift_room", "shift_rooms",
]

#: The binades of a magnitude histogram (:func:`binade_counts`; the calibration child's, which keeps its
#: own copy of these two numbers): 2^e <= |x| < 2^(e+1) for e from BINADE_LOW to BINADE_HIGH, the first
#: bin also counting every smaller value, the last every larger one.
BINADE_LOW, BINADE_HIGH = -24, 23
#: The largest relative error BF16 storage gives a normal value: 8 significant bits.
BF16_RELATIVE_ERROR = 2.0**-8
#: FP16's, for a normal value: 11 significant bits.
FP16_RELATIVE_ERROR = 2.0**-11
_MOST_SHIFT = 40
_FLUSHED_ALWAYS = 1000  # an exponent no shift brings back


def fp16_relative_error(exponent: int) -> float:
    """The largest relative error FP16 storage gives a value of the binade ``2^exponent``: 2^-11 for a
    normal (2^-14 up), the half spacing of subnormals (2^-25) against the value below it, 1 once it flushes."""
    if exponent >= -14:
        return FP16_RELATIVE_ERROR
    return min(1.0, 2.0 ** (-25 - exponent))


def _counted(binades: Sequence[float]) -> list[tuple[int, float]]:
    """(exponent, count) of the non-empty bins; the first bin holds every value below 2^-23 too: lost to
    FP16 shifted or not (relative error 1)."""
    return [(BINADE_LOW + i if i else -_FLUSHED_ALWAYS, n) for i, n in enumerate(binades) if n]


def _mean_error(counted: list[tuple[int, float]], total: float, shift: int) -> float:
    return sum(n * fp16_relative_error(e - shift) for e, n in counted) / total


def mean_fp16_error(binades: Sequence[float], shift: int = 0) -> float:
    """The mean of :func:`fp16_relative_error` over values whose magnitudes fall in ``binades``
    (:data:`BINADE_LOW` on) shifted by 2^-shift (0 when nothing was counted)."""
    total = float(sum(binades))
    return _mean_error(_counted(binades), total, shift) if total > 0 else 0.0


def shift_cost(binades: Sequence[float], shift: int) -> float:
    """What a power-of-two shift down by 2^-shift costs a tensor whose magnitudes fall in ``binades``, in
    relative precision, on average over its non-zero values: the mean of :func:`fp16_relative_error` over
    its values shifted, less the unshifted one (what plain FP16 already loses of its smallest values, and
    the underflow rules accepted). 0 when nothing was counted."""
    return mean_fp16_error(binades, shift) - mean_fp16_error(binades, 0)


#: What a shift may cost (:func:`shift_cost`): what BF16 storage gives up against FP16.
SHIFT_BUDGET = BF16_RELATIVE_ERROR - FP16_RELATIVE_ERROR


def shift_room(binades: Sequence[float]) -> int:
    """The largest power-of-two shift down, k in 0..40, that costs a tensor whose magnitudes fall in
    ``binades`` (:data:`BINADE_LOW` on) no more than :data:`SHIFT_BUDGET` (:func:`shift_cost`), every
    smaller shift too: no more relative precision than BF16 gives up against FP16. -1 when nothing was
    counted."""
    return int(shift_rooms([binades])[0])


@functools.cache
def _shift_errors(bins: int) -> np.ndarray:
    """The table (read-only) of :func:`fp16_relative_error` of bin i's values shifted down by 2^-k, for k in
    0..40 (the first bin's values lost whatever the shift, :func:`_counted`)."""
    exponents = [-_FLUSHED_ALWAYS, *range(BINADE_LOW + 1, BINADE_LOW + bins)]
    table = np.array([[fp16_relative_error(e - k) for k in range(_MOST_SHIFT + 1)] for e in exponents])
    table.setflags(write=False)
    return table


def shift_rooms(histograms: Sequence[Sequence[float]]) -> np.ndarray:
    """:func:`shift_room` of each histogram (rows of the same bins), at once: a calibration's every tensor
    in a product of two matrices (ppocr-v4-det's 672: 1 ms, against 13 ms one at a time in Python)."""
    counts = np.asarray(histograms, dtype=np.float64)
    if not counts.size:  # nothing known: no shift
        return np.full(len(histograms), -1)
    total = counts.sum(axis=1)
    means = counts @ _shift_errors(counts.shape[1]) / np.where(total > 0, total, 1.0)[:, None]
    over = means[:, 1:] - means[:, :1] > SHIFT_BUDGET  # shifts 1..40 past the budget
    rooms = np.where(over.any(axis=1), over.argmax(axis=1), _MOST_SHIFT)
    return np.where(total > 0, rooms, -1)


def binade_counts(magnitudes: np.ndarray) -> list[int]:
    """The histogram of ``magnitudes`` (non-zero, finite) by binade (:data:`BINADE_LOW`...:data:`BINADE_HIGH`)."""
    exponents = np.frexp(magnitudes)[1].astype(np.int64) - 1
    np.clip(exponents - BINADE_LOW, 0, BINADE_HIGH - BINADE_LOW, out=exponents)
    return np.bincount(exponents, minlength=BINADE_HIGH - BINADE_LOW + 1).tolist()


@dataclasses.dataclass(frozen=True)
class ChannelPeaks:
    """The largest magnitudes of a tensor's channels along its last axis, where they were recorded (a
    tensor reaching 1024, :data:`amp_compiler.runtime.child_folds.CHANNEL_LEAST`): a few channels
    listed, every other one bounded by ``rest``."""

    channels: int  # the last axis's size
    peaks: tuple[tuple[int, float], ...]  # (channel, its largest magnitude), largest first
    rest: float  # the largest magnitude of every channel not listed

    def bounds(self) -> list[float]:
        """The largest magnitude each channel reached, in channel order."""
        out = [self.rest] * self.channels
        for channel, peak in self.peaks:
            out[channel] = peak
        return out


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
    # how far down (a power of two, 2^-k) its values may be shifted and still keep in FP16, on average,
    # BF16's precision (:func:`shift_room`, from a histogram of a sample of its magnitudes; -1: none, or not
    # measured): what range scaling may do to it (:mod:`amp_compiler.passes.analysis.range_scaling`)
    shift_room: int = -1
    # that histogram (:func:`binade_counts`' bins; empty: not measured), for :func:`shift_cost`
    binades: tuple[int, ...] = ()
    # its channels' largest magnitudes along its last axis, where it reached 1024 (None: not recorded,
    # or the axis's size differed between samples)
    channel_peaks: ChannelPeaks | None = None


@dataclasses.dataclass
class NodeError:
    """What this node's output differs from FP32 in the converted model, on the calibration data."""

    rel_l2: float  # ||mixed - fp32|| / ||fp32|| of the node's first float output
    max_abs: float
    added: float  # rel_l2 minus the worst rel_l2 among its float inputs: the error this node adds


@dataclasses.dataclass(frozen=True)
class OutputAccuracy:
    """One output of a converted model against the FP32 model's (on one sample: the checks; the worst
    sample: the report). An integer or bool output (a label from ArgMax, TopK's indices, a class id) is
    compared exactly: ``changed`` counts its values that differ from FP32's, of ``values``; the float
    fields hold its values' statistics as numbers, which nothing judges it by. An output whose FP32 values
    were all NaN/inf is not ``measured``: its zero error is no measurement (the inputs were unlike its real ones);
    nor is an ``empty`` one, which held no values at all (a dim of its shape was 0 on the inputs)."""

    name: str
    cosine: float
    max_abs_error: float  # inf when the output has NaN/inf where FP32 has a finite value
    value_range: float  # max - min of the FP32 output (its finite values)
    finite: bool  # no NaN/inf where FP32 has a finite value (or another one)
    rel_l2: float | None = None  # ||converted - fp32|| / ||fp32|| (inf when not finite; None: not measured)
    changed: int | None = None  # an integer/bool output's values that differ from FP32's (None: a float output)
    values: int = 0  # ... of this many (a shape other than FP32's changes every value)
    # False: FP32's own values were all NaN/inf on the inputs (a Log of negative noise), so no error was
    # measured: the zero error and cosine 1 then say nothing
    measured: bool = True
    # True: FP32's output held no values on the inputs (a difference along a dim the probe sized 1, x[1:] -
    # x[:-1]: a dim of 0), so nothing was compared: not measured either
    empty: bool = False
    # The worst row's max error over the 90th-percentile row's (rows: the vectors along the last axis, a
    # token's logits, over every sample): how far the max stands above the bulk of the positions (None:
    # fewer rows than :data:`~amp_compiler.core.tensor_error.MIN_ROWS`, or the bulk's error is 0). A max
    # far above it comes from a few positions (:func:`~amp_compiler.onnx.measure.output_error.concentrated`)
    concentration: float | None = None
    # A probability output (each row along the last axis in [0, 1], summing to 1: a softmax's): the share of
    # its rows whose top probability FP16 holds as 1 (None: not such an output). Near 1 the inputs left the
    # model certain everywhere, and its error on them says nothing of the near-ties real inputs reach
    # (:func:`~amp_compiler.core.probabilities.saturation`)
    saturated: float | None = None
    # A probability output (a softmax's, or a Sigmoid's): how far a tie between two of its classes moves it, as a
    # share of its range then, from the conversion's error in the logits' differences near a tie on the inputs
    # measured (None: not such an output, or certain everywhere). Generated inputs seldom tie, real ones do
    # (:func:`~amp_compiler.core.probabilities.tie_move`)
    tie_move: float | None = None

    @property
    def exact(self) -> bool:
        """An integer or bool output, compared value by value (:attr:`changed`)."""
        return self.changed is not None

    @property
    def changed_share(self) -> float | None:
        """The share of an integer/bool output's values that differ from FP32's (None: a float output)."""
        if self.changed is None:
            return None
        return self.changed / self.values if self.values else 0.0

    @property
    def error_of_range(self) -> float:
        """``max_abs_error`` as a share of ``value_range`` (inf for an error on a constant output)."""
        return self.max_abs_error / self.value_range if self.value_range > 0 else (
            0.0 if self.max_abs_error == 0 else float("inf")
        )
