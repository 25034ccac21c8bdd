"""amp_compiler.fx.convert on the catalog's transformers architectures (random, realistic weights,
BatchNorm statistics re-estimated, as models/architectures.py builds them for the ONNX catalog).

Small (CI-size) configs run by default; the published sizes are marked slow.
"""


import pytest
import torch

import amp_compiler.fx as ampfx
from amp_compiler.fx.graph.policy import default_policy
from tests.support.fx_helpers import (
    build,
    cosine,
    one_thread,  # noqa: F401 - autouse: torch on one thread
)

SMALL = ["resnet50-small", "mobilenetv2-small", "bert-base-small", "gpt2-small"]
FULL = ["resnet50", "mobilenetv2", "bert-base", "gpt2"]



def check(name: str, target: str, min_cosine: float):
    module, inputs, ref = build(name)
    gm = ampfx.convert(module, inputs, target=target)
    with torch.no_grad():
        out = gm(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    for r, o in zip(ref, out, strict=True):
        assert o.dtype == r.dtype and o.shape == r.shape
        assert torch.isfinite(o).all()
        assert cosine(r, o) >= min_cosine, f"{name} {target}: cosine {cosine(r, o):.6f}"
    rep = ampfx.report(gm)
    # The report lists every node of the graph, each with a rule and a reason.
    assert [d.node for d in rep.decisions] == [n.name for n in gm.graph.nodes]
    assert all(d.rule and d.reason for d in rep.decisions)
    # Parameter memory about halves; the original model keeps its FP32 weights.
    assert rep.parameter_ratio <= 0.53, f"{name}: parameters {rep.parameter_ratio:.3f}x"
    assert all(p.dtype == torch.float32 for p in module.parameters())
    # Every Tensor Core op runs in low precision.
    table = default_policy().table
    heavy = [d for d in rep.decisions if d.op_type.split(".")[1:2] and table.is_tensor_core("aten", d.op_type.split(".")[1])]
    assert heavy and all(d.precision == target for d in heavy), [(d.node, d.precision) for d in heavy]
    return gm, rep


@pytest.mark.parametrize("name", SMALL)
def test_fp16_matches_fp32_and_halves_parameters(name):
    check(name, "fp16", 0.999)


# BF16 keeps 8 significant bits: deep convolution stacks lose more than transformers. MobileNetV2's 52
# layers of (depthwise) convolutions reach 0.986 here; torch.autocast(cpu, bfloat16) reaches 0.978 on
# the same model (it also rounds the convolution outputs before the batch norm, which we fold).
BF16_MIN_COSINE = {"mobilenetv2-small": 0.98}


@pytest.mark.parametrize("name", SMALL)
def test_bf16_matches_fp32(name):
    check(name, "bf16", BF16_MIN_COSINE.get(name, 0.999))


def test_transformer_decisions_follow_autocast():
    _, rep = check("bert-base-small", "fp16", 0.999)
    by_op = {}
    for d in rep.decisions:
        by_op.setdefault(d.op_type, set()).add(d.precision)
    assert by_op["aten.softmax.int"] == {"fp32"}
    assert by_op["aten.layer_norm.default"] == {"fp32"}
    assert by_op["aten.linear.default"] == {"fp16"}
    assert by_op["aten.embedding.default"] >= {"fp16"}  # the word embedding table is stored in FP16


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_full_size_fp16(name):
    check(name, "fp16", 0.999)
