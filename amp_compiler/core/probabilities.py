"""Probability outputs: how certain the inputs left them, and how far a tie between two classes moves them.

A probability output holds rows that sum to 1 (a softmax's, along its class axis: the last, or another, as a
SqueezeNet head's ``[B, 1000, 1, 1]`` or a segmentation map's ``[B, C, H, W]``). Generated inputs seldom put two
of its classes in a tie; real ones do (a CTC recogniser between characters, a classifier between look-alikes),
and at a tie FP16's error in the logits moves the probability most. :func:`probability_output` measures both
ends, for :func:`amp_compiler.core.tensor_error.accuracy`:

- ``saturated``: the share of rows whose top value FP16 holds as 1 (:data:`CERTAIN`). PP-OCR's recognisers on
  ImageNet-range images ("blank" at every step) and Magika on uniform random bytes (p = 1.0, the next 6e-9) are
  certain everywhere: FP16 moves nothing there, and the 0.00% they were stated says nothing of the near-ties
  their real inputs reach (1.47% and 47% of range);
- ``tie_move``: how far a tie moves the output, as a share of the output's range at a tie. A softmax's logits
  come back from its probabilities up to a constant (``log p_k - log p_top = z_k - z_top``), so the
  conversion's error in a pair's difference is ``d = (log g_k - log g_top) - (log r_k - log r_top)``, exact to
  FP32's rounding for probabilities of :data:`FLOOR` or more (FP16's smallest normal: an output FP16 stored on
  its way, its smaller probabilities subnormals, would read rounding as logit error, 10-100x). Two classes that
  tie share their probability as ``sigmoid(z_k - z_top)``: an error ``d`` moves it by up to ``tanh(|d| / 4)``.
  The pairs read are those near a tie (:data:`NEAR_GAP`: a class's logit within 3 of its row's top; where fewer
  than :data:`MIN_PAIRS` are, the nearest that many within :data:`FAR_GAP`; where none is, no move is stated: the
  inputs left the output too certain to say what a tie does): a pair far apart carries the part of
  the error that grows with the gap (a logit scale off by 1% moves a gap of 10 by 0.1 and a tie by nothing), and
  rows that sum to 1 but are no softmax (squares normalised) carry their small entries' relative error, which no
  tie inherits (sweep C1: 2.5% stated from all pairs, 0.2% at constructed ties). Every sample's pairs count
  together: a sample of one row holds a handful, whose 99th percentile would be their max. The move stated is
  the :data:`PERCENTILE`-th of those pairs', over the output's range at a tie: a sample of one row is a tie
  then, its range the tied classes' share (:data:`TIED`: constructed ties of 1000-class classifiers held
  0.44-0.49 each), a sample of more rows keeps its others' range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["CERTAIN", "FAR_GAP", "FLOOR", "MAX_ROWS", "MIN_PAIRS", "NEAR_GAP", "PERCENTILE", "TIED",
           "ProbabilityOutput", "probability_axis", "probability_output", "saturation", "tie_move"]

#: A probability row's top value at or above this FP16 holds as 1 (the half-spacing below 1 is 2^-12).
CERTAIN = 1.0 - 2.0**-12
#: The smallest probability whose logit is read back: FP16's smallest normal (see the module docstring).
FLOOR = 2.0**-14
#: A class is near a tie with its row's top where their logits are this close (its probability at least e^-3 of
#: the top's); where fewer than :data:`MIN_PAIRS` pairs are, the nearest :data:`MIN_PAIRS` are read.
NEAR_GAP = 3.0
MIN_PAIRS = 256
#: No pair farther apart than this is read (a probability below 0.25% of its row's top): where none is nearer the
#: output was too certain to say what a tie does (a keyword spotter's 3.8% from one class at a gap of 8.8).
FAR_GAP = 6.0
#: The most rows of a sample read (evenly strided): the same rows of its FP32 and converted values.
MAX_ROWS = 1 << 16
#: A row's top where two classes tie and the others hold little: a sample of one row then has this range.
TIED = 0.5
#: 1 tie in 100 moves at least the move stated: a percentile, not a max, which grows with the pairs' number.
PERCENTILE = 99.0


@dataclasses.dataclass(frozen=True)
class ProbabilityOutput:
    """What :func:`probability_output` measures of one probability output over samples."""

    axis: int  # the class axis: its rows along it sum to 1
    saturated: float  # the share of rows certain in low precision (:data:`CERTAIN`)
    tie_move: float | None  # a tie's move, share of the output's range at a tie (None: no pair to read)


def probability_axis(reference: np.ndarray) -> int | None:
    """The axis along which ``reference`` is a probability output (every value in [0, 1], every row along it
    summing to 1 within 1e-3, rows of at least 2 values), the last axis first; None where there is none. The
    rows' sums are taken before any copy: most outputs are no probabilities, and a segmentation map's is large."""
    r = np.asarray(reference)
    if r.ndim == 0 or not r.size or not np.issubdtype(r.dtype, np.floating):
        return None
    with np.errstate(invalid="ignore"):
        for axis in range(r.ndim - 1, -1, -1):
            if r.shape[axis] >= 2 and np.allclose(r.sum(axis=axis, dtype=np.float64), 1.0, atol=1e-3):
                return axis if np.all(r >= 0) and np.all(r <= 1) else None
    return None


def _two_classes(p: np.ndarray) -> np.ndarray:
    """A Sigmoid's probabilities as two-class rows ``(p, 1 - p)``, every value or an evenly strided :data:`MAX_ROWS`
    of them (float64: 1 - p of a p near 1 keeps its bits)."""
    flat = np.ravel(p)
    flat = flat[::-(-flat.size // MAX_ROWS)].astype(np.float64)
    return np.stack([flat, 1.0 - flat], axis=-1)


def _rows(a: np.ndarray, axis: int) -> np.ndarray:
    """``a``'s rows along ``axis``, as float64: every one, or an evenly strided :data:`MAX_ROWS` of them (a
    segmentation map's 262,144 pixels of 150 classes: a share and a percentile need no more, and its float64
    rows' logarithms would take gigabytes)."""
    a = np.moveaxis(np.asarray(a), axis, -1)
    rows = a.reshape(-1, a.shape[-1])
    return rows[::-(-rows.shape[0] // MAX_ROWS)].astype(np.float64)


def probability_output(
    references: Sequence[np.ndarray], converted: Sequence[np.ndarray], *, logistic: bool = False,
) -> ProbabilityOutput | None:
    """A probability output's saturation and tie move over samples (one reference and one converted array per
    sample; see the module docstring), or None where it is no probability output along one axis in every sample.
    ``logistic``: each value is a Sigmoid's, the probability of one of two classes (its logit against 0): read as
    the row ``(p, 1 - p)`` along a new last axis (a binary classifier's score, a multi-label tagger's labels)."""
    if logistic:  # a sample of one value is one of many, its range theirs: 0..1
        ranges = [max(TIED, float(np.ptp(r))) if np.size(r) > 1 else 1.0 for r in references]
        references, converted = [_two_classes(r) for r in references], [_two_classes(g) for g in converted]
    axes = {probability_axis(r) for r in references}
    axis = axes.pop() if len(axes) == 1 else None
    if axis is None:
        return None
    rows = [_rows(r, axis) for r in references]
    if not logistic:  # a sample of one row is a tie then; one of more keeps its others' range
        ranges = [TIED if flat.shape[0] == 1 else max(TIED, float(flat.max() - flat.min())) for flat in rows]
    move = _tie_move(rows, [_rows(g, axis) for g in converted], ranges)
    return ProbabilityOutput(axis, _certain(rows), move)


def saturation(references: Sequence[np.ndarray], *, logistic: bool = False) -> float | None:
    """The share of a probability output's rows whose top value FP16 holds as 1 (:data:`CERTAIN`), over every
    sample; None where it is no probability output (``logistic``: a Sigmoid's, as :func:`probability_output`)."""
    if logistic:
        references = [_two_classes(r) for r in references]
    axes = {probability_axis(r) for r in references}
    axis = axes.pop() if len(axes) == 1 else None
    return None if axis is None else _certain([_rows(r, axis) for r in references])


def _certain(rows: list[np.ndarray]) -> float:
    """The share of ``rows`` (every sample's) whose top value FP16 holds as 1."""
    total = sum(flat.shape[0] for flat in rows)
    return sum(int(np.count_nonzero(flat.max(axis=1) >= CERTAIN)) for flat in rows) / total if total else 0.0


def tie_move(references: Sequence[np.ndarray], converted: Sequence[np.ndarray]) -> float | None:
    """How far a tie between two classes moves a probability output, as a share of its range at a tie (see the
    module docstring); None where it is no probability output or no row holds a pair to read."""
    output = probability_output(references, converted)
    return output.tie_move if output else None


def _tie_move(references: list[np.ndarray], converted: list[np.ndarray], ranges: list[float]) -> float | None:
    """:func:`tie_move` of the samples' rows (float64, one row per position), each sample's range at a tie given."""
    gaps, errors = [], []
    for ref, got in zip(references, converted, strict=True):
        index = np.arange(ref.shape[0])
        top = ref.argmax(axis=1)
        read = (ref >= FLOOR) & (got >= FLOOR) & (got[index, top] >= FLOOR)[:, None]
        read[index, top] = False
        with np.errstate(divide="ignore", invalid="ignore"):
            ref_logits = np.log(ref) - np.log(ref[index, top])[:, None]
            d = (np.log(got) - np.log(got[index, top])[:, None]) - ref_logits
        gaps.append(-ref_logits[read])
        errors.append(np.abs(d[read]))
    gap, error = np.concatenate(gaps), np.concatenate(errors)
    if not error.size:
        return None
    near = error[gap <= NEAR_GAP]
    if not near.size:  # no pair near a tie: every reading would be a far pair's (sweep W3: 6 at gaps 5.5-5.9)
        return None
    if near.size < MIN_PAIRS:  # too few near a tie: the nearest pairs, farther, but none far from one
        nearest = np.argsort(gap, kind="stable")[:MIN_PAIRS]
        near = error[nearest[gap[nearest] <= FAR_GAP]]
    if not near.size:
        return None
    move = math.tanh(float(np.percentile(near, PERCENTILE)) / 4)
    return min(move / max(float(np.median(ranges)), FLOOR), 1.0)
