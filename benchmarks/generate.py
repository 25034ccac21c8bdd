"""Generated transformer-style ONNX graphs of any size, for scale tests and the benchmark.

    python -m benchmarks.generate --nodes 100000 -o big.onnx
    python -m benchmarks.generate --weights-gb 2.5 -o /tmp/huge/model.onnx   # external data

A model is a stack of pre-LayerNorm decoder blocks (GPT-style) on an input ``x`` of shape
``(batch, seq, hidden)``. Each block has 30 nodes:

    LayerNormalization -> 3 x (MatMul, Add, Reshape, Transpose) for Q, K, V -> MatMul (Q K^T) -> Mul
    (scale) -> Add (causal mask) -> Softmax -> MatMul (P V) -> Transpose -> Reshape -> MatMul -> Add
    -> Add (residual) -> LayerNormalization -> MatMul -> Add -> Gelu -> MatMul -> Add -> Add (residual)

Hidden sizes are small by default so that a 100,000-node graph stays around 50 MB. Every block has
its own weights (``N(0, 1/hidden)``, biases ``N(0, 0.02)``); the Reshape shapes, the attention scale
and the causal mask (0 / -10000) are shared initializers, as exporters that deduplicate constants
write them. Weights of ``weight_bytes`` models are written straight to an external data file, one
tensor at a time, so building a 2.5 GB model takes no more memory than its largest tensor.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NODES_PER_BLOCK = 30
OPSET = 20  # Gelu
IR_VERSION = 10


def blocks_for(n_nodes: int) -> int:
    """The number of blocks whose graph has about ``n_nodes`` nodes (at least one)."""
    return max(1, round(n_nodes / NODES_PER_BLOCK))


def block_weight_bytes(hidden: int, ffn: int) -> int:
    """FP32 bytes of one block's weights."""
    return 4 * (4 * hidden * hidden + 2 * hidden * ffn + 4 * hidden + ffn + hidden + 4 * hidden)


