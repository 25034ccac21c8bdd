"""Error statistics of a tensor against its FP32 reference, accumulated over samples.

One :class:`ErrorStats` per tensor, fed one (reference, converted) pair per sample: relative L2,
largest absolute error, cosine similarity, the reference's range (for the error as a share of it)
and the values that are NaN or infinite where the reference is finite. The one implementation of an
output's error against FP32: ``--tolerance`` (:mod:`amp_compiler.onnx.tolerance.refine`), ``compare``
(:mod:`amp_compiler.onnx.compare`), the error measured before writing
(:mod:`amp_compiler.onnx.measure.output_error`) and the checks' ``compare``
(:mod:`amp_compiler.onnx.measure.checks`, through :meth:`ErrorStats.accuracy`) read the same numbers;
an integer or bool output (a label, an index) is compared value by value instead (:func:`exact_accuracy`,
:class:`ChangedValues`).
:func:`relative_l2` is the one definition of the relative L2 error from its two sums (the FP8
statistics of both paths use it too); :class:`ArgmaxAgreement` is the one count of top-1 agreement
(``compare``'s argmax column and the ``argmax`` metric); :class:`OutputErrors` is how the switched probes compare a
model's outputs, the one place a run's error at the outputs is computed, under an error metric
(:data:`ErrorMetric`: a :class:`Metric` by name, or the user's callable).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.probabilities import probability_output
from amp_compiler.errors import OptionError
from amp_compiler.targets import Metric

__all__ = ["ArgmaxAgreement", "ChangedValues", "ErrorMetric", "ErrorStats", "Metric", "MetricFunction",
           "EXACT_ROW", "MIN_ROWS",
           "OutputErrors", "accuracy", "compared_outputs", "exact_accuracy", "is_exact", "metric_name",
           "output_accuracies", "parse_metric", "relative_l2",
           "row_concentration"]

# The user's metric: (FP32 outputs, converted outputs) -> error (0: identical; compared with the limit).
# Each mapping holds every float output by name, one float64 array per sample.
MetricFunction = Callable[[Mapping[str, Sequence[np.ndarray]], Mapping[str, Sequence[np.ndarray]]], float]


ErrorMetric = Metric | MetricFunction


def parse_metric(metric: ErrorMetric | str, option: str = "metric") -> ErrorMetric:
    """``metric`` as an :data:`ErrorMetric`: a name (``"rel-l2"``...), a :class:`Metric` or a callable."""
    if isinstance(metric, Metric) or (callable(metric) and not isinstance(metric, str)):
        return metric
    try:
        return Metric(str(metric))
    except ValueError:
        names = ", ".join(m.value for m in Metric)
        raise OptionError(f"unknown metric {metric!r}: expected {names} or a callable", option=option) from None


def metric_name(metric: ErrorMetric) -> str:
    """The metric in words, for reasons and reports: its name, or the callable's."""
    if isinstance(metric, Metric):
        return metric.value
    return getattr(metric, "__name__", type(metric).__name__)


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
    unmatched: int = 0  # values other than the reference's where it is NaN/inf (a NaN matches a NaN)
    count: int = 0

    def add(self, reference: np.ndarray, got: np.ndarray) -> None:
        r = np.asarray(reference, dtype=np.float64)
        g = np.asarray(got, dtype=np.float64)
        if r.shape != g.shape:
            return
        r, g = r.ravel(), g.ravel()
        self.count += r.size
        finite = np.isfinite(r)
        kept = (r == g) | (np.isnan(r) & np.isnan(g))  # where FP32 is NaN/inf: its own NaN or same-signed inf
        with np.errstate(over="ignore", invalid="ignore"):
            # a NaN or inf where FP32 is finite is an infinite error (g - r would be NaN for a NaN, which
            # every comparison, max's included, passes over)
            d = np.where(finite, np.where(np.isfinite(g), g - r, np.inf), np.where(kept, 0.0, np.inf))
            self.diff2 += float(np.sum(d * d))
            both = finite & np.isfinite(g)
            self.ref2 += float(np.sum(np.where(finite, r * r, 0.0)))
            self.got2 += float(np.sum(np.where(both, g * g, 0.0)))
            self.dot += float(np.sum(np.where(both, r * g, 0.0)))
        self.nonfinite += int(np.count_nonzero(finite & ~np.isfinite(g)))
        self.unmatched += int(np.count_nonzero(~finite & ~kept))
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
    def finite(self) -> bool:
        """No NaN/inf where the reference is finite, and the reference's own NaN/inf kept as they are."""
        return self.nonfinite == 0 and self.unmatched == 0

    def accuracy(self, name: str) -> OutputAccuracy:
        """These statistics as an output's :class:`OutputAccuracy` (when not :attr:`finite`: NaN cosine,
        infinite errors, range 0; not ``measured`` when no reference value was finite, ``empty`` too when
        the reference had no values at all)."""
        if not self.finite:
            return OutputAccuracy(name, math.nan, math.inf, 0.0, False, math.inf)
        return OutputAccuracy(name, self.cosine, self.max_abs, self.value_range, True, self.rel_l2,
                              measured=self.ref_min <= self.ref_max, empty=not self.count)

    @property
    def value_range(self) -> float:
        """The reference's range (max - min); for an output that holds one value (a scalar, a single
        probability) that value's magnitude: an error on it is judged against it, not against 0."""
        if self.ref_max < self.ref_min:
            return 0.0
        return self.ref_max - self.ref_min or max(abs(self.ref_max), abs(self.ref_min))

    @property
    def error_of_range(self) -> float:
        """The largest absolute error as a share of the reference's range (max - min)."""
        span = self.value_range
        if span > 0:
            return self.max_abs / span
        return 0.0 if self.max_abs == 0 else math.inf


