"""The constant range pass's screens (passes/constants.py): a constant they pass needs no closer look.

Both screens (over many constants' raw bytes at once, and over one array) may only pass a constant
whose full statistics (``range_stats``) give no verdict; they pass trained weights with a few values
that flush to zero without that closer look (their flushes cannot matter at that size and range).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from amp_compiler.passes.analysis.constants import ConstantRangePass, _norm_at_least, range_stats
from amp_compiler.targets import Target

_EDGES = [0.0, -0.0, 1.0, 65504.0, -65504.0, 65505.0, 65519.0, 65520.0, 1e6, np.inf, -np.inf, np.nan,
          2.0**-24, 2.0**-25, 3e-8, 1e-9, -1e-12, 1e-30, 6.1e-5, 3.4e38]


def _arrays():
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 100, 5000):
        for scale in (1e-6, 0.02, 1.0, 300.0):
            base = (rng.standard_normal(size) * scale).astype(np.float32)
            yield base
            for edge in _EDGES:
                arr = base.copy()
                arr[rng.integers(size)] = edge
                yield arr
            tiny = base.copy()
            tiny[: max(1, size // 3)] = 1e-9  # many flushed values: their norm can matter
            yield tiny


@pytest.mark.parametrize("target", [Target.FP16, Target.BF16])
def test_what_the_screens_pass_needs_no_verdict(target):
    p = ConstantRangePass(target)
    value = ir.Value(name="w")
    arrays = list(_arrays())
    grouped = set(p._screen(list(range(len(arrays))), [a.tobytes() for a in arrays]))
    passed = 0
    for k, arr in enumerate(arrays):
        verdict = p._verdict(value, range_stats(arr, target))
        if p._representable(arr):
            assert verdict is None, arr
            passed += 1
        if k in grouped:
            assert verdict is None, arr
            assert p._representable(arr), arr  # the grouped screen passes no more than the other
    assert passed > len(arrays) // 4


def test_trained_weights_with_a_few_flushed_values_pass_without_a_closer_look():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(1 << 20) * 0.02).astype(np.float32)
    w[:50] = 1e-9  # flush to zero in FP16
    w[50] = 1.5  # the largest |x|: whatever flushes is below 2**-24, under 2**-10 of it even summed
    p = ConstantRangePass(Target.FP16)
    assert p._representable(w) and p._screen([7], [w.tobytes()]) == [7]
    assert p._verdict(ir.Value(name="w"), range_stats(w, Target.FP16)) is None


def test_the_norm_bound_is_below_the_norm_and_near_it():
    rng = np.random.default_rng(2)
    for arr in (rng.standard_normal(3_000_001).astype(np.float32), np.full(2_500_000, 3e-4, np.float32),
                np.array([1.0, -2.0], np.float32)):
        exact = float(np.sqrt(np.sum(arr.astype(np.float64) ** 2)))
        assert 0.9 * exact <= _norm_at_least(arr) <= exact