class _Weights:
    """Adds initializers, in memory or appended to one external data file."""

    def __init__(self, graph: onnx.GraphProto, data_path: Path | None):
        self.graph = graph
        self.data_path = data_path
        self.file = open(data_path, "wb") if data_path is not None else None
        self.offset = 0

    def add(self, name: str, array: np.ndarray, external: bool = True) -> str:
        array = np.ascontiguousarray(array)
        if self.file is None or not external or array.nbytes < 1024:
            self.graph.initializer.append(numpy_helper.from_array(array, name))
            return name
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.data_path.name), ("offset", str(self.offset)), ("length", str(array.nbytes))
        ):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.file.write(array.tobytes())
        self.offset += array.nbytes
        self.graph.initializer.append(tensor)
        return name

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def transformer_model(
    n_nodes: int = 1000,
    *,
    hidden: int = 16,
    heads: int = 2,
    ffn: int | None = None,
    seq: int = 8,
    batch: int | str = 1,
    blocks: int | None = None,
    seed: int = 0,
    external_data: str | os.PathLike | None = None,
) -> onnx.ModelProto:
    """A decoder stack of about ``n_nodes`` nodes (or exactly ``blocks`` blocks).

    ``batch``: the input's batch size, or a name for a symbolic batch dimension (the Reshapes then
    copy it from their input), so that one model runs at any batch size.

    ``external_data``: a file path; large weights are written there (the model must then be saved
    beside it, in the same folder, with ``onnx.save(model, path)``: the locations are the file's name).
    """
    if hidden % heads:
        raise ValueError("hidden must be a multiple of heads")
    ffn = ffn or 4 * hidden
    n_blocks = blocks if blocks is not None else blocks_for(n_nodes)
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    graph = helper.make_graph([], "generated_transformer", [], [])
    graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden]))
    graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, hidden]))
    w = _Weights(graph, Path(external_data) if external_data is not None else None)
    lead = 0 if isinstance(batch, str) else batch  # Reshape: 0 copies the input's dimension
    w.add("shape_heads", np.array([lead, seq, heads, head_dim], np.int64), external=False)
    w.add("shape_hidden", np.array([lead, seq, hidden], np.int64), external=False)
    w.add("attn_scale", np.array(1.0 / math.sqrt(head_dim), np.float32), external=False)
    mask = np.triu(np.full((seq, seq), -10000.0, np.float32), k=1)
    w.add("causal_mask", mask, external=False)

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    nodes = graph.node
    x = "x"
    for b in range(n_blocks):
        p = f"blk{b}"

        def node(op, inputs, name, p=p, **attrs):
            out = f"{p}/{name}"
            nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
            return out

        def weight(name, shape, std, p=p):
            return w.add(f"{p}.{name}", normal(shape, std))

        ln1 = node(
            "LayerNormalization", [x, weight("ln1.g", [hidden], 0.02), weight("ln1.b", [hidden], 0.02)],
            "ln1", axis=-1, epsilon=1e-5,
        )
        heads_out = {}
        for kind, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            mm = node("MatMul", [ln1, weight(f"{kind}.w", [hidden, hidden], hidden**-0.5)], f"{kind}_mm")
            add = node("Add", [mm, weight(f"{kind}.b", [hidden], 0.02)], f"{kind}_add")
            rs = node("Reshape", [add, "shape_heads"], f"{kind}_reshape")
            heads_out[kind] = node("Transpose", [rs], f"{kind}_transpose", perm=perm)
        scores = node("MatMul", [heads_out["q"], heads_out["k"]], "qk")
        scaled = node("Mul", [scores, "attn_scale"], "scale")
        masked = node("Add", [scaled, "causal_mask"], "mask")
        probs = node("Softmax", [masked], "softmax", axis=-1)
        ctx = node("MatMul", [probs, heads_out["v"]], "pv")
        ctx_t = node("Transpose", [ctx], "ctx_transpose", perm=[0, 2, 1, 3])
        ctx_r = node("Reshape", [ctx_t, "shape_hidden"], "ctx_reshape")
        o = node("MatMul", [ctx_r, weight("o.w", [hidden, hidden], hidden**-0.5)], "o_mm")
        o = node("Add", [o, weight("o.b", [hidden], 0.02)], "o_add")
        x = node("Add", [x, o], "residual1")
        ln2 = node(
            "LayerNormalization", [x, weight("ln2.g", [hidden], 0.02), weight("ln2.b", [hidden], 0.02)],
            "ln2", axis=-1, epsilon=1e-5,
        )
        f = node("MatMul", [ln2, weight("ffn1.w", [hidden, ffn], hidden**-0.5)], "ffn1_mm")
        f = node("Add", [f, weight("ffn1.b", [ffn], 0.02)], "ffn1_add")
        f = node("Gelu", [f], "gelu")
        f = node("MatMul", [f, weight("ffn2.w", [ffn, hidden], ffn**-0.5)], "ffn2_mm")
        f = node("Add", [f, weight("ffn2.b", [hidden], 0.02)], "ffn2_add")
        x = node("Add", [x, f], "residual2")
    nodes[-1].output[0] = "y"
    w.close()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="amp-compiler-bench")
    model.ir_version = IR_VERSION
    return model


def transformer_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for a generated model: ``x`` drawn from N(0, 1) (batch 1 when the batch is symbolic)."""
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)}


def large_model(
    path: str | os.PathLike, weight_bytes: float = 2.5e9, *, hidden: int = 1024, seed: int = 0
) -> tuple[onnx.ModelProto, int]:
    """Write a model of about ``weight_bytes`` FP32 weights to ``path`` with its weights in
    ``<path>.data`` beside it. Returns the model (without its weights) and the weight bytes written."""
    path = Path(path)
    ffn = 4 * hidden
    n_blocks = max(1, round(weight_bytes / block_weight_bytes(hidden, ffn)))
    data = path.with_name(path.name + ".data")
    model = transformer_model(hidden=hidden, heads=max(1, hidden // 64), ffn=ffn, seq=8, blocks=n_blocks,
                              seed=seed, external_data=data)
    onnx.save(model, path)
    return model, data.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--weights-gb", type=float, default=None, help="a model of this many GB of weights, as external data")
    args = parser.parse_args()
    if args.weights_gb:
        _, size = large_model(args.output, args.weights_gb * 1e9)
        print(f"{args.output}: {size / 1e9:.2f} GB of weights in {args.output}.data")
        return
    model = transformer_model(args.nodes, hidden=args.hidden)
    onnx.save(model, args.output)
    print(f"{args.output}: {len(model.graph.node)} nodes, {model.ByteSize() / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
