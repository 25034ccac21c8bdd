"""The switched probe of --tolerance and the FP8 budget: every group on is the emulated conversion (bit
for bit), every group off is the FP32 model (up to FP32's own rounding), an FP8 switch on the FP32 model
is the Q/DQ arithmetic bit for bit, and the models it is given stay as they were."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.shape_inference
import onnx_ir as ir
import pytest

from amp_compiler import convert
from amp_compiler.core.fp8_numbers import dequantize, quantize
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.onnx.fp8.stats import fp8_candidates
from amp_compiler.onnx.load.opset import raise_opset
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.measure.probe import SwitchProbe, build_probe, switch_name
from amp_compiler.onnx.tolerance.units import partition
from amp_compiler.policy import default_table
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.targets import Metric
from models import catalog
from tests.support.fp8_builders import conv_net, mlp


def _setup(name: str):
    entry = catalog.get(name)
    fp32 = catalog.load(entry)
    samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(2)]
    result = convert(fp32, probe=False)
    n = len(fp32.graph.node)
    low = {d.index for d in result.decisions
           if d.index is not None and d.index < n and d.precision == "fp16" and d.rule not in ("constant", "nonfloat")}
    table = default_table()
    flops = [c.flops for c in estimate(fp32, {k: v.shape for k, v in samples[0].items()}).nodes[:n]]
    units = partition(fp32.graph, low, [table.is_tensor_core(x.domain, x.op_type) for x in fp32.graph.node], flops)
    return fp32, samples, result, [u.nodes for u in units]


def _outputs(runner, model, sample, extra=None):
    session = runner.load(model, basic=True)
    feeds = dict(sample, **(extra or {}))
    return dict(zip(session.output_names, session.run(feeds), strict=True))


@pytest.mark.parametrize("name", ["decomposed-activations", "mlp-softmax", "resnet50-small"])
def test_all_on_is_the_emulated_conversion_and_all_off_is_fp32(name):
    fp32, samples, result, groups = _setup(name)
    probe = build_probe(fp32, result.model, result.decisions, groups)
    runner = InProcessRunner()
    on = {switch_name(k): np.array(True) for k in range(len(groups))}
    off = {switch_name(k): np.array(False) for k in range(len(groups))}
    for sample in samples:
        emulated = _outputs(runner, emulate(result.model), sample)
        reference = _outputs(runner, fp32, sample)
        all_on, all_off = _outputs(runner, probe, sample, on), _outputs(runner, probe, sample, off)
        for o in fp32.graph.output:
            np.testing.assert_array_equal(all_on[o.name], emulated[o.name])
            np.testing.assert_allclose(all_off[o.name], reference[o.name], rtol=1e-5, atol=1e-7)



@pytest.mark.parametrize("name", ["decomposed-activations", "resnet50-small"])
def test_roundings_run_only_in_the_branches_their_switches_take(name):
    """The emulation's round trips (two Casts per rounded tensor) leave the main graph for the If
    branches that are taken when a switch is on: a run with every switch off computes none."""
    fp32, _, result, groups = _setup(name)
    probe = build_probe(fp32, result.model, result.decisions, groups)
    casts = sum(n.op_type == "Cast" for n in probe.graph.node)
    assert casts == sum(n.op_type == "Cast" for n in result.model.graph.node)  # the conversion's own only
    taken_when_on = [a.g for n in probe.graph.node if n.op_type == "If" for a in n.attribute
                     if a.name == "then_branch"]
    rounding = [g for g in taken_when_on if [n.op_type for n in g.node] == ["Cast", "Cast"]]
    assert len(rounding) >= (sum(n.op_type == "Cast" for n in emulate(result.model).graph.node) - casts) // 2


def test_errors_are_against_fp32_and_the_models_stay_as_they_were():
    fp32, samples, result, groups = _setup("decomposed-activations")
    before = (fp32.SerializeToString(), result.model.SerializeToString())
    probe = SwitchProbe(fp32, build_probe(fp32, result.model, result.decisions, groups), len(groups), samples,
                        InProcessRunner())
    assert (fp32.SerializeToString(), result.model.SerializeToString()) == before
    assert probe.base < 1e-6  # every rounding of this model belongs to a group: FP32's own noise is left
    whole = probe.error(range(len(groups)))
    singles = [probe.error({k}) for k in range(len(groups))]
    assert whole > 0 and all(0 <= s < whole for s in singles)
    # independent roundings add in quadrature at the outputs, roughly
    assert 0.7 < np.sqrt(sum(s * s for s in singles)) / whole < 1.5
    assert probe.runs == len(samples) * (2 + len(groups))


def _fp8_probe_setup(build):
    """An FP8 test model at opset 19, its samples, and its FP8 candidates by position."""
    model, samples = build()
    fp32 = raise_opset(model, 19)
    ir_model = ir.from_proto(onnx.shape_inference.infer_shapes(fp32))
    ranges = collect_ranges(fp32, samples, runner=InProcessRunner())
    position = {id(n): i for i, n in enumerate(ir_model.graph)}
    return fp32, samples, {position[id(c.node)]: c for c in fp8_candidates(ir_model, ranges, 1)}


def _fp8_value(inp, value):
    """What the FP8 model's Q/DQ give a GEMM for one data input (``value``: its FP32 value), in numpy."""
    if inp.weight is not None:
        scale = inp.broadcast_scale()
        return dequantize(quantize(inp.weight, scale), scale, inp.scale.dtype).astype(np.float32)
    held = value.astype(inp.scale.dtype).astype(np.float32)
    return dequantize(quantize(held, inp.scale), inp.scale).astype(np.float32)