@dataclasses.dataclass
class ArgmaxAgreement:
    """Top-1 agreement with FP32 over the last axis, over samples. Each row (the last axis at one
    position of the others) agrees when its argmax is the reference's. A row holding a NaN, in the
    reference or in the converted output, never agrees: a NaN has no rank (numpy's argmax takes it as
    the largest value). An output whose last axis holds fewer than 2 values (a scalar, one logit) has
    no argmax: its rows are not counted, and :attr:`share` stays None."""

    agreeing: int = 0
    rows: int = 0

    def add(self, reference: np.ndarray, got: np.ndarray) -> None:
        r, g = np.asarray(reference), np.asarray(got)
        if r.ndim == 0 or r.shape[-1] < 2 or r.shape != g.shape:
            return
        ranked = ~(np.isnan(r).any(axis=-1) | np.isnan(g).any(axis=-1))
        same = ranked & (np.argmax(r, axis=-1) == np.argmax(g, axis=-1))
        self.agreeing += int(np.count_nonzero(same))
        self.rows += same.size

    @property
    def share(self) -> float | None:
        """The share of rows that agree; None when no row was counted (no argmax)."""
        return self.agreeing / self.rows if self.rows else None


def is_exact(array: np.ndarray) -> bool:
    """Whether an output is compared value by value (:func:`exact_accuracy`): integers and bools (labels,
    indices, class ids), where any difference is a different answer, not a rounding."""
    dtype = np.asarray(array).dtype
    return bool(np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_))


@dataclasses.dataclass
class ChangedValues:
    """An integer or bool output's values that differ from the reference's, over samples: a sample whose
    shape differs (a NonZero that found another count) changes all of its values, the larger count."""

    changed: int = 0
    values: int = 0

    def add(self, reference: np.ndarray, got: np.ndarray) -> bool:
        """One sample's pair; False when the shapes differ."""
        r, g = np.asarray(reference), np.asarray(got)
        if r.shape != g.shape:
            self.changed += max(r.size, g.size)
            self.values += max(r.size, g.size)
            return False
        self.changed += int(np.count_nonzero(r != g))
        self.values += r.size
        return True

    @property
    def share(self) -> float:
        """The share of values changed (0 when none was counted)."""
        return self.changed / self.values if self.values else 0.0


def exact_accuracy(name: str, references: Sequence[np.ndarray], converted: Sequence[np.ndarray]) -> OutputAccuracy:
    """An integer or bool output's accuracy over samples: its :class:`ChangedValues` as
    :attr:`OutputAccuracy.changed`; the float fields are its values' statistics where the shapes match.
    Not ``measured`` (and ``empty``) when neither held a value: nothing was compared."""
    stats, counted = ErrorStats(), ChangedValues()
    for r, g in zip(references, converted, strict=True):
        if counted.add(r, g):
            stats.add(r, g)
    return dataclasses.replace(stats.accuracy(name), changed=counted.changed, values=counted.values,
                               measured=counted.values > 0, empty=not counted.values)


