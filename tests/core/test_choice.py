"""The verified choice behind --tolerance and the FP8 budget: the most valuable choice measured first,
the budget search, the fill step that upgrades items the measurement still finds within the limit, a
measurement per choice, and a result always measured within the limit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from amp_compiler.core.choice import FILL_TRIES, VerifiedChoice
from amp_compiler.core.knapsack import Option, choose


def _items(errors):
    return [[Option(0.0, 0), Option(e, v)] for e, v in errors]


def _on(picks):
    return frozenset(k for k, p in enumerate(picks) if p)


def test_search_returns_the_best_choice_the_measurement_finds_within_the_tolerance():
    items = _items([(0.6, 10), (0.8, 30), (0.5, 25)])

    def measured(on):  # the prediction (quadrature) overestimates by 30%
        return 0.7 * math.sqrt(sum(items[k][1].error ** 2 for k in on))

    found = VerifiedChoice(items, lambda picks: measured(_on(picks)), 1.0).choose(1.0, 2.0)
    assert measured(_on(found.picks)) <= 1.0 and found.error == measured(_on(found.picks))
    assert found.picks == (1, 1, 1)  # all three measure 0.87: more than the prediction (1.24) allows
    assert found.budget > 1.0


def test_fill_upgrades_a_unit_when_the_measured_whole_still_fits():
    items = _items([(0.6, 10), (0.8, 30)])
    seen = []

    def measured(on):
        seen.append(on)
        return 0.9 if on == frozenset({0, 1}) else 0.5

    fill = VerifiedChoice(items, lambda picks: measured(_on(picks)), 1.0).fill
    assert fill((0, 1), 0.5) == ((1, 1), 0.9)  # predicted 1.0, measured 0.9
    assert VerifiedChoice(items, lambda picks: 1.1, 1.0).fill((0, 1), 1.1) == ((0, 1), 1.1) and seen


def test_the_most_valuable_choice_is_measured_first_and_alone_when_it_fits():
    items = [[Option(0.0, 0), Option(0.02, 5), Option(0.03, 9)], [Option(0.0, 0), Option(0.01, 3)]]
    measured = []
    choice = VerifiedChoice(items, lambda picks: measured.append(picks) or 0.02, 0.05)
    found = choice.choose()
    assert found.picks == (2, 1) and found.error == 0.02 and measured == [(2, 1)] and choice.runs == 1
    # a budget below it (the caller's conversion missed): the search stays below, measuring only new choices
    below = choice.choose(above=found.budget)
    assert below.picks != (2, 1) and below.budget < found.budget and measured.count((2, 1)) == 1


def test_each_choice_is_measured_once():
    items = _items([(0.3, 10), (0.4, 20), (0.5, 30), (0.2, 5)])
    counts: dict[tuple[int, ...], int] = {}

    def measured(picks):
        counts[picks] = counts.get(picks, 0) + 1
        return 1.1 * math.sqrt(sum(items[i][k].error ** 2 for i, k in enumerate(picks)))

    choice = VerifiedChoice(items, measured, 0.6)
    first = choice.choose()
    second = choice.choose(above=first.budget)
    assert set(counts.values()) == {1} and choice.runs == len(counts)
    assert first.error <= 0.6 and second.error <= 0.6


def test_nothing_within_the_limit_gives_the_safe_choice():
    items = _items([(0.3, 10), (0.4, 20)])
    found = VerifiedChoice(items, lambda picks: 1.0, 0.1, base=0.05).choose()
    assert found.picks == (0, 0) and found.error == 0.05


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("factor", [0.8, 1.0, 1.25])
def test_the_choice_stays_within_the_limit_and_leaves_no_upgrade_that_fits(seed, factor):
    """Errors that partly cancel (factor < 1), add as predicted (1) or add more (> 1): the choice measures
    within the limit, is worth at least the knapsack's prediction at the limit when that fits, and the
    fill leaves no single item that could move up one option and still fit."""
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(int(rng.integers(2, 7))):
        n = int(rng.integers(2, 4))
        errors = np.sort(rng.uniform(0.01, 0.08, n - 1))
        values = np.cumsum(rng.integers(1, 100, n - 1))
        items.append([Option(0.0, 0)] + [Option(float(e), int(v)) for e, v in zip(errors, values, strict=True)])
    assert sum(len(options) - 1 for options in items) <= FILL_TRIES  # the fill can try every upgrade

    def measured(picks):
        return factor * math.sqrt(sum(items[i][k].error ** 2 for i, k in enumerate(picks)))

    limit = float(rng.uniform(0.03, 0.12))
    choice = VerifiedChoice(items, measured, limit)
    found = choice.choose()
    assert found.error == measured(found.picks) <= limit
    predicted = tuple(choose(items, limit))
    if measured(predicted) <= limit:
        assert choice.value(found.picks) >= choice.value(predicted)
    for i, options in enumerate(items):
        for k in range(found.picks[i] + 1, len(options)):
            assert measured(found.picks[:i] + (k,) + found.picks[i + 1:]) > limit
    best = max(choice.value(picks) for picks in itertools.product(*(range(len(o)) for o in items))
               if measured(picks) <= limit)
    assert choice.value(found.picks) >= 0.9 * best  # near the exhaustive optimum, in at most 25 measurements
    assert choice.runs <= 1 + 8 + FILL_TRIES


def test_hold_out_keeps_the_last_share_of_the_samples():
    from amp_compiler.core.choice import hold_out

    assert hold_out([1, 2, 3, 4, 5, 6, 7, 8], 0.25) == ([1, 2, 3, 4, 5, 6], [7, 8])
    assert hold_out([1, 2, 3], 0.25) == ([1, 2], [3])  # at least one
    assert hold_out([1], 0.5) == ([1], []) and hold_out([1, 2], 0.0) == ([1, 2], [])


def test_a_choice_that_misses_on_held_out_samples_is_tightened_until_it_holds():
    """Held-out samples see 1.6 times the calibration samples' error: the choice filled to the limit on
    the calibration samples misses there, and the limit there is tightened until it holds."""
    items = [[Option(0.0, 0), Option(0.3, 10)] for _ in range(8)]

    def fit(picks):
        return math.sqrt(sum(0.09 for p in picks if p))

    loose = VerifiedChoice(items, fit, 1.0).choose()
    assert sum(loose.picks) == 8 or 1.6 * loose.error > 1.0
    choice = VerifiedChoice(items, fit, 1.0, held=lambda picks: 1.6 * fit(picks))
    found = choice.choose()
    assert found.held is not None and found.held <= 1.0 and found.error <= found.limit < 1.0
    assert sum(found.picks) == 4  # 4 x 0.3 in quadrature: 0.6 calibration, 0.96 held out
    assert sum(loose.picks) > sum(found.picks)


def test_a_held_out_miss_that_no_tightening_fixes_gives_option_zero():
    items = [[Option(0.0, 0), Option(0.1, 10)] for _ in range(3)]
    found = VerifiedChoice(items, lambda picks: 0.1 * any(picks), 1.0, held=lambda picks: 2.0 * any(picks)).choose()
    assert found.picks == (0, 0, 0) and found.held == 0.0


def test_a_held_out_miss_that_the_calibration_samples_measure_as_zero_tightens_the_budget():
    """A metric that counts (argmax agreement) can be 0 on the calibration samples and not on the held-out
    ones: the limit cannot be tightened by their ratio (it became 0, then 0/0: a ZeroDivisionError out of
    --tolerance --metric argmax); the budget is, until the held-out samples hold."""
    items = [[Option(0.0, 0), Option(0.1, 10)] for _ in range(4)]

    def held(picks):  # two units together flip a label the calibration samples do not hold
        return 0.5 * max(0, sum(picks) - 2)

    found = VerifiedChoice(items, lambda picks: 0.0, 0.01, held=held).choose()
    assert found.held is not None and found.held <= 0.01
    assert 0 < sum(found.picks) <= 2
