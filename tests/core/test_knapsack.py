"""The multiple-choice knapsack behind --tolerance: exact, never over the budget, and its refusals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from amp_compiler.core.knapsack import Option, _weight, choose


def _brute_force(items, budget):
    """The most value over every combination whose rounded-up weights fit (what choose promises)."""
    steps = max(1000, 16 * len(items))
    best = -1
    for combo in itertools.product(*(range(len(options)) for options in items)):
        weight = sum(_weight(items[i][k].error, budget, steps) for i, k in enumerate(combo))
        if weight <= steps:
            best = max(best, sum(items[i][k].value for i, k in enumerate(combo)))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_choose_is_the_exact_optimum_and_within_budget(seed):
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(rng.integers(1, 7)):
        options = [Option(0.0, int(rng.integers(0, 3)))]
        for _ in range(rng.integers(1, 3)):
            options.append(Option(float(rng.uniform(0, 0.6)), int(rng.integers(0, 100))))
        items.append(options)
    budget = float(rng.uniform(0.2, 1.0))
    chosen = choose(items, budget)
    assert len(chosen) == len(items) and all(0 <= k < len(o) for k, o in zip(chosen, items))
    assert math.sqrt(sum(items[i][k].error ** 2 for i, k in enumerate(chosen))) <= budget
    assert sum(items[i][k].value for i, k in enumerate(chosen)) == _brute_force(items, budget)


def test_two_levels_keep_the_most_flops_whose_errors_add_in_quadrature():
    # errors 0.6 and 0.8 fit a budget of 1.0 together (0.36 + 0.64), a third one does not
    items = [[Option(0.0, 0), Option(e, v)] for e, v in ((0.6, 10), (0.8, 30), (0.5, 25))]
    assert choose(items, 1.0) == [0, 1, 1]  # 55 FLOPs: 0.8 and 0.5 (0.89), not 0.6 and 0.8 (40)


def test_errorless_options_are_always_taken_and_infinite_ones_never():
    items = [[Option(0.0, 0), Option(0.0, 5)], [Option(0.0, 0), Option(math.inf, 10**9)]]
    assert choose(items, 0.1) == [1, 0]


def test_no_budget_keeps_everything_safe():
    items = [[Option(0.0, 0), Option(0.01, 10)]]
    assert choose(items, 0.0) == [0]
    assert choose([], 1.0) == []


def test_option_zero_must_add_no_error():
    with pytest.raises(ValueError, match="option 0"):
        choose([[Option(0.1, 0), Option(0.2, 1)]], 1.0)