def accuracy(
    name: str, references: Sequence[np.ndarray], converted: Sequence[np.ndarray], *, logistic: bool = False,
    probabilities: bool = True,
) -> OutputAccuracy:
    """One output's accuracy over samples (one reference and one converted array per sample, all their
    values together): cosine, max error, the reference's range, NaN/Inf, relative L2, how far its worst row
    stands above the others (:func:`row_concentration`) and, for a probability output, how certain it was and
    how far a tie moves it (:func:`~amp_compiler.core.probabilities.probability_output`; ``logistic``: each value
    a Sigmoid's, a two-class probability; ``probabilities`` False: those two left unread, for a caller that reads
    them over other samples)."""
    stats = ErrorStats()
    for r, g in zip(references, converted, strict=True):
        r, g = np.ravel(r), np.ravel(g)
        if r.size != g.size:
            raise ValueError(f"{name}: {g.size} values against the reference's {r.size}")
        stats.add(r, g)
    measured = stats.accuracy(name)
    if not measured.finite:
        return measured
    output = probability_output(references, converted, logistic=logistic) if probabilities else None
    return dataclasses.replace(measured, concentration=row_concentration(references, converted),
                               saturated=output.saturated if output else None,
                               tie_move=output.tie_move if output else None)


#: The fewest rows :func:`row_concentration` compares: with fewer, a 90th percentile is one of a handful.
MIN_ROWS = 16
#: A row whose relative error is under this (a quarter of FP16's unit roundoff, 2^-11) is held exactly for
#: :func:`row_concentration`: its rounding was not amplified, and rows such as it (a segmentation map's
#: saturated background: 456x by absolute error, within the stated 0.33-0.86% held out; sweep W) would pull
#: the percentile the others are judged against down to nothing.
EXACT_ROW = 2.0**-13


def row_concentration(references: Sequence[np.ndarray], converted: Sequence[np.ndarray]) -> float | None:
    """The largest relative row error over the 90th percentile of the relative row errors: each row (the last
    axis at one position of the others, over every sample: a token's logits, one pixel's classes) scores its
    largest absolute error where the reference is finite over its largest finite reference magnitude, and rows
    held exactly (under :data:`EXACT_ROW`: a saturated background, a constant row) are left out. Relative,
    as FP16's rounding is: rows of different scales (per-series forecasts of heavy-tailed sizes, sweep W: 474x
    by absolute error, within the stated error held out) are no concentration, a few rows whose rounding the
    model amplified (a Llama's tokens whose massive SwiGLU unit cancels) are. None where fewer than
    :data:`MIN_ROWS` rows are left, a last axis holds one value, or the 90th percentile is 0."""
    rows: list[np.ndarray] = []
    for reference, got in zip(references, converted, strict=True):
        r, g = np.asarray(reference, dtype=np.float64), np.asarray(got, dtype=np.float64)
        if r.ndim < 2 or r.shape[-1] < 2 or r.shape != g.shape or not r.size:
            return None
        finite = np.isfinite(r)
        with np.errstate(invalid="ignore"):
            error = np.where(finite, np.abs(g - r), 0.0).reshape(-1, r.shape[-1]).max(axis=-1)
        scale = np.where(finite, np.abs(r), 0.0).reshape(-1, r.shape[-1]).max(axis=-1)
        rows.append(error[scale > 0] / scale[scale > 0])
    every = np.concatenate(rows) if rows else np.zeros(0)
    every = every[every >= EXACT_ROW]
    if every.size < MIN_ROWS:
        return None
    bulk = float(np.percentile(every, 90))
    return float(every.max()) / bulk if bulk > 0 else None


def compared_outputs(names: Sequence[str], references: Sequence[Sequence[np.ndarray]]) -> list[tuple[int, str, bool]]:
    """(position, name, compared exactly) of the outputs (``names``, in order) that are floats in every sample's
    ``references`` (one array per output), or integers/bools (exact: :func:`is_exact`); others (strings, objects)
    are not compared."""
    out = []
    for k, name in enumerate(names):
        if all(np.issubdtype(np.asarray(r[k]).dtype, np.floating) for r in references):
            out.append((k, name, False))
        elif references and all(is_exact(r[k]) for r in references):
            out.append((k, name, True))
    return out


