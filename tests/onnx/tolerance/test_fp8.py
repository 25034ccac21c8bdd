"""--tolerance with --target fp8: FP8 switches on the probe that compute exactly what the FP8 model
computes, and a choice per Tensor Core unit among FP32, FP16 and FP8 that grows FP8 with the tolerance."""

from __future__ import annotations

import collections

import numpy as np
import onnx.shape_inference
import onnx_ir as ir
import pytest

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.onnx.fp8.steps import local_choice
from amp_compiler.onnx.load.opset import fp8_opset, raise_opset
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.measure.probe import build_probe, switch_name
from amp_compiler.onnx.tolerance.refine import refine
from amp_compiler.options import ConvertOptions
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.targets import Target
from models import catalog


def _model_and_samples(name: str, n: int = 4):
    entry = catalog.get(name)
    fp32 = raise_opset(catalog.load(entry), fp8_opset(Target.FP16))
    return fp32, [entry.make_inputs(np.random.default_rng(s)) for s in range(n)]


def test_every_switch_on_is_the_fp8_model_bit_for_bit():
    fp32, samples = _model_and_samples("mlp-softmax")
    runner = InProcessRunner()
    plain = convert(fp32, probe=False)  # the fallback conversion the probe is made of
    low = [d.index for d in plain.decisions if d.index is not None and d.precision == "fp16"]
    ir_model = ir.from_proto(onnx.shape_inference.infer_shapes(fp32))
    from amp_compiler.onnx.measure.calibrate import collect_ranges

    ranges = collect_ranges(fp32, samples, runner=runner)
    passed, _ = local_choice(ir_model, fp32, samples, ranges, ConvertOptions(target=Target.FP8), runner, {})
    position = {id(n): i for i, n in enumerate(ir_model.graph)}
    candidates = {position[id(c.node)]: c for c in passed}
    assert len(candidates) == 2
    groups = [tuple(low)]
    switches = {p: 1 + k for k, p in enumerate(sorted(candidates))}
    probe = build_probe(fp32, plain.model, plain.decisions, groups, fp8=candidates, fp8_switches=switches)
    fp8 = convert(fp32, target="fp8", samples=samples, ranges=ranges, runner=runner,
                  fp8_nodes=[(p, "a test") for p in candidates], kept_nodes=[(i, "a test") for i in low], probe=False)
    assert sum(d.rule == "fp8.gemm" for d in fp8.decisions) == 2
    probe_session, model_session = runner.load(probe, basic=True), runner.load(emulate(fp8.model), basic=True)
    on = {switch_name(k): np.array(True) for k in range(3)}
    off = dict(on, **{switch_name(k): np.array(False) for k in switches.values()})
    plain_session = runner.load(emulate(plain.model), basic=True)
    for sample in samples:
        np.testing.assert_array_equal(probe_session.run({**sample, **on})[0], model_session.run(sample)[0])
        np.testing.assert_array_equal(probe_session.run({**sample, **off})[0], plain_session.run(sample)[0])


def _fp8_gemms(result) -> int:
    return sum(d.rule == "fp8.gemm" for d in result.decisions)


def test_the_fp8_share_grows_with_the_tolerance_and_each_is_met():
    fp32, samples = _model_and_samples("bert-base-small", 2)
    shares, gemms = [], []
    for tolerance in (0.001, 0.02, 0.1):
        r = refine(fp32, samples, tolerance, ConvertOptions(target=Target.FP8))
        assert r.met and max(r.output_errors.values()) <= tolerance
        assert r.rounds == 1  # no plain conversion first: its FP8 choice follows fp8_budget, not the tolerance
        shares.append(r.fp8_flops_share)
        gemms.append(_fp8_gemms(r.result))
    assert shares == sorted(shares) and shares[0] < shares[-1]
    assert gemms[0] < gemms[-1]


def test_fp8_decisions_say_why_with_the_measured_numbers():
    fp32, samples = _model_and_samples("mlp-softmax")
    r = refine(fp32, samples, 0.05, ConvertOptions(target=Target.FP8))
    by_rule = collections.defaultdict(list)
    for d in r.result.decisions:
        by_rule[d.rule].append(d)
    assert by_rule["fp8.gemm"] and all("FP8 by --tolerance 0.05" in d.reason and "E4M3" in d.reason
                                       for d in by_rule["fp8.gemm"])
    assert by_rule["fp8.qdq"]  # the Q/DQ nodes the FP8 GEMMs read through


@pytest.mark.parametrize("fallback", [None, "bf16"])
def test_cli_takes_a_tolerance_with_fp8(tmp_path, capsys, fallback):
    fp32, samples = _model_and_samples("mlp-softmax")
    path, out, data = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "cal"
    onnx.save(fp32, path)
    data.mkdir()
    for k, sample in enumerate(samples):
        np.savez(data / f"{k}.npz", **sample)
    args = ["convert", str(path), "-o", str(out), "--target", "fp8", "--calibration-data", str(data),
            "--tolerance", "0.05", "--no-load-check"] + (["--fallback", fallback] if fallback else [])
    assert main(args) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("--tolerance 0.05: met") and "in fp8)" in line
    assert out.exists()
