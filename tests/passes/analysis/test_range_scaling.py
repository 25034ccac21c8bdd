"""Range scaling: Tensor Core ops only FP16's range keeps out of FP16 run in FP16 on power-of-two
scaled operands, where the observed ranges say the shift costs the tensors' bulk nothing; else BF16."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper
from onnx_ir.passes import PostconditionError

from amp_compiler import convert
from amp_compiler.core.measures import (
    BINADE_HIGH,
    BINADE_LOW,
    TensorRange,
    binade_counts,
    fp16_relative_error,
    shift_room,
    shift_rooms,
)
from amp_compiler.onnx.graph.intervals import reached_magnitudes, static_bounds
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.passes.analysis import RangeScalingPass
from amp_compiler.passes.analysis.pipeline import AnalysisSettings, analysis_passes, run_passes
from amp_compiler.passes.analysis.range_scaling import FP16_MAX, least_shift
from amp_compiler.policy import default_table
from amp_compiler.runtime import child_folds
from amp_compiler.runtime.in_process import InProcessRunner
from amp_compiler.targets import Target
from tests.support.onnx_builders import F32, model, tabular_model, tensor, vi, weights

FP16 = onnx.TensorProto.FLOAT16


def test_shifts():
    assert least_shift(1000.0, 8.0) == 0
    assert least_shift(FP16_MAX, 1.0) == 0 and least_shift(FP16_MAX * 1.01, 1.0) == 1
    assert least_shift(3.6e5, 8.0) == 6  # 3.6e5 * 8 / 2^6 = 45000
    assert fp16_relative_error(-14) == 2.0**-11 and fp16_relative_error(-20) == 2.0**-5
    assert fp16_relative_error(-26) == 1.0  # flushed
    assert shift_room([]) == -1  # nothing known: no shift


def test_shift_room_is_where_fp16_keeps_bf16s_precision_on_average():
    ones = binade_counts(np.ones(100))  # every value 2^0: normal down to a shift of 14
    # shifted by 2^-k a value of 1 is 2^-k: normal to k = 14, then 2^(k-25) relative: 2^-8 at k = 17
    assert shift_room(ones) == 17
    # values FP16 already holds as subnormals lose more with every shift: 2^-20 is 2^-5 off, 2^-21 2^-4
    assert shift_room(binade_counts(np.full(100, 2.0**-20))) == 0
    # values that flush unshifted lose nothing more: a DFT basis's numerical zeros beside its bulk
    assert shift_room(binade_counts(np.concatenate([np.ones(95), np.full(5, 1e-12)]))) == 17
    # a tail of 1% small values costs the shift: flushed, each adds 1 to the sum, 1% of them 2.5x BF16's loss
    tail = binade_counts(np.concatenate([np.ones(99), [2.0**-10]]))
    assert shift_room(tail) < 17
    # a calibration's every tensor at once, each as alone
    histograms = [ones, binade_counts(np.full(100, 2.0**-20)), tail, [0] * len(ones)]
    assert shift_rooms(histograms).tolist() == [17, 0, shift_room(tail), -1]
    # the child's histogram and this one agree on their bins
    assert (child_folds.EXPONENT_LOW, child_folds.EXPONENT_HIGH) == (BINADE_LOW, BINADE_HIGH)
    x = np.random.default_rng(0).standard_normal(850).astype(np.float32)
    assert child_folds.array_stats(np, x)[child_folds.HISTOGRAM] == binade_counts(np.abs(x))


def _conv_head(opset: int = 17):
    """Conv(3x3, weights ~2e4) -> Relu -> Conv(1x1, bias): the first Conv's output reaches about 1e5
    (beyond FP16), the second reads it: the detection-head pattern, at an opset where onnx's Conv takes
    no BF16."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 4, 3, 3)) * 2e4).astype(np.float32)
    w2 = (rng.standard_normal((2, 8, 1, 1)) * 0.05).astype(np.float32)
    return model(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="hidden", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="out")],
        [vi("x", F32, [1, 4, 16, 16])], [vi("y", F32, [1, 2, 16, 16])],
        [tensor("w1", w1), tensor("b1", np.zeros(8, np.float32)), tensor("w2", w2),
         tensor("b2", np.full(2, 0.5, np.float32))],
        opset=opset,
    )