def output_accuracies(
    names: Sequence[str], references: Sequence[Sequence[np.ndarray]], converted: Sequence[Sequence[np.ndarray]],
    logistic: Collection[str] = (),
) -> list[OutputAccuracy]:
    """Each compared output's accuracy (:func:`compared_outputs`) over the samples, all their values together
    (:func:`accuracy`, :func:`exact_accuracy`; ``logistic``: the outputs a Sigmoid computes)."""
    return [exact_accuracy(name, [r[k] for r in references], [c[k] for c in converted]) if exact
            else accuracy(name, [r[k] for r in references], [c[k] for c in converted], logistic=name in logistic)
            for k, name, exact in compared_outputs(names, references)]


class OutputErrors:
    """A model's float outputs against their references, over samples, under ``metric`` (default
    relative L2): each output's error leaves out the positions where the reference is not finite; an
    output that is not finite where its reference is has an infinite error. What the switched probe
    of ``--tolerance`` and the FP8 budget (:mod:`amp_compiler.onnx.measure.probe`), the FX path's
    end-to-end runs (:mod:`amp_compiler.fx.fp8.stats`) and ``--tolerance``'s conversions compare
    their runs by. A callable metric sees every output (``names``, default ``output0``...) and gives
    one error: :meth:`relative` repeats it per output. Under the argmax metric (:class:`ArgmaxAgreement`)
    an output without an argmax (a last axis of fewer than 2 values) has no top-1 to change: error 0."""

    def __init__(self, outputs: int, metric: ErrorMetric = Metric.REL_L2, names: Sequence[str] | None = None):
        self.metric = metric
        self.names = list(names) if names is not None else [f"output{j}" for j in range(outputs)]
        self.err2 = [0.0] * outputs
        self.ref2 = [0.0] * outputs
        self.stats = [ErrorStats() for _ in range(outputs)]
        self.argmax = [ArgmaxAgreement() for _ in range(outputs)]
        self.samples = 0
        self.kept: tuple[list[list[np.ndarray]], list[list[np.ndarray]]] = ([[] for _ in range(outputs)],
                                                                             [[] for _ in range(outputs)])

    def add(self, reference: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> bool:
        """One sample's outputs (float64); False when one is not finite where its reference is."""
        finite_everywhere = True
        self.samples += 1
        for j, (r, g) in enumerate(zip(reference, got, strict=True)):
            finite = np.isfinite(r)
            if not np.all(np.isfinite(g[finite])):
                self.err2[j] = math.inf
                finite_everywhere = False
                continue
            if self.metric is Metric.REL_L2:
                self.err2[j] += float(np.sum((g[finite] - r[finite]) ** 2))
                self.ref2[j] += float(np.sum(r[finite] ** 2))
            elif self.metric is Metric.ARGMAX:
                self.argmax[j].add(r, g)
            elif isinstance(self.metric, Metric):
                self.stats[j].add(np.where(finite, r, 0.0), np.where(finite, g, 0.0))
            else:
                self.kept[0][j].append(r)
                self.kept[1][j].append(g)
        return finite_everywhere

    def relative(self) -> list[float]:
        """Each output's error under the metric (relative L2: 0 when both sums are 0, infinite for an
        error on a zero reference); infinite where the output was not finite where FP32 is. Raises
        :class:`OptionError` when the argmax metric measured samples and none of the outputs has an
        argmax."""
        if self.metric is Metric.REL_L2:
            return [relative_l2(e, r) for e, r in zip(self.err2, self.ref2, strict=True)]
        failed = [math.isinf(e) for e in self.err2]
        if self.metric is Metric.ARGMAX:
            shares = [a.share for a in self.argmax]
            if self.samples and shares and not any(failed) and all(share is None for share in shares):
                raise OptionError(
                    "the argmax metric measures none of the outputs: the last axis of each holds fewer than 2 "
                    "values (a scalar, one logit); choose another metric", option="metric",
                )
            found = [0.0 if share is None else 1.0 - share for share in shares]
        elif self.metric is Metric.MAX_RANGE:
            found = [s.error_of_range for s in self.stats]
        elif self.metric is Metric.COSINE:
            found = [max(1.0 - s.cosine, 0.0) for s in self.stats]
        else:
            if any(failed):
                return [math.inf] * len(self.err2)
            one = float(self.metric(dict(zip(self.names, self.kept[0], strict=True)),
                                    dict(zip(self.names, self.kept[1], strict=True))))
            return [math.inf if math.isnan(one) else one] * len(self.err2)
        return [math.inf if bad else e for e, bad in zip(found, failed, strict=True)]

    def worst(self) -> float:
        return max(self.relative(), default=0.0)
