"""The choice within an error limit, verified by measurement: the knapsack's prediction, measured,
searched and filled. The one loop behind ``--tolerance`` and the FP8 budget (ONNX and FX).

Each item (a unit of ``--tolerance``, a GEMM of the FP8 budget) has options (:class:`Option`:
the error it adds alone at the outputs, what it is worth), option 0 the safe one. The knapsack
(:mod:`amp_compiler.core.knapsack`) predicts which options fit a budget by adding their errors in
quadrature; the prediction is not exact in either direction (errors partly cancel, or add more),
so every choice is measured (``measure``: the worst output error of a run with the chosen options,
the error metric's one home for the caller) before it is kept:

1. the most valuable choice (every item's most valuable option of finite error), when it is
   predicted within ``first`` (and below ``above``), is measured first: when it fits nothing is
   worth more;
2. search: the knapsack's choice for budgets around ``first``, below ``above`` (a budget whose
   choice let the caller down; by default the one at which every item's worst finite option is
   predicted to fit), measured; a budget that fits moves the next one up, one that misses moves it
   down (geometric halving, at most :data:`SEARCH_STEPS` budgets); the most valuable choice that
   fits is kept;
3. fill: the knapsack's choices jump as the budget grows, and what lies between two of them often
   still fits: single items are moved up one option at a time, the most value per added squared
   error first, each kept when the measured whole still fits. At most :data:`FILL_TRIES` are
   measured, among those whose predicted total (the measured whole and the added error, in
   quadrature) is within :data:`FILL_REACH` times the limit (and, below a budget that let the
   caller down, whose prediction is below it).

Held-out samples: the samples measured above are the calibration samples the choice is fitted on;
a choice filled up to the limit on them may miss it on inputs it did not see (ppocr-cls at the FP8
budget 10%: 8.89% on the calibration samples, 14.50% held out). With ``held`` (the error of a choice
on held-out samples), the chosen choice is measured there too; when it misses the limit there, the
limit on the calibration samples is tightened by how far it missed (its calibration error times
``limit / held-out error``) and the choice made again below the budget that chose it, at most
:data:`TIGHTEN_STEPS` times; where its calibration error is 0 (a metric that counts, argmax agreement,
finding no change there), the budget the search starts from is halved instead.

Guarantees: :meth:`VerifiedChoice.choose` returns a choice whose measured error is within the
limit (and, with ``held``, whose held-out error is within it too), or option 0 everywhere (with its
error, ``base``) when no choice is measured within; a choice is measured at most once per
:class:`VerifiedChoice` and sample set (:attr:`VerifiedChoice.runs` counts them), so calling
:meth:`~VerifiedChoice.choose` again below a budget that let the caller down measures only what is
new.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from amp_compiler.core.knapsack import Option, choose

__all__ = ["FILL_REACH", "FILL_TRIES", "SEARCH_STEPS", "TIGHTEN_STEPS", "Verified", "VerifiedChoice", "hold_out"]

SEARCH_STEPS = 8  # knapsack budgets measured by the search
TIGHTEN_STEPS = 4  # choices made again under a tightened limit when the held-out samples miss it
FILL_TRIES = 16  # single upgrades measured by the fill
FILL_REACH = 1.25  # ... among those whose predicted total is at most this many times the limit


T = TypeVar("T")


def hold_out(samples: Sequence[T], share: float) -> tuple[list[T], list[T]]:
    """The samples to choose on and those held out: the last ``share`` of them (at least one when
    ``share`` > 0), none from fewer than 2 samples."""
    n = len(samples)
    held = 0 if n < 2 or share <= 0 else min(max(int(n * share), 1), n - 1)
    return list(samples[: n - held]), list(samples[n - held:])


@dataclasses.dataclass(frozen=True)
class Verified:
    picks: tuple[int, ...]  # the option chosen per item
    error: float  # its measured error
    budget: float  # the knapsack budget that chose it before the fill (0: none measured within)
    held: float | None = None  # its measured error on the held-out samples (None: none held out)
    limit: float | None = None  # the limit on the calibration samples it was chosen within (tightened or not)


class VerifiedChoice:
    """The choice among ``items`` within ``limit`` (see module doc). ``measure(picks)``: the error of
    the choice ``picks`` (an option per item), measured; ``base``: the error of option 0 everywhere
    (what no item controls), known without a measurement; ``held(picks)``: the error of ``picks`` on
    held-out samples, ``held_base`` that of option 0 everywhere there (see module doc)."""

    def __init__(self, items: Sequence[Sequence[Option]], measure: Callable[[tuple[int, ...]], float],
                 limit: float, base: float = 0.0, *, held: Callable[[tuple[int, ...]], float] | None = None,
                 held_base: float = 0.0):
        self.items, self.measure, self.limit, self.target = items, measure, limit, limit
        zeros = tuple(0 for _ in items)
        self.measured: dict[tuple[int, ...], float] = {zeros: base}
        self.held_out = held
        self.held_measured: dict[tuple[int, ...], float] = {zeros: held_base}

    @property
    def runs(self) -> int:
        """Choices measured so far (on the calibration samples, and on the held-out ones)."""
        return len(self.measured) - 1 + len(self.held_measured) - 1

    def held_error(self, picks: Sequence[int]) -> float:
        """The measured error of ``picks`` on the held-out samples (measured once)."""
        assert self.held_out is not None
        key = tuple(picks)
        if key not in self.held_measured:
            self.held_measured[key] = self.held_out(key)
        return self.held_measured[key]

    def error(self, picks: Sequence[int]) -> float:
        """The measured error of ``picks`` (measured once)."""
        key = tuple(picks)
        if key not in self.measured:
            self.measured[key] = self.measure(key)
        return self.measured[key]

    def value(self, picks: Sequence[int]) -> int:
        return sum(options[k].value for options, k in zip(self.items, picks, strict=True))

    def predicted(self, picks: Sequence[int]) -> float:
        """The knapsack's prediction of ``picks``' error: its options' errors in quadrature."""
        return math.sqrt(sum(options[k].error ** 2 for options, k in zip(self.items, picks, strict=True)))

    def most(self) -> tuple[int, ...]:
        """Every item's most valuable option of finite error (the latest among equals)."""
        out = []
        for options in self.items:
            finite = [k for k, o in enumerate(options) if math.isfinite(o.error)]
            out.append(max(finite, key=lambda k: (options[k].value, k)))
        return tuple(out)

    def choose(self, first: float | None = None, above: float | None = None) -> Verified:
        """The choice (see module doc): ``first`` is the budget the search starts from (default: the
        limit); ``above`` a budget whose choice let the caller down, which the search stays below
        (default: none; the search stays below the budget that fits every item's worst finite option).
        With held-out samples, a choice that misses the limit there is made again under a tightened
        limit (see module doc)."""
        first = self.limit if first is None else first
        found = self.fitted(first, above)
        if self.held_out is None:
            return dataclasses.replace(found, limit=self.limit)
        for _ in range(TIGHTEN_STEPS):
            held = self.held_error(found.picks)
            if held <= self.target or not any(found.picks):
                return dataclasses.replace(found, held=held, limit=self.limit)
            # It fits the calibration samples, not the held-out ones: ask the calibration samples for
            # as much less as the held-out ones missed by, below the budget that chose it.
            tightened = min(found.error, self.limit) * self.target / held if math.isfinite(held) else found.error / 2
            if tightened > 0:
                first *= tightened / self.limit
                self.limit = tightened
            else:  # the calibration samples measure no error for it (a metric that counts, argmax): a smaller budget
                first /= 2
            found = self.fitted(first, found.budget if found.budget > 0 else None)
        zeros = tuple(0 for _ in self.items)
        if found.picks != zeros and self.held_error(found.picks) <= self.target:
            return dataclasses.replace(found, held=self.held_error(found.picks), limit=self.limit)
        return Verified(zeros, self.error(zeros), 0.0, self.held_error(zeros), self.limit)

    def fitted(self, first: float, above: float | None = None) -> Verified:
        """Steps 1-3 of the module doc on the calibration samples, within :attr:`limit`."""
        most = self.most()
        whole = self.predicted(most)
        cap = math.inf if above is None else above
        if above is None:
            above = math.sqrt(sum(max((o.error ** 2 for o in options if math.isfinite(o.error)), default=0.0)
                                  for options in self.items))
        if whole <= first and whole < cap:
            if self.error(most) <= self.limit:
                return Verified(most, self.error(most), whole)
            above = min(above, whole)  # it missed: what the search finds is worth less
        found = self.search(first, above, most)
        picks, error = self.fill(found.picks, found.error, cap)
        return Verified(picks, error, found.budget)

    def search(self, first: float, above: float, most: tuple[int, ...] | None = None) -> Verified:
        """Step 2 of the module doc: the most valuable choice the knapsack makes for a budget below
        ``above`` that is measured within the limit (option 0 everywhere when none is)."""
        options = [list(item) for item in self.items]
        zeros = tuple(0 for _ in self.items)
        best, best_value = Verified(zeros, self.error(zeros), 0.0), -1
        below, budget = 0.0, min(first, above * 0.99)
        for _ in range(SEARCH_STEPS):
            picks = tuple(choose(options, budget))
            if self.error(picks) <= self.limit:
                worth = self.value(picks)
                if worth > best_value:
                    best, best_value = Verified(picks, self.error(picks), budget), worth
                below = budget
                if picks == most:
                    break
            else:
                above = budget
            budget = math.sqrt(below * above) if below > 0 else above / 2
        return best

    def fill(self, picks: Sequence[int], error: float, below: float = math.inf) -> tuple[tuple[int, ...], float]:
        """Step 3 of the module doc, from ``picks`` whose measured error is ``error``, among choices
        predicted below ``below``: the choice and its measured error."""
        current = tuple(picks)
        ups = []
        for i, options in enumerate(self.items):
            for k in range(current[i] + 1, len(options)):
                gain = options[k].value - options[current[i]].value
                cost = options[k].error ** 2 - options[current[i]].error ** 2
                if gain > 0 and math.isfinite(cost):
                    ups.append((gain / max(cost, 1e-300), i, k))
        ups.sort(key=lambda up: -up[0])  # the most value per added squared error first; ties: item order
        tries = 0
        for _, i, k in ups:
            if tries == FILL_TRIES:
                break
            if k <= current[i]:  # moved up past k already
                continue
            added = self.items[i][k].error ** 2 - self.items[i][current[i]].error ** 2
            trial = current[:i] + (k,) + current[i + 1:]
            if math.sqrt(max(error ** 2 + added, 0.0)) > FILL_REACH * self.limit or self.predicted(trial) >= below:
                continue
            tries += trial not in self.measured
            measured = self.error(trial)
            if measured <= self.limit:
                current, error = trial, measured
        return current, error
