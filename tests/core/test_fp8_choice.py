"""The FP8 choice both paths make: the budget as the verified choice with two options per GEMM (an
exact knapsack when the measurement is the prediction, never over the budget as measured, filled with
what the measured total still fits), the statistics' formula, and reasons built from their parts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from amp_compiler.core.choice import VerifiedChoice
from amp_compiler.core.fp8_choice import BudgetChoice, Fp8Stats, LocalChoice, budget_reason, choose_within_budget
from amp_compiler.core.knapsack import Option


def _quadrature(errors):
    """A measurement that is exactly the knapsack's prediction: errors add in quadrature."""
    return lambda on: float(np.sqrt(sum(errors[k] ** 2 for k in on)))


def _chosen(errors, flops, budget):
    return choose_within_budget(_quadrature(errors), errors, flops, budget).chosen


def test_budget_choice_is_an_exact_knapsack():
    # A stem-like GEMM with most FLOPs and a large error: greedy by error per FLOP takes the two small
    # ones first and then cannot take the big one; the most FLOPs within the budget is the big one alone.
    errors, flops = [0.09, 0.05, 0.05], [1000, 10, 10]
    assert _chosen(errors, flops, 0.1) == {0}
    assert _chosen(errors, flops, 0.2) == {0, 1, 2}
    assert _chosen([0.03, float("inf")], [1, 100], 0.1) == {0}
    assert _chosen(errors, flops, 0.0) == frozenset()
    # never over the budget as predicted (quadrature sum)
    rng = np.random.default_rng(0)
    for _ in range(50):
        e, f = rng.uniform(0, 0.08, 8), rng.integers(1, 1000, 8)
        chosen = _chosen(list(e), list(f), 0.1)
        assert np.sqrt(sum(e[i] ** 2 for i in chosen)) <= 0.1


class _FakeEndToEnd:
    """Measured errors of sets: errors of GEMMs 0 and 1 cancel in part (their sum is less than the
    quadrature sum); GEMM 3's does not."""

    def __init__(self, errors):
        self.errors, self.runs = errors, 0

    def error(self, on):
        self.runs += 1
        total = float(np.sqrt(sum(self.errors[k] ** 2 for k in on)))
        return total * 0.9 if {0, 1} <= on else total


def _fill(e2e, errors, flops, chosen, total, budget):
    """The verified choice's fill step for two options per GEMM, from ``chosen`` measured at ``total``."""
    items = [[Option(0.0, 0), Option(e, f)] for e, f in zip(errors, flops, strict=True)]
    choice = VerifiedChoice(items, lambda picks: e2e.error(frozenset(k for k, p in enumerate(picks) if p)), budget)
    picks, total = choice.fill(tuple(int(k in chosen) for k in range(len(errors))), total)
    return {k for k, p in enumerate(picks) if p}, total


def test_grow_adds_what_the_measured_total_fits_and_nothing_else():
    errors, flops = [0.08, 0.065, 0.09, 0.07], [100, 50, 10, 40]
    chosen, total = _fill(_FakeEndToEnd(errors), errors, flops, {0}, 0.08, 0.1)
    # with GEMM 1: predicted 10.3% (over the budget), measured 9.3%: added; then GEMM 3 measures 11.2%
    assert chosen == {0, 1} and total == pytest.approx(0.9 * np.hypot(0.08, 0.065))
    e2e = _FakeEndToEnd(errors)
    none_fit, total = _fill(e2e, errors, flops, {2}, 0.09, 0.1)
    assert total == 0.09 and none_fit == {2}
    assert e2e.runs == 3  # each tried once, measured over the budget


