"""A stated input range is a guarantee, not a sample: a conversion with ``input_ranges`` (CLI
``--input-range``) stays finite under exact emulation for every input within the stated ranges, their
endpoints included, not only on the range probe's draws from them (sweep Q, B: a tabular model's raw
income feature up to 3e5, halved by range scaling from one probe row, gave NaN on 115 of 192 rows)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.runtime.in_process import InProcessRunner
from tests.support.onnx_builders import TABULAR_HIGH, TABULAR_LOW, tabular_model

STATED = (0.0, 3e5)


def _draws() -> list[dict[str, np.ndarray]]:
    """Rows within the stated range: uniform over [0, 3e5] per feature, the features' realistic spans,
    and every corner of the stated box (each feature at 0 or 3e5)."""
    lo, hi = STATED
    out = [{"x": np.random.default_rng(seed).uniform(lo, hi, (64, 4)).astype(np.float32)} for seed in (1, 2)]
    span = TABULAR_HIGH - TABULAR_LOW
    out += [{"x": (TABULAR_LOW + np.random.default_rng(seed).random((64, 4)) * span).round().astype(np.float32)}
            for seed in (100, 101, 102)]
    out.append({"x": np.array(list(itertools.product(STATED, repeat=4)), np.float32)})
    return out


def _check_finite_and_close(fp32: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    emulated = emulate(converted)
    for feeds in _draws():
        ref = run_onnxruntime(fp32, feeds)[0].astype(np.float64)
        got = run_onnxruntime(emulated, feeds)[0]
        bad = int(np.count_nonzero(~np.isfinite(got)))
        assert bad == 0, f"{bad} of {got.size} outputs not finite"
        assert np.abs(got - ref).max() <= 1e-2 * (ref.max() - ref.min())


def test_a_stated_range_keeps_every_input_within_it_finite():
    m = tabular_model()
    result = convert(m, input_ranges={"x": STATED}, runner=InProcessRunner())
    hidden = next(d for d in result.decisions if d.node == "hidden")
    # the first Gemm provably overflows FP16 within the stated range and runs range-scaled in FP16
    assert hidden.rule == "input-range.overflow" and hidden.precision == "fp16", hidden.reason
    _check_finite_and_close(m, result.model)


def test_the_clis_input_range_keeps_every_input_within_it_finite(tmp_path):
    from amp_compiler.cli import main

    m = tabular_model()
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--input-range", "x:0,300000"]) == 0
    _check_finite_and_close(m, onnx.load(tmp_path / "o.onnx"))
