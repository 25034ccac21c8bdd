"""Generated transformer graphs (benchmarks/generate.py): valid models of any size that convert.

Conversion time is measured by the benchmark (``python -m benchmarks.compare``), never asserted
here; the 100,000-node conversion runs under ``-m slow``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from benchmarks.generate import (
    NODES_PER_BLOCK,
    block_weight_bytes,
    large_model,
    transformer_inputs,
    transformer_model,
)


@pytest.mark.parametrize("n", [1000, 3000])
def test_generated_graph_has_about_n_nodes_and_is_valid(n):
    model = transformer_model(n)
    assert abs(len(model.graph.node) - n) <= NODES_PER_BLOCK // 2
    onnx.checker.check_model(model, full_check=True)
    ops = {node.op_type for node in model.graph.node}
    assert {"LayerNormalization", "MatMul", "Add", "Softmax", "Gelu", "Reshape", "Transpose"} <= ops
    y = run_onnxruntime(model, transformer_inputs(model))[0]
    assert y.shape == (1, 8, 16) and np.isfinite(y).all()


def test_generation_is_deterministic():
    assert transformer_model(300).SerializeToString() == transformer_model(300).SerializeToString()
    assert transformer_model(300, seed=1).SerializeToString() != transformer_model(300).SerializeToString()


@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_generated_graph_converts_accurately(target):
    model = transformer_model(1000)
    result = convert(model, target=target, probe=False)
    validate(result.model)
    matmuls = [d for d in result.decisions if d.op_type == "MatMul"]
    assert matmuls and all(d.precision == target for d in matmuls)
    assert result.casts_inserted == 2  # the graph input and output only
    feeds = transformer_inputs(model)
    acc = compare("y", run_onnxruntime(model, feeds)[0], run_onnxruntime(emulate(result.model), feeds)[0])
    assert acc.finite and acc.cosine > 0.999 and acc.error_of_range < 0.05


def test_ten_thousand_nodes_convert():
    model = transformer_model(10_000)
    result = convert(model, probe=False)
    onnx.checker.check_model(result.model)
    assert len(result.decisions) == len(model.graph.node) + result.casts_inserted


def test_large_model_writes_its_weights_beside_it(tmp_path):
    path = tmp_path / "m.onnx"
    model, size = large_model(path, weight_bytes=3e6, hidden=128)
    assert path.with_name("m.onnx.data").stat().st_size == size
    blocks = round(3e6 / block_weight_bytes(128, 512))
    assert 0.95 * blocks * block_weight_bytes(128, 512) <= size <= blocks * block_weight_bytes(128, 512)
    assert path.stat().st_size < 100_000  # the model file holds no large weight
    assert all(
        t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer if np.prod(t.dims) >= 256
    )


@pytest.mark.slow
def test_hundred_thousand_nodes_convert():
    model = transformer_model(100_000)
    result = convert(model, probe=False)
    onnx.checker.check_model(result.model)
    assert sum(d.op_type == "MatMul" and d.precision == "fp16" for d in result.decisions) == 8 * round(100_000 / 30)
