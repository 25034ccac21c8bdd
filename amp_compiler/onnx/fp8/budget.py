"""FP8 end to end: the error each GEMM in FP8 adds at the model's outputs, and the FP8 set that fits
an error budget with the most FP8 FLOPs.

Why: a GEMM's own output error with FP8 inputs is about the same 2-5% everywhere (3 mantissa bits);
what differs is how much of it reaches the outputs (a classifier or an LM head next to the output,
a CNN's stem). The fp8-research measurements (benchmarks/notes_fp8.md, section 5) show that the
single-GEMM end-to-end error on calibration data predicts held-out data (rank correlation 0.97-0.99)
and that errors add in quadrature.

Guarantees:
- the steps (:mod:`amp_compiler.onnx.fp8.steps`) run one switched probe (:mod:`amp_compiler.onnx.measure.probe`:
  the FP32 model with an FP8 switch per candidate) over the samples: once with every switch off (the
  reference), once per candidate with its switch alone on, and with the sets :func:`choose_verified`
  measures. The error of a run is the worst relative L2 over the float outputs, against the all-off run.
- :func:`choose_within_budget` returns the set with the most FLOPs whose predicted error (the
  quadrature sum of single errors) is within the budget: an exact 0/1 knapsack over errors^2 rounded
  up to 1/1000 of the budget^2 (never over the budget as predicted).
- :func:`grow_within_budget` adds to a set that fits the budget, one at a time, the GEMMs left out whose
  measured total with the set still fits: errors of different GEMMs partly cancel, so the quadrature
  prediction can leave budget unused (resnet50-small: 9.4% used of 10%, and its classifier, predicted
  at 10.15%, measures 9.96%). It tries at most :data:`GROW_TRIES` of them (one run over the samples
  each), those whose predicted total is within :data:`GROW_REACH` times the budget, the most FLOPs
  per error^2 first; the total never exceeds the budget as measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from amp_compiler.core.knapsack import Option, choose
from amp_compiler.onnx.costs.costs import estimate, iter_nodes
from amp_compiler.passes.onnx.qdq import Fp8Candidate

_STEPS = 1000  # knapsack resolution: budget^2 in this many units
GROW_TRIES = 8  # end-to-end runs spent trying GEMMs the prediction left out
GROW_REACH = 1.25  # ... whose predicted total with the set is at most this many times the budget


def candidate_flops(model: onnx.ModelProto, candidates: Sequence[Fp8Candidate],
                    sample: dict[str, np.ndarray]) -> list[int]:
    """Estimated FLOPs of each candidate at the sample's input shapes (at least 1)."""
    shapes = {k: tuple(v.shape) for k, v in sample.items()}
    costs = estimate(model, shapes)
    by_output = {n.output[0]: c.flops for n, c in zip(iter_nodes(model), costs.nodes, strict=False) if n.output}
    return [max(int(by_output.get(c.node.outputs[0].name, 0)), 1) for c in candidates]


def choose_within_budget(errors: Sequence[float], flops: Sequence[int], budget: float) -> frozenset[int]:
    """The indices with the most total FLOPs whose quadrature sum of ``errors`` is within ``budget``
    (see module doc): :func:`amp_compiler.core.knapsack.choose` with two options per GEMM; candidates with a
    non-finite error are never chosen."""
    picks = choose([[Option(0.0, 0), Option(e, f)] for e, f in zip(errors, flops, strict=True)], budget, steps=_STEPS)
    return frozenset(k for k, pick in enumerate(picks) if pick)


def choose_verified(
    error: Callable[[frozenset[int]], float], singles: Sequence[float], flops: Sequence[int], budget: float
) -> tuple[frozenset[int], float]:
    """:func:`choose_within_budget`, then the chosen set measured as a whole (``error``) and shrunk,
    the most error per FLOP first, until it fits, then grown by the candidates left out whose
    measured total still fits (:func:`grow_within_budget`); the set and its measured error."""
    chosen = set(choose_within_budget(singles, flops, budget))
    total = error(frozenset(chosen)) if chosen else 0.0
    while chosen and total > budget:  # the prediction missed: drop the most error per FLOP
        chosen.discard(max(chosen, key=lambda k: singles[k] ** 2 / flops[k]))
        total = error(frozenset(chosen)) if chosen else 0.0
    total = grow_within_budget(error, chosen, total, singles, flops, budget)  # or the other way
    return frozenset(chosen), total


def grow_within_budget(error: Callable[[frozenset[int]], float], chosen: set[int], total: float,
                       errors: Sequence[float], flops: Sequence[int], budget: float) -> float:
    """Add to ``chosen`` (whose measured error is ``total``, within ``budget``) the candidates whose
    measured total still fits (see module doc); returns the new total."""
    rest = sorted((k for k in range(len(errors)) if k not in chosen and math.isfinite(errors[k])),
                  key=lambda k: errors[k] ** 2 / flops[k])
    tries = 0
    for k in rest:
        if tries == GROW_TRIES:
            break
        if math.hypot(total, errors[k]) > GROW_REACH * budget:
            continue
        tries += 1
        trial = error(frozenset(chosen | {k}))
        if trial <= budget:
            chosen.add(k)
            total = trial
    return total


def budget_reason(local: str, statistics: str, single: float, flops: int, budget: float, total: float,
                  chosen: bool, low: str = "FP16") -> str:
    """Why a GEMM whose local statistics passed is in FP8 or not, with its end-to-end numbers:
    ``local`` is the sentence of its local choice, ``statistics`` that sentence's statistics part,
    ``low`` the fallback's name."""
    alone = f"alone in FP8 it moves the model's outputs by {single:.2%} (relative L2 vs FP32, worst output)"
    if chosen:
        return f"{local}; {alone}, all FP8 GEMMs together {total:.2%} (budget {budget:.0%})"
    return (
        f"kept {low}: {alone}, too much for its {flops:.3g} FLOPs within the FP8 error budget "
        f"{budget:.0%} (the FP8 GEMMs together: {total:.2%}); its own statistics: {statistics}"
    )