@pytest.mark.parametrize("build", [mlp, conv_net], ids=["mlp", "conv"])
def test_fp8_switches_on_the_fp32_model_are_the_qdq_arithmetic_bit_for_bit(build):
    """The FP8 budget's probe (no conversion): all off is the FP32 model; one switch on, its GEMM reads
    exactly the numpy home's Q/DQ values of its inputs (:mod:`amp_compiler.core.fp8_numbers`) and
    computes what the FP32 model computes from them; the probe adds no copy of a weight."""
    fp32, samples, candidates = _fp8_probe_setup(build)
    switches = {p: k for k, p in enumerate(sorted(candidates))}
    probe = build_probe(fp32, fp8=candidates, fp8_switches=switches)
    big = [t.name for t in probe.graph.initializer if np.prod(t.dims) >= 64]
    assert sorted(big) == sorted(t.name for t in fp32.graph.initializer if np.prod(t.dims) >= 64)
    runner = InProcessRunner()
    off = {switch_name(k): np.array(False) for k in switches.values()}
    for position, cand in candidates.items():
        # the reference: the FP32 model whose GEMM reads the numpy Q/DQ values, fed as graph inputs
        exposed = onnx.ModelProto()
        exposed.CopyFrom(fp32)
        names = [inp.name for inp in cand.inputs]
        exposed.graph.output.extend(oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
        reference = onnx.ModelProto()
        reference.CopyFrom(fp32)
        gemm = reference.graph.node[position]
        for inp in cand.inputs:
            gemm.input[inp.index] = f"fp8_{inp.name}"
            reference.graph.input.append(oh.make_tensor_value_info(f"fp8_{inp.name}", onnx.TensorProto.FLOAT, None))
        on = dict(off, **{switch_name(switches[position]): np.array(True)})
        for sample in samples:
            values = _outputs(runner, exposed, sample)
            feeds = dict(sample, **{f"fp8_{i.name}": _fp8_value(i, values[i.name]) for i in cand.inputs})
            expected = _outputs(runner, reference, feeds)
            got, plain = _outputs(runner, probe, sample, on), _outputs(runner, probe, sample, off)
            fp32_out = _outputs(runner, fp32, sample)
            for o in fp32.graph.output:
                np.testing.assert_array_equal(got[o.name], expected[o.name])
                np.testing.assert_array_equal(plain[o.name], fp32_out[o.name])
                assert not np.array_equal(got[o.name], fp32_out[o.name])


def test_the_fp32_probe_is_its_own_reference_and_counts_its_runs():
    fp32, samples, candidates = _fp8_probe_setup(mlp)
    switches = {p: k for k, p in enumerate(sorted(candidates))}
    before = fp32.SerializeToString()
    probe = SwitchProbe(None, build_probe(fp32, fp8=candidates, fp8_switches=switches), len(switches), samples,
                        InProcessRunner())
    assert fp32.SerializeToString() == before
    assert probe.base == 0.0 and probe.error(()) == 0.0 and probe.runs == 2 * len(samples)
    singles = [probe.error({k}) for k in range(len(switches))]
    assert all(0 < s < 0.1 for s in singles) and probe.error(set(range(len(switches)))) > max(singles)


def test_held_out_samples_are_measured_apart_and_a_bound_stops_the_runs():
    fp32, samples, result, groups = _setup("decomposed-activations")
    model = build_probe(fp32, result.model, result.decisions, groups)
    runner = InProcessRunner()
    both = SwitchProbe(fp32, model, len(groups), samples, runner)
    split = SwitchProbe(fp32, model, len(groups), samples[:1], runner, held=samples[1:])
    every = range(len(groups))
    assert split.error(every) == pytest.approx(SwitchProbe(fp32, model, len(groups), samples[:1], runner).error(every))
    assert split.held_error(every) == pytest.approx(SwitchProbe(fp32, model, len(groups), samples[1:], runner).error(every))
    assert split.held_error(every) != split.error(every)
    # a bound below the error: the runs stop at the first sample that proves it, with a lower bound
    whole = both.error(every)
    runs = both.runs
    bound = both.error(every, above=whole / 100)
    assert both.runs == runs + 1 and whole / 100 < bound <= whole
    assert both.error(every, above=2 * whole) == pytest.approx(whole)  # not proven beyond: every sample


def test_the_probe_measures_with_the_metric_it_is_given():
    fp32, samples, result, groups = _setup("mlp-softmax")
    model = build_probe(fp32, result.model, result.decisions, groups)
    runner = InProcessRunner()
    every = range(len(groups))
    by_range = SwitchProbe(fp32, model, len(groups), samples, runner, metric=Metric.MAX_RANGE).error(every)
    by_l2 = SwitchProbe(fp32, model, len(groups), samples, runner).error(every)
    assert by_range > 0 and by_l2 > 0 and by_range != pytest.approx(by_l2)
    calls = []
    custom = SwitchProbe(fp32, model, len(groups), samples, runner,
                         metric=lambda ref, got: calls.append(len(ref)) or 0.125).error(every)
    assert custom == 0.125 and calls