def _samples(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(0, 1, (1, 4, 16, 16)).astype(np.float32)} for _ in range(n)]


def _decisions(result):
    return {d.node: d for d in result.decisions}


def test_a_conv_beyond_fp16_runs_in_fp16_on_scaled_operands_exactly():
    m = _conv_head()
    ranges = collect_ranges(m, _samples(2), runner=InProcessRunner())
    assert max(ranges["h"].absmax, ranges["r"].absmax) > FP16_MAX  # the pattern: FP16 overflows inside
    r = convert(m, ranges=ranges)
    d = _decisions(r)
    for node in ("hidden", "out"):
        # pinned for overflow (the static bound of the inputs calibration observed, or calibration itself)
        assert d[node].precision == "fp16" and d[node].rule in ("calibration.overflow", "input-range.overflow"), node
        assert "power-of-two scales" in d[node].reason
    assert d["relu"].precision == "fp32"  # the elementwise op between them keeps FP32's range
    out = r.model
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    hidden = next(n for n in out.graph.node if n.name == "hidden")
    w = inits[hidden.input[1]]
    assert w.dtype == np.float16
    shift = -int(np.log2(np.float64(w.ravel()[0]) / np.float64(numpy_helper.to_array(m.graph.initializer[0]).ravel()[0])))
    # the weight is the FP32 weight times 2^-shift, rounded to FP16 once (a power of two: exact)
    w32 = numpy_helper.to_array(m.graph.initializer[0])
    np.testing.assert_array_equal(w, (w32 * np.float32(2.0**-shift)).astype(np.float16))
    # the product comes back in FP32, times 2^shift
    mul = next(n for n in out.graph.node if n.op_type == "Mul" and n.name == "hidden/unscale_output")
    assert float(inits[mul.input[1]]) == 2.0**shift
    assert sum(n.op_type == "Mul" for n in out.graph.node) == 3  # unscale both, scale the Relu's output
    read = {i for n in out.graph.node for i in n.input}
    assert all(t.name in read for t in out.graph.initializer)  # the FP32 weights their copies replaced are gone
    onnx.checker.check_model(out, full_check=True)
    # exact emulation on held-out inputs: finite, FP16-accurate, every Tensor Core op low
    for x in _samples(3, seed=7):
        ref = run_onnxruntime(m, x)[0]
        got = run_onnxruntime(emulate(out), x)[0]
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_bf16_and_fp32_fallbacks_leave_such_a_conv_fp32_at_opset_17():
    m = _conv_head()
    ranges = collect_ranges(m, _samples(2), runner=InProcessRunner())
    for fallback in ("bf16", "fp32"):
        d = _decisions(convert(m, ranges=ranges, range_fallback=fallback))
        assert d["hidden"].precision == d["out"].precision == "fp32", fallback


def _outlier_matmul(op: str = "MatMul"):
    """x @ W, x of 64 tokens by 32 channels, W constant (32 x 16); as a Gemm, W stored transposed
    (``transB``) and a bias of 16."""
    if op == "Gemm":
        return model(
            [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="mm", transB=1)],
            [vi("x", F32, [64, 32])], [vi("y", F32, [64, 16])],
            [tensor("w", np.ascontiguousarray(weights((32, 16)).T)), tensor("b", np.linspace(-2, 2, 16, dtype=np.float32))],
        )
    return model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, [64, 32])], [vi("y", F32, [64, 16])], [tensor("w", weights((32, 16)))],
    )


