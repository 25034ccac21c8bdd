"""The FP8 choice per GEMM, framework-neutral (the ONNX and FX paths both make it): a GEMM's local
statistics against their limits, the set within the end-to-end error budget, and the reasons.

Why two steps: a GEMM's own output error with FP8 inputs is about the same 2-5% everywhere (3
mantissa bits); what differs is how much of it reaches the outputs (a classifier or an LM head next
to the output, a CNN's stem). The local statistics rule out what FP8 cannot hold (values below its
smallest normal, a large local error); the budget then keeps the set with the most FP8 FLOPs whose
error at the outputs fits. The fp8-research measurements (benchmarks/notes_fp8.md, section 5) show
that the single-GEMM end-to-end error on calibration data predicts held-out data (rank correlation
0.97-0.99) and that errors add in quadrature.

Guarantees:
- :meth:`Fp8Stats.from_sums` is the one formula of the local statistics from the sums both paths
  accumulate (relative L2 with FP8 inputs against fallback inputs: :func:`amp_compiler.core.tensor_error.relative_l2`;
  the share of nonzero scaled activation values below the format's smallest normal).
- :func:`choose_within_budget` is the FP8 budget as :class:`amp_compiler.core.choice.VerifiedChoice`
  with two options per GEMM (its fallback, and FP8 with its error alone and its FLOPs): the set's
  measured error is within the budget (empty when no set is), on the held-out samples too when
  some are (a set that misses there is tightened: :mod:`amp_compiler.core.choice`).
- A GEMM under :data:`LEAST_FLOP_SHARE` of the model's Tensor Core FLOPs is no candidate for the budget
  (:func:`negligible_share`): FP8 would buy it no speed, only its rounding.
- Reasons are built once, from their parts as data (:class:`LocalChoice`, :func:`budget_reason`):
  nothing reads a sentence back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from amp_compiler.core.choice import VerifiedChoice
from amp_compiler.core.fp8_numbers import Fp8Format
from amp_compiler.core.knapsack import Option
from amp_compiler.core.tensor_error import ErrorMetric, Metric, metric_name, relative_l2

__all__ = [
    "LEAST_FLOP_SHARE", "BudgetChoice", "Fp8Stats", "LocalChoice", "budget_reason", "choose_within_budget",
    "negligible_share",
]


@dataclasses.dataclass(frozen=True)
class Fp8Stats:
    rel_error: float  # ||GEMM(FP8 inputs) - GEMM(FP16 inputs)|| / ||GEMM(FP16 inputs)||
    subnormal_share: float  # nonzero scaled activation values below FP8's smallest normal, over all nonzero ones

    @classmethod
    def from_sums(cls, err2: float, ref2: float, below: float, nonzero: float) -> Fp8Stats:
        """The statistics from their sums over the samples: squared error and squared reference of the
        GEMM's output, scaled activation values below the smallest normal and nonzero ones (a
        non-finite error counts as infinite)."""
        rel = relative_l2(err2, ref2)
        return cls(rel if math.isfinite(rel) else math.inf, below / nonzero if nonzero else 0.0)


@dataclasses.dataclass(frozen=True)
class LocalChoice:
    """A GEMM's choice by its local statistics, as data: the statistics and their limits, how its FP8
    inputs are scaled (``scales``, in words), the fallback's name, and how the path feeds FP8
    inputs (``via``: the ONNX path's " through Q/DQ")."""

    stats: Fp8Stats
    max_error: float
    max_subnormal: float
    scales: tuple[str, ...]
    low: str = "FP16"
    via: str = ""

    @property
    def allowed(self) -> bool:
        """Whether the statistics allow FP8 inputs (both within their limits)."""
        return self.stats.rel_error <= self.max_error and self.stats.subnormal_share <= self.max_subnormal

    @property
    def measured(self) -> str:
        """The statistics and their limits, in words."""
        normal = int(math.log2(Fp8Format.E4M3.smallest_normal))
        return (
            f"output error {self.stats.rel_error:.2%} with FP8 inputs vs {self.low} inputs on the calibration "
            f"data (limit {self.max_error:.0%}), {self.stats.subnormal_share:.2%} of scaled input values below "
            f"FP8's smallest normal 2^{normal} (limit {self.max_subnormal:.0%})"
        )

    @property
    def statistics(self) -> str:
        """The statistics and the scales, in words."""
        return "; ".join([self.measured, ", ".join(self.scales)])

    @property
    def reason(self) -> str:
        """Why the GEMM takes FP8 inputs or not, by its local statistics alone."""
        if not self.allowed:
            return f"kept {self.low}: FP8 E4M3 inputs would cost too much: {self.measured}"
        return f"FP8 E4M3 inputs{self.via}: {self.statistics}"


@dataclasses.dataclass(frozen=True)
class BudgetChoice:
    """The GEMMs (indices) in FP8 and their measured error together, on the calibration samples and
    on the held-out ones (None: none held out)."""

    chosen: frozenset[int]
    error: float
    held: float | None = None


#: A GEMM under this share of the model's Tensor Core FLOPs takes no FP8 inputs: FP8 would buy it no
#: measurable speed and cost it FP8's rounding. A GRU classifier's 10-class head Gemm (10.3k FLOPs, 0.003% of
#: its 374 MFLOPs) was the one GEMM the ONNX budget put in FP8, its output error rel-L2 3e-4 -> 0.053 (sweep Y);
#: a 100-layer decoder's smallest projection is about 0.25% of its FLOPs.
LEAST_FLOP_SHARE = 1e-3


def negligible_share(flops: int, total: int, low: str) -> str:
    """Why a GEMM of ``flops`` among ``total`` Tensor Core FLOPs stays in the fallback ``low`` ("FP16"), or ""
    where its share is not negligible (:data:`LEAST_FLOP_SHARE`)."""
    if total <= 0 or flops >= LEAST_FLOP_SHARE * total:
        return ""
    return (f"kept {low}: its {flops:.3g} FLOPs are {flops / total:.3%} of the model's Tensor Core FLOPs, "
            f"under {LEAST_FLOP_SHARE:.1%}: FP8 inputs would buy no measurable speed, only FP8's rounding")


def choose_within_budget(
    error: Callable[[frozenset[int]], float], singles: Sequence[float], flops: Sequence[int], budget: float,
    base: float = 0.0, *, held: Callable[[frozenset[int]], float] | None = None,
) -> BudgetChoice:
    """The GEMMs in FP8 (see module doc): ``error`` measures a set in FP8, ``singles`` are each GEMM's
    error alone, ``base`` the error with none in FP8; ``held`` measures a set on held-out samples."""
    items = [[Option(0.0, 0), Option(e, f)] for e, f in zip(singles, flops, strict=True)]

    def on(picks: tuple[int, ...]) -> frozenset[int]:
        return frozenset(k for k, pick in enumerate(picks) if pick)

    found = VerifiedChoice(items, lambda picks: error(on(picks)), budget, base,
                           held=(lambda picks: held(on(picks))) if held is not None else None).choose()
    return BudgetChoice(on(found.picks), found.error, found.held)


def budget_reason(local: LocalChoice, single: float, flops: int, budget: float, total: BudgetChoice, chosen: bool,
                  metric: ErrorMetric = Metric.REL_L2) -> str:
    """Why a GEMM whose local statistics passed is in FP8 or not, with its end-to-end numbers."""
    what = "relative L2" if metric is Metric.REL_L2 else metric_name(metric)
    alone = f"alone in FP8 it moves the model's outputs by {single:.2%} ({what} vs FP32, worst output)"
    together = f"{total.error:.2%}" + (f", {total.held:.2%} on held-out samples" if total.held is not None else "")
    if chosen:
        return f"{local.reason}; {alone}, all FP8 GEMMs together {together} (budget {budget:.0%})"
    return (
        f"kept {local.low}: {alone}, too much for its {flops:.3g} FLOPs within the FP8 error budget "
        f"{budget:.0%} (the FP8 GEMMs together: {together}); its own statistics: {local.statistics}"
    )