def test_a_budget_the_prediction_misses_is_met_as_measured():
    """Errors that add more than in quadrature (here 30% more): the knapsack's set at the budget
    measures over it; the choice searches below, then fills, and what it returns measures within."""
    errors, flops = [0.05, 0.04, 0.03, 0.06], [400, 300, 200, 500]
    e2e = _FakeEndToEnd(errors)

    def measured(on):
        e2e.runs += 1
        return 1.3 * float(np.sqrt(sum(errors[k] ** 2 for k in on)))

    found = choose_within_budget(measured, errors, flops, 0.1)
    chosen, total = found.chosen, found.error
    # every set worth more than 900 FLOPs measures over 10%, and so does {0, 3} (predicted 7.8%,
    # measured 10.2%); {0, 1, 2}, as many FLOPs, measures 9.2%
    assert chosen == {0, 1, 2} and total == pytest.approx(1.3 * math.sqrt(0.005)) and total <= 0.1


def test_the_whole_set_within_the_budget_costs_one_run():
    errors = [0.01, 0.02]
    e2e = _FakeEndToEnd(errors)
    found = choose_within_budget(e2e.error, errors, [10, 20], 0.1)
    chosen, total = found.chosen, found.error
    assert chosen == {0, 1} and total == pytest.approx(0.9 * math.hypot(0.01, 0.02))
    assert e2e.runs == 1


def test_statistics_come_from_their_sums():
    assert Fp8Stats.from_sums(4.0, 100.0, 1, 50) == Fp8Stats(0.2, 0.02)
    assert Fp8Stats.from_sums(0.0, 0.0, 0, 0) == Fp8Stats(0.0, 0.0)
    assert Fp8Stats.from_sums(1.0, 0.0, 0, 0).rel_error == math.inf  # an error on a zero reference
    assert Fp8Stats.from_sums(float("nan"), 1.0, 0, 0).rel_error == math.inf


def test_reasons_are_built_from_their_parts():
    local = LocalChoice(Fp8Stats(0.03, 0.001), 0.1, 0.01, ("input 0 scale 0.01 per tensor (amax 4.48)",
                                                              "weight 1 scales per output channel (axis 1)"),
                        "BF16", " through Q/DQ")
    assert local.allowed
    assert local.statistics.startswith("output error 3.00% with FP8 inputs vs BF16 inputs")
    assert "smallest normal 2^-6 (limit 1%)" in local.statistics and local.statistics.endswith("(axis 1)")
    assert local.reason == f"FP8 E4M3 inputs through Q/DQ: {local.statistics}"
    chosen = budget_reason(local, 0.02, 1000, 0.1, BudgetChoice(frozenset({0}), 0.05), True)
    assert chosen.startswith(local.reason + "; alone in FP8 it moves the model's outputs by 2.00%")
    assert chosen.endswith("all FP8 GEMMs together 5.00% (budget 10%)")
    kept = budget_reason(local, 0.09, 1000, 0.1, BudgetChoice(frozenset(), 0.095), False)
    assert kept.startswith("kept BF16: alone in FP8") and kept.endswith(f"its own statistics: {local.statistics}")
    refused = LocalChoice(Fp8Stats(0.2, 0.0), 0.1, 0.01, ())
    assert not refused.allowed and refused.reason.startswith("kept FP16: FP8 E4M3 inputs would cost too much: ")


def test_a_set_that_misses_the_budget_on_held_out_samples_is_tightened():
    """The calibration samples see each GEMM's error in quadrature; the held-out ones see 1.5 times
    as much: the set filled up to the budget on the calibration samples misses it held out, and
    the choice is made again under a tightened limit until it holds there too."""
    errors, flops = [0.04, 0.04, 0.04, 0.04, 0.04, 0.04], [10] * 6
    fit = _quadrature(errors)

    def held(on):
        return 1.5 * fit(on)

    loose = choose_within_budget(fit, errors, flops, 0.1)
    assert len(loose.chosen) == 6 and 1.5 * loose.error > 0.1  # without held-out samples: every GEMM
    found = choose_within_budget(fit, errors, flops, 0.1, held=held)
    assert found.held is not None and found.held <= 0.1 and found.error <= 0.1
    assert 0 < len(found.chosen) < 6
    reason = budget_reason(LocalChoice(Fp8Stats(0.03, 0.0), 0.1, 0.01, ()), 0.04, 10, 0.1, found, True)
    assert f"{found.held:.2%} on held-out samples" in reason