def _outlier_samples(tail: bool, where: str = "channel", n: int = 2, seed: int = 3):
    """x whose channel 0 (``where="channel"``, as massive activations lie) or token 0 (``"token"``) is
    4e5, its product beyond FP16; with ``tail`` a fifth of x's values are tiny (1e-5), so that a shift
    of all of x would push them toward FP16's subnormals, where they keep less than BF16's precision."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((64, 32)).astype(np.float32)
        if where == "channel":
            x[:, 0] = 4e5
        else:
            x[0, :] = 4e5
        if tail:
            x[1:, 1:8] = rng.uniform(1e-5, 3e-5, (63, 7)).astype(np.float32)
        out.append({"x": x})
    return out


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("where", ["channel", "token"])
def test_a_shift_that_would_push_the_bulk_below_bf16s_precision_takes_bf16(tail, where):
    """Large values in one channel: only that channel is shifted (per channel), the tail keeps its bits.
    In one token, across every channel: every channel needs the shift, the tail would lose its bits to
    it, and the MatMul takes BF16; without the tail the shifts serve (x's all alike, the product's per
    channel)."""
    m = _outlier_matmul()
    ranges = collect_ranges(m, _outlier_samples(tail, where), runner=InProcessRunner())
    d = _decisions(convert(m, ranges=ranges))["mm"]
    assert d.rule in ("calibration.overflow", "input-range.overflow")
    if where == "channel":
        assert d.precision == "fp16" and "power-of-two scales per channel" in d.reason
    elif tail:
        assert d.precision == "bf16" and "power-of-two" not in d.reason
    else:
        assert d.precision == "fp16" and "power-of-two scales" in d.reason


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_a_matmul_scaled_per_channel_is_exact_but_for_fp16s_rounding(op):
    """The weight is W[k, n] * 2^(a_k - c_n) rounded to FP16 once (a Gemm's as it stores W, transposed),
    a Gemm's bias b[n] * 2^-c_n, x's channels are multiplied by 2^-a and the product's by 2^c in FP32;
    on held-out inputs the output is as close to FP32 as FP16 rounding allows, 4x closer than BF16's."""
    m = _outlier_matmul(op)
    ranges = collect_ranges(m, _outlier_samples(True), runner=InProcessRunner())
    peaks = ranges["x"].channel_peaks
    assert peaks is not None and peaks.channels == 32 and peaks.peaks[0] == (0, 4e5) and peaks.rest < 10
    r = convert(m, ranges=ranges)
    out = r.model
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    mm = next(n for n in out.graph.node if n.name == "mm")
    scale_in = next(n for n in out.graph.node if n.name == "mm/scale_input0")
    unscale = next(n for n in out.graph.node if n.name == "mm/unscale_output")
    a = -np.log2(inits[scale_in.input[1]].astype(np.float64))
    c = np.log2(inits[unscale.input[1]].astype(np.float64))
    assert a.shape == (32,) and c.shape == (16,)
    assert a[0] == least_shift(4e5, 8.0) and not a[1:].any()  # only the large channel is shifted
    assert c.min() > 0  # every product channel reads channel 0
    w32 = numpy_helper.to_array(m.graph.initializer[0])
    factor = np.exp2(a[:, None] - c[None, :])
    expected = (w32.astype(np.float64) * (factor.T if op == "Gemm" else factor)).astype(np.float16)
    np.testing.assert_array_equal(inits[mm.input[1]], expected)
    if op == "Gemm":
        b32 = numpy_helper.to_array(m.graph.initializer[1]).astype(np.float64)
        np.testing.assert_array_equal(inits[mm.input[2]], (b32 * np.exp2(-c)).astype(np.float16))
    onnx.checker.check_model(out, full_check=True)
    bf16 = convert(m, ranges=ranges, range_fallback="bf16").model
    for x in _outlier_samples(True, n=3, seed=11):
        ref = run_onnxruntime(m, x)[0].astype(np.float64)
        got = run_onnxruntime(emulate(out), x)[0]
        other = run_onnxruntime(emulate(bf16), x)[0]
        error = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert np.isfinite(got).all() and error < 2e-3
        assert error < np.linalg.norm(other - ref) / np.linalg.norm(ref) / 4


def test_ranges_without_a_histogram_give_no_scaling():
    """Ranges from elsewhere (an older report) carry no ``low``: nothing says a shift is harmless."""
    m = _conv_head()
    ranges = collect_ranges(m, _samples(2), runner=InProcessRunner())
    bare = {k: TensorRange(v.min, v.max, v.absmax, v.underflow_share, v.subnormal_share, v.count) for k, v in ranges.items()}
    d = _decisions(convert(m, ranges=bare))
    # onnx's Conv takes no BF16 at opset 17, so without scaling it stays FP32
    assert d["hidden"].precision == "fp32" and "power-of-two" not in d["hidden"].reason


def test_the_inserted_nodes_say_what_they_are():
    m = _conv_head()
    r = convert(m, ranges=collect_ranges(m, _samples(2), runner=InProcessRunner()))
    inserted = [d for d in r.decisions if d.rule == "range-scaling.mul"]
    assert {d.node for d in inserted} == {"hidden/unscale_output", "out/scale_input0", "out/unscale_output"}
    assert all(d.precision == "fp32" and "power-of-two" in d.reason for d in inserted)


def test_the_summary_line_counts_range_scaled_ops_and_the_probes_note_what_they_took(tmp_path, capsys):
    """The CLI's default conversion (the range probe on): the head's two Convs overflow on generated
    inputs and run range-scaled in FP16; the summary line and the probe's note say so."""
    from amp_compiler.cli import main

    onnx.save(_conv_head(), tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 0
    out = capsys.readouterr().out
    assert "Tensor Core ops in fp16: 2/2 (range-scaled: 2)" in out
    assert "node(s) kept out of plain fp16 by them (fp16 scaled 2, fp32 1)" in out


class _IgnoresBounds(RangeScalingPass):
    """Scales from the observed ranges alone, as if no static bound were known."""

    def call(self, graph, plan):
        RangeScalingPass(self.ranges).call(graph, plan)


def _tabular_plan(scaling: type[RangeScalingPass] | None = None):
    """The tabular model's plan with the stated range x in [0, 3e5] and the observed ranges of one row
    drawn within it (the range probe's draw: income, channel 2, at 12292, far below its bound)."""
    m = tabular_model()
    ranges = collect_ranges(m, [{"x": np.array([[191088, 80936, 12292, 4958]], np.float32)}], runner=InProcessRunner())
    model_ir = ir.from_proto(onnx.shape_inference.infer_shapes(m, strict_mode=True))
    reached = reached_magnitudes(static_bounds(model_ir, {"x": (0.0, 3e5)}))
    graph = build_precision_graph(model_ir, Target.FP16, default_table())
    settings = AnalysisSettings(Target.FP16, ranges=ranges, ranges_generated=True, reached=reached,
                                stated_reached=reached, range_fallback="scaled")
    passes = analysis_passes(settings)  # the pipeline's RangeScalingPass reads the static bounds
    if scaling is not None:
        passes = [scaling(p.ranges, reached=p.reached) if isinstance(p, RangeScalingPass) else p for p in passes]
    plan = run_passes(graph, passes, check=True)
    return graph, plan, ranges, reached


def test_a_static_bound_beyond_the_observed_channel_peaks_sets_every_channels_least_shift():
    """A stated range is a guarantee, not a sample: x reaches 3e5 in any channel, h 2.3e5, whatever the
    probe's one row showed. Each channel's shift is at least the one its peak (times the margin) needs
    and at least the one the tensor's static bound needs, so the bound fits FP16 in every channel."""
    graph, plan, ranges, reached = _tabular_plan()
    assert reached["x"] == 3e5 and reached["h"] > FP16_MAX  # the static bounds: beyond FP16
    hidden = next(v for v in graph.vertices if v.node is not None and v.node.name == "hidden")
    scaling = plan.scalings[hidden.id]
    assert scaling.per_channel
    observed = [least_shift(b, 8.0) for b in ranges["x"].channel_peaks.bounds()]
    assert list(scaling.inputs) == [max(s, least_shift(3e5, 1.0)) for s in observed] == [5, 4, 3, 3]
    assert reached["x"] * 2.0 ** -min(scaling.inputs) <= FP16_MAX
    assert min(scaling.outputs) >= least_shift(reached["h"], 1.0)
    assert reached["h"] * 2.0 ** -min(scaling.outputs) <= FP16_MAX
    assert scaling.headroom >= 1.0


def test_the_check_catches_scaling_that_ignores_the_static_bounds():
    with pytest.raises(PostconditionError, match="static bound"):
        _tabular_plan(_IgnoresBounds)
