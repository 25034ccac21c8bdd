"""The ONNX export of a converted GraphModule: valid, runs on onnxruntime, and makes the same precision
decisions as the ONNX path (amp_compiler.convert) makes on the FP32 export of the same model."""

import contextlib
import io
import logging
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch

import amp_compiler.fx as ampfx
from amp_compiler import convert as convert_onnx
from amp_compiler.dtypes import short_name
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate
from amp_compiler.policy import default_table
from tests.support.fx_helpers import CNN


def _is_tensor_core(op) -> bool:
    return default_table().is_tensor_core(op.domain, op.op_type)


def export(module, inputs) -> onnx.ModelProto:
    names = [f"input_{i}" for i in range(len(inputs))]
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, inputs, dynamo=True, opset_version=18, input_names=names, optimize=True)
    return program.model_proto


def tensor_core_precisions(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(op type, the dtype of its first input) of every MatMul/Gemm/Conv, in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return [(n.op_type, short_name(ir.DataType(types[n.input[0]])) if n.input[0] in types else "?")
            for n in g.node if _is_tensor_core(n)]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 10)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(x))
        h = torch.tanh(self.fc2(h)) + h
        return self.fc3(h).log_softmax(-1)


def _cnn():
    torch.manual_seed(0)
    m = CNN()
    m.train()
    with torch.no_grad():  # realistic BatchNorm statistics
        for _ in range(3):
            m(torch.randn(8, 3, 16, 16))
    return m.eval(), (torch.randn(2, 3, 16, 16),)


def _mlp():
    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(4, 32),)


@pytest.mark.parametrize("make", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_onnx_export_is_valid_runs_and_decides_like_the_onnx_path(make):
    module, inputs = make()
    gm = ampfx.convert(module, inputs)
    mixed = export(gm, inputs)
    validate(mixed)  # onnx.checker full_check + strict shape inference
    feeds = {f"input_{i}": x.numpy() for i, x in enumerate(inputs)}
    got = run_onnxruntime(mixed, feeds)
    with torch.no_grad():
        ref = module(*inputs).numpy()
        ours = gm(*inputs).numpy()
    assert got[0].dtype == np.float32 and np.isfinite(got[0]).all()
    cos = float(np.dot(got[0].ravel(), ref.ravel()) / (np.linalg.norm(got[0]) * np.linalg.norm(ref)))
    assert cos > 0.999
    assert np.allclose(got[0], ours, atol=2e-2, rtol=2e-2)

    onnx_path = convert_onnx(export(module, inputs), probe=False)
    expected = [(d.op_type, d.precision) for d in onnx_path.decisions if _is_tensor_core(d)]
    assert expected and tensor_core_precisions(mixed) == expected
    assert any(n.op_type == "Cast" for n in mixed.graph.node)  # the casts are in the exported graph


def test_blocked_op_stays_fp32_in_the_export_too():
    module, inputs = _mlp()
    gm = ampfx.convert(module, inputs, block_nodes=["^linear_1$"])
    mixed = export(gm, inputs)
    validate(mixed)
    expected = convert_onnx(export(module, inputs), block_nodes=["^node_linear_1$"], probe=False)  # the exporter names it so
    assert tensor_core_precisions(mixed) == [
        (d.op_type, d.precision) for d in expected.decisions if _is_tensor_core(d)
    ] == [("Gemm", "fp16"), ("Gemm", "fp32"), ("Gemm", "fp16")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50-small", "mobilenetv2-small", "bert-base-small", "gpt2-small"])
def test_catalog_models_export_like_the_onnx_path(name):
    from tests.support.fx_helpers import build

    module, inputs, ref = build(name)
    gm = ampfx.convert(module, inputs)
    mixed = export(gm, inputs)
    validate(mixed)
    got = run_onnxruntime(mixed, {f"input_{i}": x.numpy() for i, x in enumerate(inputs)})
    for r, g in zip(ref, got):
        cos = float(np.dot(r.numpy().ravel(), g.ravel()) / (np.linalg.norm(r.numpy()) * np.linalg.norm(g)))
        assert cos > 0.999
    onnx_path = convert_onnx(export(module, inputs), probe=False)
    expected = [(d.op_type, d.precision) for d in onnx_path.decisions if _is_tensor_core(d)]
    assert expected and tensor_core_precisions(mixed) == expected


def test_bf16_export_picks_an_opset_whose_schemas_take_bf16():
    """ONNX's Conv takes bf16 from opset 22: export_onnx exports there when no opset is asked for,
    refuses an explicit older one in one error, and leaves FP16 graphs at opset 18."""
    from amp_compiler.errors import OptionError
    from amp_compiler.onnx.measure.emulate import emulate_bf16

    module, (x,) = _cnn()
    gm = ampfx.convert(module, (x,), target="bf16")
    proto = ampfx.export_onnx(gm, (x,))
    assert {o.domain: o.version for o in proto.opset_import}[""] == 22
    validate(proto)
    got = run_onnxruntime(emulate_bf16(proto), {proto.graph.input[0].name: x.numpy()})[0]
    with torch.no_grad():
        ref = module(x).numpy()
    assert np.abs(got - ref).max() <= 0.05 * (ref.max() - ref.min())
    with pytest.raises(OptionError, match=r"opset 18 has no schema .* Conv \(opset 22\)") as info:
        ampfx.export_onnx(gm, (x,), opset=18)
    assert info.value.option == "opset"
    fp16 = ampfx.export_onnx(ampfx.convert(module, (x,), target="fp16"), (x,))
    assert {o.domain: o.version for o in fp16.opset_import}[""] == 18
