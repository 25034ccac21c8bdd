"""--tolerance on held-out samples and under other metrics: the choice is made on the calibration
part, measured on both, and when no unit can stay low the refinement says why in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from amp_compiler.onnx.measure.probe import SwitchProbe
from amp_compiler.onnx.tolerance import refine as refine_module
from amp_compiler.onnx.tolerance.refine import refine
from amp_compiler.options import ConvertOptions
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.targets import Metric
from models import catalog


def _model(name: str, n: int):
    entry = catalog.get(name)
    return catalog.load(entry), [entry.make_inputs(np.random.default_rng(s)) for s in range(n)]


def test_the_tolerance_is_reported_and_met_on_the_held_out_samples_too():
    fp32, samples = _model("decomposed-activations", 4)
    with InProcessRunner() as runner:
        plain = refine(fp32, samples, 1.0, runner=runner)  # the plain conversion meets it
        tol = max([*plain.output_errors.values(), *plain.held_out_errors.values()]) / 2
        r = refine(fp32, samples, tol, runner=runner)
    assert plain.held_out == r.held_out == 2 and set(r.held_out_errors) == set(r.output_errors)
    assert r.met and max(r.output_errors.values()) <= tol and max(r.held_out_errors.values()) <= tol
    assert r.units and r.pinned and r.why_fp32 is None and r.metric == "rel-l2"


def test_no_unit_low_says_which_output_and_how_far_off_in_one_line():
    fp32, samples = _model("mlp-softmax", 3)
    with InProcessRunner() as runner:
        r = refine(fp32, samples, 1e-12, runner=runner)
    assert r.units and r.low_flops_share == 0
    assert r.why_fp32 is not None and "\n" not in r.why_fp32
    assert r.why_fp32.startswith("no unit can stay fp16 within --tolerance 1e-12: the one that moves the outputs least")
    assert f"output '{fp32.graph.output[0].name}' by " in r.why_fp32


@pytest.mark.parametrize("metric", [Metric.ARGMAX, lambda fp32, converted: 0.0])
def test_a_metric_the_plain_conversion_meets_needs_no_units(metric):
    """A classifier held to its top-1 agreement: FP16 moves no argmax, so the plain conversion meets
    a tolerance its relative L2 misses."""
    fp32, samples = _model("mlp-softmax", 3)
    with InProcessRunner() as runner:
        by_l2 = refine(fp32, samples, 1e-9, runner=runner)
        r = refine(fp32, samples, 1e-9, ConvertOptions(metric=metric), runner=runner)
    assert not by_l2.met or by_l2.pinned
    assert r.met and r.units == 0 and not r.pinned and max(r.output_errors.values()) == 0.0


def test_units_beyond_the_tolerance_by_their_tensor_core_op_alone_cost_fewer_runs_for_the_same_choice(monkeypatch):
    fp32, samples = _model("resnet50-small", 4)
    with InProcessRunner() as runner:
        r = refine(fp32, samples, 3e-4, runner=runner)
        every_level = refine_module.unit_choices
        monkeypatch.setattr(refine_module, "unit_choices", lambda *args: every_level(*args[:5], room=math.inf))
        full = refine(fp32, samples, 3e-4, runner=runner)
    assert r.met == full.met and [i for i, _ in r.pinned] == [i for i, _ in full.pinned]
    assert r.output_errors == full.output_errors and r.held_out_errors == full.held_out_errors
    assert r.model_runs < full.model_runs
    assert any("before the" in why for _, why in r.pinned)


def test_when_what_no_unit_controls_misses_the_tolerance_no_unit_is_measured(monkeypatch):
    """silero-vad rounds inside its subgraphs, which no unit's switch controls: 1e-4 is out of reach."""
    switched = []
    measure = SwitchProbe._measure

    def recorded(self, on, *args, **kwargs):
        switched.append(frozenset(on))
        return measure(self, on, *args, **kwargs)

    monkeypatch.setattr(SwitchProbe, "_measure", recorded)
    fp32, samples = _model("silero-vad", 4)
    with InProcessRunner() as runner:
        r = refine(fp32, samples, 1e-4, runner=runner)
    assert r.units and switched and not any(switched)  # only the probe with every switch off ran
    assert r.pinned and all("with every unit in FP32 the probe already moves the outputs by" in why
                            for _, why in r.pinned)
    assert r.why_fp32 is not None and "\n" not in r.why_fp32
    assert r.why_fp32.startswith("no unit can stay fp16 within --tolerance 0.0001: with every unit in FP32 the "
                                 "probe already moves output '")


def test_a_node_the_user_forced_low_is_named_first_among_what_no_unit_controls():
    """x in [2049, 2050] -> Sub 2049 (forced low: FP16 rounds x in steps of 2, the difference is lost) -> MatMul.
    With every unit FP32 the forced Sub alone misses the tolerance; the line blamed FP32's own rounding
    (sweep S's --tolerance run with a Cast no unit switches)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "c"], ["d"], name="shift"), helper.make_node("MatMul", ["d", "w"], ["y"])],
        "forced", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])],
        [numpy_helper.from_array(np.array(2049.0, np.float32), "c"),
         numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w")])
    fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    samples = [{"x": (2049 + rng.random((8, 16))).astype(np.float32)} for _ in range(4)]
    with InProcessRunner() as runner:
        r = refine(fp32, samples, 0.01, ConvertOptions(allow_nodes=("^shift$",)), runner=runner)
    assert r.why_fp32 is not None and "what no unit controls (the node(s) --allow-op/--allow-node forced low " \
                                      "(shift), FP32's own rounding" in r.why_fp32
