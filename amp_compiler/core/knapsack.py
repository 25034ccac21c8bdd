"""The precision choice under an error budget: an exact multiple-choice knapsack.

Each item (a unit of ``--tolerance``, a GEMM of ``--target fp8``) has options: a precision with the
squared error it adds at the model's outputs and what it is worth (FLOPs kept on Tensor Cores, or
in FP8). Errors of independent roundings add roughly in quadrature at the outputs, so a set of
choices is predicted to fit a budget ``b`` when its squared errors sum to at most ``b^2``. The
prediction errs on the safe side: the root of the summed squares of single-unit errors was 12-37%
above the error of all units together (PP-OCRv4's detector and recogniser, resnet50-small), which
is why ``--tolerance`` searches the budget against a measurement.

Guarantees: :func:`choose` returns one option per item, with the most total value among the
choices whose squared errors, each rounded *up* to ``1/steps`` of ``budget^2``, sum to at most
``budget^2``: so never over the budget as predicted. Option 0 of every item must add no error (the
safe choice, FP32); an option with a non-finite error is never chosen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["Option", "choose"]

_MIN_STEPS = 1000
_STEPS_PER_ITEM = 16
_MAX_STEPS = 100_000


@dataclasses.dataclass(frozen=True)
class Option:
    error: float  # what choosing it adds at the outputs (relative L2, alone)
    value: int  # what choosing it is worth (e.g. Tensor Core FLOPs kept in low precision)


def choose(items: Sequence[Sequence[Option]], budget: float, steps: int | None = None) -> list[int]:
    """The chosen option of each item (see module doc). ``steps``: the resolution, ``budget^2`` in that
    many units (default: 16 per item, 1,000 to 100,000)."""
    for options in items:
        if not options or options[0].error != 0:
            raise ValueError("option 0 of every item must exist and add no error")
    if not items or budget <= 0:
        return [0] * len(items)
    steps = steps or min(max(_MIN_STEPS, _STEPS_PER_ITEM * len(items)), _MAX_STEPS)
    best = np.full(steps + 1, -1, dtype=np.int64)  # best[c]: most value with rounded weight exactly c
    best[0] = 0
    picks = np.zeros((len(items), steps + 1), dtype=np.int16)
    weights = [[_weight(o.error, budget, steps) for o in options] for options in items]
    for i, options in enumerate(items):
        new = best + options[0].value
        new[best < 0] = -1
        pick = np.zeros(steps + 1, dtype=np.int16)
        for k in range(1, len(options)):
            w = weights[i][k]
            if w > steps:
                continue
            shifted = np.full(steps + 1, -1, dtype=np.int64)
            shifted[w:] = np.where(best[: steps + 1 - w] >= 0, best[: steps + 1 - w] + options[k].value, -1)
            better = shifted > new
            new = np.where(better, shifted, new)
            pick[better] = k
        best, picks[i] = new, pick
    c = int(np.argmax(best))
    chosen = [0] * len(items)
    for i in range(len(items) - 1, -1, -1):
        chosen[i] = int(picks[i, c])
        c -= weights[i][chosen[i]]
    return chosen


def _weight(error: float, budget: float, steps: int) -> int:
    """``error^2`` in units of ``budget^2 / steps``, rounded up (0 for no error; beyond ``steps``
    for a non-finite one)."""
    if not math.isfinite(error):
        return steps + 1
    if error <= 0:
        return 0
    return math.ceil(error * error / (budget * budget) * steps)

