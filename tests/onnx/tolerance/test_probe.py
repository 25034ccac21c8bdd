"""The switched probe of --tolerance: every group on is the emulated conversion (bit for bit), every
group off is the FP32 model (up to FP32's own rounding), and the models it is given stay as they were."""

from __future__ import annotations

import numpy as np
import pytest

from amp_compiler import convert
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.tolerance.probe import SwitchProbe, build_probe, switch_name
from amp_compiler.onnx.tolerance.units import partition
from amp_compiler.policy import default_table
from amp_compiler.runtime.runner import InProcessRunner
from models import catalog


def _setup(name: str):
    entry = catalog.get(name)
    fp32 = catalog.load(entry)
    samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(2)]
    result = convert(fp32)
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
