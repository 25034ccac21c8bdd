"""Every catalog model converts to FP16 and BF16: valid, runs, and matches FP32.

Small (CI-size) entries run by default; full-size entries are marked slow.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import pytest

from amp_compiler import convert
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.policy import default_table
from models import catalog
from models.entry import calibration_ranges
from tests.conftest import EXPECTED_SKIP

SMALL = catalog.entries("small")
FULL = catalog.entries("full")
PARAMS = [pytest.param(e, id=e.name) for e in SMALL] + [
    pytest.param(e, id=e.name, marks=pytest.mark.slow) for e in FULL
]


@functools.cache
def _fp32(name: str) -> onnx.ModelProto:
    return catalog.load(name)


@functools.cache
def _converted(name: str, target: str):
    # entries whose values leave FP16 on their own inputs are converted with calibration ranges
    return convert(_fp32(name), target=target, ranges=calibration_ranges(catalog.get(name), _fp32(name)), probe=False)


@functools.cache
def _reference(name: str):
    entry = catalog.get(name)
    feeds = entry.make_inputs(np.random.default_rng(0))
    return feeds, run_onnxruntime(_fp32(name), feeds)


def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.floating)


#: BF16's unit roundoff over FP16's (8 significand bits against 11): the factor its rounding errors, and
#: so an output's max error, grow by where a BF16 conversion runs what an FP16 one does. A cosine's
#: shortfall from 1 grows with the error's square. Since a BF16 conversion raises a model's opset for
#: bfloat16 Conv (amp_compiler.onnx.load.opset), a CNN's every convolution runs in BF16: MobileNetV2's
#: logits then reach cosine 0.986 (rel-L2 0.17) and PP-OCRv4's detection map 51% of range at one pixel,
#: BF16's own rounding through 50 layers, which the conversion's output error states and warns of.
BF16_ROUNDOFF_OVER_FP16 = 8


def _bf16_tolerance(tolerance):
    """An entry's FP16 tolerance as BF16's rounding scales it (:data:`BF16_ROUNDOFF_OVER_FP16`)."""
    factor = BF16_ROUNDOFF_OVER_FP16
    return dataclasses.replace(tolerance, min_cosine=1 - (1 - tolerance.min_cosine) * factor * factor,
                               max_error_of_range=tolerance.max_error_of_range * factor)


def assert_matches_fp32(entry, model: onnx.ModelProto, tolerance=None) -> list:
    tolerance = tolerance or entry.tolerance
    feeds, ref = _reference(entry.name)
    got = run_onnxruntime(model, feeds)
    if entry.blind_fails:  # a failure pattern: what the conversion does about it is tested with it
        pytest.skip(f"{EXPECTED_SKIP}{entry.name}: {entry.blind_fails}")
    names = [o.name for o in _fp32(entry.name).graph.output]
    results = []
    for name, r, g in zip(names, ref, got):
        if not _is_float(r):
            np.testing.assert_array_equal(g, r, err_msg=f"non-float output {name} differs")
            continue
        acc = compare(name, r, g)
        assert acc.finite, f"{name}: NaN/Inf where FP32 is finite"
        assert acc.cosine >= tolerance.min_cosine, f"{name}: cosine {acc.cosine:.6f}"
        assert acc.error_of_range <= tolerance.max_error_of_range, (
            f"{name}: max error {acc.max_abs_error:.4g} is {acc.error_of_range:.2%} of the range"
        )
        results.append(acc)
    return results


@pytest.mark.parametrize("entry", PARAMS)
def test_fp16_conversion_is_valid_and_accurate(entry):
    r = _converted(entry.name, "fp16")
    validate(r.model, converted_from=_fp32(entry.name))  # faults of the input model are its own
    feeds, _ = _reference(entry.name)
    # the FP16 model itself loads and runs (on the CPU provider standing in for CUDA: without the
    # optimizer only that provider's own Casts crash, as the load check does), unless it holds BF16
    # range fallbacks: the CPU provider has no BF16 MatMul (the emulation below runs them)
    if not any(d.precision == "bf16" for d in r.decisions):
        run_onnxruntime(r.model, feeds, disabled=r.load_check_skips)
    # Numerics with FP16 storage emulated exactly: onnxruntime's CPU provider computes most FP16
    # ops in FP32 and drops the rounding in between, which would flatter the comparison.
    assert_matches_fp32(entry, emulate(r.model))
    assert [i.name for i in r.model.graph.input] == [i.name for i in _fp32(entry.name).graph.input]
    assert [o.name for o in r.model.graph.output] == [o.name for o in _fp32(entry.name).graph.output]


@pytest.mark.parametrize("entry", PARAMS)
def test_bf16_conversion_is_valid_and_accurate(entry):
    r = _converted(entry.name, "bf16")
    validate(r.model, converted_from=_fp32(entry.name))
    # onnxruntime's CPU provider has no BF16 kernels: run the exact FP32 emulation of the BF16 model.
    assert_matches_fp32(entry, emulate(r.model), entry.bf16_tolerance or _bf16_tolerance(entry.tolerance))


@pytest.mark.parametrize("entry", PARAMS)
def test_converting_twice_changes_nothing(entry):
    once = _converted(entry.name, "fp16").model
    # the same calibration ranges (by tensor name) where the entry needs them
    twice = convert(once, target="fp16", ranges=calibration_ranges(entry, _fp32(entry.name)), probe=False).model
    assert twice.SerializeToString() == once.SerializeToString()


def test_tensor_core_ops_run_in_low_precision():
    heavy = low = 0
    for entry in SMALL:
        for d in _converted(entry.name, "fp16").decisions:
            if default_table().is_tensor_core(d.domain, d.op_type):
                heavy += 1
                low += d.precision == "fp16"
    assert heavy > 0 and low / heavy >= 0.95, f"{low}/{heavy} Tensor Core ops in fp16"


def _weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of initializers and Constant-node tensors in every graph (Paddle exports keep weights
    in Constants, silero-vad keeps them inside If branches)."""
    total = 0
    for g in iter_proto_graphs(model.graph):
        total += sum(i.ByteSize() for i in g.initializer)
        total += sum(a.t.ByteSize() for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value")
    return total


@pytest.mark.parametrize(
    "entry",
    [pytest.param(e, id=e.name) for e in SMALL if e.weight_dominated]
    + [pytest.param(e, id=e.name, marks=pytest.mark.slow) for e in FULL if e.weight_dominated],
)
def test_weight_dominated_models_halve(entry):
    before, after = _fp32(entry.name), _converted(entry.name, "fp16").model
    ratio = _weight_bytes(after) / _weight_bytes(before)
    assert ratio <= 0.52, f"weights {ratio:.3f}x"
    if entry.size == "full":
        # Reduced configs are too small for weights to dominate their files (the exporter's node
        # metadata weighs as much). At the published sizes the file shrinks to at most 0.52x, or,
        # where more than 4% of the file is not weights (EfficientNet-B0: 4.3% node metadata), to
        # half the weights plus everything else unchanged.
        file_ratio = after.ByteSize() / before.ByteSize()
        other_share = 1 - _weight_bytes(before) / before.ByteSize()
        assert file_ratio <= max(0.52, 0.5 + other_share / 2 + 0.005), f"file {file_ratio:.3f}x"


def _casts_around(model: onnx.ModelProto, op_type: str) -> int:
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    count = 0
    graph_io = {v.name for v in model.graph.input} | {v.name for v in model.graph.output}

    def internal_cast(node) -> bool:  # casts for graph inputs/outputs (keep_io_types) don't count
        return node.op_type == "Cast" and not graph_io & {*node.input, *node.output}

    for n in model.graph.node:
        if n.op_type != op_type:
            continue
        count += sum(1 for i in n.input if i in producers and internal_cast(producers[i]))
        count += sum(1 for o in n.output for c in consumers.get(o, []) if internal_cast(c))
    return count


@pytest.mark.parametrize("name", [e.name for e in SMALL if e.name.startswith("bert") and e.kind == "architecture"])
def test_bert_needs_no_casts_around_softmax_and_layernorm_on_cuda(name):
    m = _converted(name, "fp16").model
    ops = {n.op_type for n in m.graph.node}
    assert "Softmax" in ops and "LayerNormalization" in ops
    assert _casts_around(m, "Softmax") == 0
    assert _casts_around(m, "LayerNormalization") == 0
    # TensorRT's parser imports LayerNormalization as an INormalizationLayer computing in FP32 (no casts),
    # while nothing says what its SoftMax layer accumulates in: the same model keeps Softmax FP32, with casts
    trt = convert(_fp32(name), target="fp16", provider="tensorrt", probe=False).model
    assert _casts_around(trt, "Softmax") > 0
    assert _casts_around(trt, "LayerNormalization") == 0
