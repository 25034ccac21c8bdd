"""Calibration-driven numerics: observed ranges keep overflowing/underflowing tensors in FP32, and
--tolerance keeps low the units worth the most Tensor Core FLOPs whose measured errors fit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.analysis import analyze
from amp_compiler.onnx.convert import ConvertOptions
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.tolerance.refine import refine
from amp_compiler.runtime.samples import CalibrationDataError, load_samples
from tests.support.onnx_builders import F32, ffn_overflow_model, model, tensor, vi


def _rng(seed=0):
    return np.random.default_rng(seed)



def cnn_big_activation_model():
    """A CNN whose first conv outputs ~1e5 (a detector-style un-normalised stem) and whose
    BatchNorm has a variance of 1e10 to bring them back: FP16 overflows at the conv already."""
    r = _rng(3)
    c = 8
    w1 = (r.standard_normal((c, 3, 3, 3)) * 8e3).astype(np.float32)  # representable weights
    w2 = (r.standard_normal((c, c, 3, 3)) / 8).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("BatchNormalization", ["c1", "s", "b", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["act"], name="relu"),
        helper.make_node("Conv", ["act", "w2"], ["out"], pads=[1, 1, 1, 1], name="head"),
    ]
    inits = [
        tensor("w1", w1), tensor("w2", w2), tensor("s", np.ones(c, np.float32)),
        tensor("b", np.zeros(c, np.float32)), tensor("mean", np.zeros(c, np.float32)),
        tensor("var", np.full(c, 1e10, np.float32)),
    ]
    return model(nodes, [vi("x", F32, [1, 3, 16, 16])], [vi("out", F32, [1, c, 16, 16])], inits)


def underflow_model():
    """Tiny activations (~5e-9, below FP16's smallest subnormal) from representable constants,
    feeding a Log: FP16 flushes them to zero and the Log gives -inf. (A Tanh first makes them a
    learned feature rather than a linear transform of the raw input, which the signal-path rule
    would keep FP32 without calibration.)"""
    d = 32
    w = (_rng(2).standard_normal((d, d)) * 1e-5).astype(np.float32)  # representable (subnormal)
    nodes = [
        helper.make_node("Tanh", ["x"], ["feature"], name="feature"),
        helper.make_node("Mul", ["feature", "k"], ["small"], name="scale"),
        helper.make_node("MatMul", ["small", "w"], ["tiny"], name="tiny_mm"),
        helper.make_node("Abs", ["tiny"], ["mag"], name="abs"),
        helper.make_node("Log", ["mag"], ["out"], name="log"),
    ]
    inits = [tensor("w", w), tensor("k", np.array(1e-4, np.float32))]
    return model(nodes, [vi("x", F32, [4, d])], [vi("out", F32, [4, d])], inits)


def _samples(m, n=3):
    name = m.graph.input[0].name
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return [{name: _rng(10 + i).standard_normal(shape).astype(np.float32)} for i in range(n)]


def _accuracy(m, converted, samples):
    """Against FP32, with FP16 storage emulated exactly (onnxruntime's CPU provider computes most
    FP16 ops in FP32 and drops the rounding in between, which would hide overflow and underflow)."""
    ref = run_onnxruntime(m, samples[0])[0]
    got = run_onnxruntime(emulate(converted), samples[0])[0]
    return compare("out", ref, got)


def test_ffn_overflow_breaks_plain_fp16_and_calibration_fixes_it():
    m = ffn_overflow_model()
    samples = _samples(m)
    plain = convert(m, probe=False)
    assert not _accuracy(m, plain.model, samples).finite  # inf/NaN without calibration
    ranges = collect_ranges(m, samples)
    assert ranges["y"].absmax > 65504
    calibrated = convert(m, ranges=ranges, probe=False, range_fallback="bf16")  # the pins, and their BF16 fallback
    validate(calibrated.model)
    acc = _accuracy(m, calibrated.model, samples)
    assert acc.finite and acc.cosine >= 0.999
    d = {x.node: x for x in calibrated.decisions}
    assert d["ffn_out"].precision == "bf16" and d["ffn_out"].rule == "calibration.overflow"  # range fallback
    assert "beyond FP16's range" in d["ffn_out"].reason
    assert d["proj_in"].precision == d["ffn_in"].precision == d["proj_out"].precision == "fp16"
    report = analyze(m, ConvertOptions(probe=False), calibration_data=None).report  # static: no ranges
    assert report.summary.accuracy and not report.summary.accuracy[0].finite


def test_ffn_overflow_keeps_most_tensor_core_flops_low(tmp_path):
    m = ffn_overflow_model()
    path = tmp_path / "samples"
    path.mkdir()
    for i, s in enumerate(_samples(m)):
        np.savez(path / f"{i}.npz", **s)
    report = analyze(m, ConvertOptions(), calibration_data=path).report
    tc = [n for n in report.nodes if n.op_type == "MatMul"]
    low = sum(n.flops for n in tc if n.precision == "fp16")
    assert low / sum(n.flops for n in tc) > 0.5
    assert report.summary.calibration_samples == 3
    assert report.summary.accuracy[0].finite and report.summary.accuracy[0].cosine >= 0.999
    ffn_out = next(n for n in report.nodes if n.name == "ffn_out")
    assert ffn_out.range is not None and ffn_out.range.absmax > 65504
    assert ffn_out.error is not None


def test_underflow_breaks_plain_fp16_and_calibration_fixes_it():
    m = underflow_model()
    samples = _samples(m)
    assert not _accuracy(m, convert(m, probe=False).model, samples).finite  # Log(0) = -inf
    ranges = collect_ranges(m, samples)
    assert ranges["tiny"].underflow_share > 0.9
    calibrated = convert(m, ranges=ranges, probe=False, range_fallback="bf16")  # the pins, and their BF16 fallback
    d = {x.node: x for x in calibrated.decisions}
    assert d["tiny_mm"].precision == "bf16" and d["tiny_mm"].rule == "calibration.underflow"  # range fallback
    acc = _accuracy(m, calibrated.model, samples)
    assert acc.finite and acc.cosine >= 0.999


def test_cnn_activation_overflow_needs_calibration():
    m = cnn_big_activation_model()
    samples = _samples(m)
    plain = convert(m, probe=False)
    d = {x.node: x for x in plain.decisions}
    assert d["bn"].rule == "constant.overflow"  # the static rule sees the variance...
    assert not _accuracy(m, plain.model, samples).finite  # ...but the conv output overflows first
    calibrated = convert(m, ranges=collect_ranges(m, samples), probe=False, range_fallback="bf16")
    d = {x.node: x for x in calibrated.decisions}
    # the observed input range bounds the stem statically: a conv over it provably overflows
    assert d["stem"].precision == "fp32" and d["stem"].rule == "input-range.overflow"
    assert d["head"].precision == "fp16"
    acc = _accuracy(m, calibrated.model, samples)
    assert acc.finite and acc.cosine >= 0.999


def test_clip_before_log_is_safe_with_and_without_calibration():
    from models import catalog

    entry = catalog.get("clip-log")
    m = catalog.load(entry)
    samples = [entry.make_inputs(_rng(s)) for s in range(2)]
    for ranges in (None, collect_ranges(m, samples)):
        r = convert(m, ranges=ranges, probe=False)
        assert {x.node: x for x in r.decisions}["clip"].precision == "fp32"
        acc = _accuracy(m, r.model, samples)
        assert acc.finite and acc.cosine >= 0.999


def test_bf16_needs_no_range_rules():
    m = ffn_overflow_model()
    ranges = collect_ranges(m, _samples(m))
    d = {x.node: x for x in convert(m, target="bf16", ranges=ranges, probe=False).decisions}
    assert d["ffn_out"].precision == "bf16"


def test_calibration_data_file_and_folder(tmp_path):
    m = ffn_overflow_model()
    samples = _samples(m, 2)
    np.savez(tmp_path / "one.npz", **samples[0])
    assert len(load_samples(tmp_path / "one.npz", m)) == 1
    folder = tmp_path / "many"
    folder.mkdir()
    for i, s in enumerate(samples):
        np.savez(folder / f"s{i}.npz", **s)
    assert len(load_samples(folder, m)) == 2


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"nope": np.zeros((8, 64), np.float32)}, "'nope' is not an input"),
        ({"x": np.zeros((8, 65), np.float32)}, "has shape 8x65, the model expects 8x64"),
        ({"x": np.zeros((8, 64), np.float64)}, "is float64, the model expects float32"),
        ({}, "holds no arrays"),
        ({"other_input": np.zeros((8, 64), np.float32)}, "'other_input' is not an input"),
    ],
)
def test_calibration_data_that_does_not_match_the_model(tmp_path, arrays, message):
    m = ffn_overflow_model()
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(CalibrationDataError, match=message):
        load_samples(tmp_path / "bad.npz", m)


def test_tolerance_meets_the_target_by_measuring_each_unit():
    from models import catalog

    entry = catalog.get("mobilenetv2-small")
    m = catalog.load(entry)
    samples = [entry.make_inputs(_rng(s)) for s in range(2)]
    before = convert(m, probe=False)
    ref = run_onnxruntime(m, samples[0])[0]
    got = run_onnxruntime(emulate(before.model), samples[0])[0]
    baseline = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    tol = baseline / 2  # plain FP16 misses it by 2x
    r = refine(m, samples, tol)
    assert r.met and max(r.output_errors.values()) <= tol
    # one plain conversion, then the chosen one (more only when the probe's prediction misses)
    assert 2 <= r.rounds <= 5 and r.history[0][0] == 0
    # probe runs: the base, at most two options per unit, eight budgets and 16 upgrades per choice;
    # then the conversions
    assert r.model_runs <= len(samples) * (1 + 2 * r.units + 24 * (r.rounds - 1) + r.rounds)
    assert 0 < len(r.pinned) < len(m.graph.node)
    assert 0 < r.low_flops_share <= r.ceiling <= 1
    pinned = [x for x in r.result.decisions if x.rule == "tolerance.pinned"]
    assert pinned and all(x.precision == "fp32" and "pinned by --tolerance" in x.reason for x in pinned)
    kept = [x for x in r.result.decisions if x.rule == "tolerance.kept-low"]
    assert kept and all(x.precision == "fp16" and "kept by --tolerance" in x.reason for x in kept)
    assert any(x.precision == "fp16" for x in r.result.decisions if x.op_type == "Conv")


@pytest.mark.parametrize("count, prepacked", [(1, False), (4, False), (32, True)])
def test_calibration_prepacks_the_pieces_weights_only_where_enough_samples_pay_for_it(count, prepacked):
    """A range probe's or a few samples' pieces load without prepacking (ViT-B: 0.04 s against 0.35 s);
    from 32 samples on, the runs it saves pay for it. The ranges are the same either way."""
    from amp_compiler.runtime.runner import InProcessRunner

    class Recording(InProcessRunner):
        def load_chain(self, models, **kwargs):
            self.prepack = kwargs.get("prepack", True)
            return super().load_chain(models, **kwargs)

    m = ffn_overflow_model()
    rng = np.random.default_rng(0)
    name = m.graph.input[0].name
    dims = [d.dim_value or 2 for d in m.graph.input[0].type.tensor_type.shape.dim]
    samples = [{name: rng.standard_normal(dims).astype(np.float32)} for _ in range(count)]
    runner = Recording()
    ranges = collect_ranges(m, samples, runner=runner)
    assert runner.prepack is prepacked
    assert {o for n in m.graph.node for o in n.output} <= set(ranges)


def test_calibration_folds_a_constant_once_not_in_every_run():
    """A Constant node's values are the same in every run: folded once in this process, as ``count`` runs
    of them, where the runs fold the rest (ppocr-v4-det: 342 of its 672 tensors)."""
    import onnx

    from amp_compiler.runtime.runner import InProcessRunner

    c = np.array([[0.5, -3.0, 1e-9]], np.float32)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(c)),
         helper.make_node("Mul", ["x", "c"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g", [vi("x", F32, [2, 3])], [vi("z", F32, [2, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    class Recording(InProcessRunner):
        def statistics(self, key):
            stats = super().statistics(key)
            self.folded = set(stats)
            return stats

    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(3)]
    runner = Recording()
    ranges = collect_ranges(m, samples, runner=runner)
    assert runner.folded == {"y", "z"}
    assert (ranges["c"].min, ranges["c"].max, ranges["c"].absmax, ranges["c"].count) == (-3.0, 0.5, 3.0, 9)
    assert ranges["c"].underflow_share == pytest.approx(1 / 3)  # 1e-9 flushes in FP16
