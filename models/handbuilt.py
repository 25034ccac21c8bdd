"""Hand-built graphs, one per precision rule.

Each entry is a small FP32 ONNX graph made with ``onnx.helper`` that exercises one rule of the
converter (policy categories, constant ranges, control flow, existing casts, quantized ops, ...).
Weights are random but deterministic: every builder seeds ``np.random.default_rng`` with a fixed
number derived from the entry's name. Models use opsets 17-21 of the default domain and IR versions
8-10 (onnxruntime 1.31 loads IR <= 13; ``helper.make_model`` would write IR 14 if not told).

Every model passes ``onnx.checker.check_model(full_check=True)`` and runs in onnxruntime CPU in FP32;
node names are explicit so that tests can look decisions up by name.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models.entry import CatalogModel, Tolerance

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
I64 = TensorProto.INT64
BOOL = TensorProto.BOOL

# Lowest IR version that carries each default-domain opset (onnx.helper.VERSION_TABLE).
_MIN_IR = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10}


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


# --------------------------------------------------------------------------------------------------
# A tiny graph builder
# --------------------------------------------------------------------------------------------------


class _Graph:
    """Collects nodes and initializers; names every node and value explicitly.

    Subgraphs (``sub()``) share the parent's random generator, name counter and initializer list
    (initializers live in the main graph and are used from the subgraph as outer-scope values).
    """

    def __init__(self, seed: int | None = None, parent: _Graph | None = None):
        self.rng = parent.rng if parent else np.random.default_rng(seed)
        self._root = parent._root if parent else self
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = [] if parent is None else parent._root.inits
        self._counts: dict[str, int] = {} if parent is None else parent._root._counts

    def sub(self) -> _Graph:
        return _Graph(parent=self)

    def _fresh(self, stem: str) -> str:
        k = self._counts.get(stem, 0)
        self._counts[stem] = k + 1
        return f"{stem}_{k}"

    # initializers -----------------------------------------------------------------------------
    def const(self, name: str, array) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name: str, shape, scale: float | None = None, mean: float = 0.0) -> str:
        fan_in = shape[0] if len(shape) <= 2 else int(np.prod(shape[1:]))
        std = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        return self.const(name, (mean + std * self.rng.standard_normal(shape)).astype(np.float32))

    # nodes --------------------------------------------------------------------------------------
    def node(self, op: str, inputs, n_out: int = 1, name: str | None = None, outputs=None, **attrs):
        name = name or self._fresh(op)
        if outputs is None:
            outputs = [f"{name}_out"] if n_out == 1 else [f"{name}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def graph(self, name: str, inputs, outputs) -> onnx.GraphProto:
        inits = self.inits if self._root is self else []
        return helper.make_graph(self.nodes, name, inputs, outputs, initializer=inits)


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(g: _Graph, name: str, inputs, outputs, opset: int, ir_version: int | None = None,
           doc: str = "") -> onnx.ModelProto:
    ir_version = ir_version or _MIN_IR[opset]
    model = helper.make_model(
        g.graph(name, inputs, outputs),
        opset_imports=[helper.make_opsetid("", opset)],
        ir_version=ir_version,
        producer_name="amp-compiler-handbuilt",
        doc_string=doc,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


#: Every hand-built entry, in the order of this file (``models.catalog`` indexes them by name).
ENTRIES: list[CatalogModel] = []


def _register(name: str, build: Callable[[], onnx.ModelProto],
              make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]],
              description: str, tolerance: Tolerance | None = None) -> None:
    ENTRIES.append(
        CatalogModel(
            name=name,
            kind="rule",
            size="small",
            build=lambda _cache, _b=build: _b(),
            make_inputs=make_inputs,
            tolerance=tolerance or Tolerance(),
            weight_dominated=False,
            description=description,
        )
    )


def _normal(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# 1. mlp-softmax
# --------------------------------------------------------------------------------------------------


def build_mlp_softmax() -> onnx.ModelProto:
    g = _Graph(_seed("mlp-softmax"))
    h = g.node("MatMul", ["x", g.weight("W1", [16, 32])], name="matmul1")
    h = g.node("Add", [h, g.weight("b1", [32], 0.1)], name="add_bias")
    p = g.node("Softmax", [h], name="softmax", axis=-1)
    g.node("MatMul", [p, g.weight("W2", [32, 8], 1.0)], name="matmul2", outputs=["y"])
    return _model(g, "mlp_softmax", [_vi("x", F32, ["batch", 16])], [_vi("y", F32, ["batch", 8])], 17)


_register(
    "mlp-softmax",
    build_mlp_softmax,
    lambda rng: {"x": _normal(rng, [4, 16])},
    "MatMul -> Add -> Softmax -> MatMul: LOW MatMuls around a Softmax (HIGH, or low precision where "
    "the provider's kernel accumulates in FP32); the Add between them follows its neighbours.",
)

# --------------------------------------------------------------------------------------------------
# 2. exp-range
# --------------------------------------------------------------------------------------------------


def build_exp_range() -> onnx.ModelProto:
    g = _Graph(_seed("exp-range"))
    w = g.const("W1", g.rng.uniform(0.8, 1.6, [16, 32]).astype(np.float32))
    h = g.node("MatMul", ["x", w], name="matmul1")  # values ~20..40
    e = g.node("Exp", [h], name="exp")  # up to e^40 ~ 2e17: inf in FP16 (> 11.09)
    s = g.node("ReduceSum", [e, g.const("axes_last", np.array([-1], np.int64))], name="reducesum",
               keepdims=1)
    lse = g.node("Log", [s], name="log")
    logp = g.node("Sub", [h, lse], name="sub_lse")
    g.node("MatMul", [logp, g.weight("W2", [32, 8], 0.2)], name="matmul2", outputs=["y"])
    return _model(g, "exp_range", [_vi("x", F32, ["batch", 16])], [_vi("y", F32, ["batch", 8])], 18)


_register(
    "exp-range",
    build_exp_range,
    lambda rng: {"x": rng.uniform(1.0, 2.0, [4, 16]).astype(np.float32)},
    "MatMul whose outputs reach 20-40 -> Exp -> ReduceSum -> Log (a log-sum-exp): Exp overflows FP16 "
    "above 11.09, so the range rule keeps Exp (and the reduction and Log) in FP32 while the MatMuls "
    "run in low precision.",
)

# --------------------------------------------------------------------------------------------------
# 3. clip-log
# --------------------------------------------------------------------------------------------------


def build_clip_log() -> onnx.ModelProto:
    g = _Graph(_seed("clip-log"))
    # A MatMul -> Relu in front makes the Clip sit next to a low-precision neighbour, so that only
    # the constant rule (1e-9 flushes to zero in FP16, Log(0) = -inf) keeps it in FP32.
    h = g.node("MatMul", ["x", g.weight("W0", [16, 32], 0.25)], name="matmul0")
    r = g.node("Relu", [h], name="relu")
    c = g.node("Clip", [r, g.const("clip_min", np.array(1e-9, np.float32)),
                        g.const("clip_max", np.array(1.0, np.float32))], name="clip")
    lg = g.node("Log", [c], name="log")
    g.node("MatMul", [lg, g.weight("W1", [32, 8], 0.1)], name="matmul1", outputs=["y"])
    return _model(g, "clip_log", [_vi("x", F32, ["batch", 16])], [_vi("y", F32, ["batch", 8])], 19)


_register(
    "clip-log",
    build_clip_log,
    lambda rng: {"x": _normal(rng, [4, 16])},
    "MatMul -> Relu -> Clip(min=1e-9, max=1) -> Log -> MatMul: the Clip's 1e-9 bound flushes to zero "
    "in FP16 (then Log gives -inf), so the constant-underflow rule keeps the Clip in FP32.",
)

# --------------------------------------------------------------------------------------------------
# 4. bn-big-variance
# --------------------------------------------------------------------------------------------------


def build_bn_big_variance() -> onnx.ModelProto:
    g = _Graph(_seed("bn-big-variance"))
    rng = g.rng
    # Input: pixel-scale image (0..255). Channel 0 of conv1 sums 27 taps of ~128 * ~2.9 -> ~1e4.
    w1 = np.empty([4, 3, 3, 3], np.float32)
    w1[0] = rng.uniform(2.0, 3.8, [3, 3, 3])
    w1[1] = rng.uniform(0.8, 2.0, [3, 3, 3])
    w1[2:] = rng.standard_normal([2, 3, 3, 3]) * 0.004
    h = g.node("Conv", ["x", g.const("W1", w1), g.const("B1", np.zeros(4, np.float32))],
               name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    mean = np.array([1.0e4, 5.0e3, -8.0, 5.0], np.float32)
    var = np.array([1.0e8, 2.5e7, 16.0, 16.0], np.float32)
    bn = g.node("BatchNormalization", [
        h,
        g.const("bn_scale", rng.uniform(0.5, 1.5, 4).astype(np.float32)),
        g.const("bn_bias", (0.1 * rng.standard_normal(4)).astype(np.float32)),
        g.const("bn_mean", mean),
        g.const("bn_var", var),
    ], name="bn", epsilon=1e-5)
    r = g.node("Relu", [bn], name="relu")
    g.node("Conv", [r, g.weight("W2", [8, 4, 3, 3])], name="conv2", outputs=["y"],
           kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    return _model(g, "bn_big_variance", [_vi("x", F32, [1, 3, 16, 16])],
                  [_vi("y", F32, [1, 8, 16, 16])], 20)


def _image_inputs(rng):
    x = rng.uniform(0.0, 255.0, [1, 3, 16, 16]).astype(np.float32)
    # Brighter and darker regions so that the normalised channels are spread around 0.
    x[:, :, :8, :] *= 1.4
    x[:, :, 8:, :] *= 0.6
    return {"x": x}


_register(
    "bn-big-variance",
    build_bn_big_variance,
    _image_inputs,
    "Conv -> BatchNormalization with running variance 1e8 / 2.5e7 and mean 1e4 (a detector's "
    "statistics; the inputs are pixel-scale so the FP32 output is meaningful) -> Relu -> Conv: the "
    "variance is beyond FP16's range, so the constant-overflow rule keeps the BatchNormalization in "
    "FP32 instead of clamping it.",
)

# --------------------------------------------------------------------------------------------------
# 5. attention-mask-min
# --------------------------------------------------------------------------------------------------


def build_attention_mask_min() -> onnx.ModelProto:
    g = _Graph(_seed("attention-mask-min"))
    seq, d = 8, 16
    q = g.node("MatMul", ["x", g.weight("Wq", [d, d])], name="q_proj")
    k = g.node("MatMul", ["x", g.weight("Wk", [d, d])], name="k_proj")
    v = g.node("MatMul", ["x", g.weight("Wv", [d, d])], name="v_proj")
    kt = g.node("Transpose", [k], name="k_transpose", perm=[0, 2, 1])
    s = g.node("MatMul", [q, kt], name="scores")
    s = g.node("Mul", [s, g.const("inv_sqrt_d", np.array(1.0 / np.sqrt(d), np.float32))], name="scale")
    causal = np.tril(np.ones([seq, seq], dtype=bool))
    mask = g.node("Where", [g.const("causal", causal), g.const("mask_zero", np.array(0.0, np.float32)),
                            g.const("mask_min", np.array(np.finfo(np.float32).min, np.float32))],
                  name="mask_where")
    s = g.node("Add", [s, mask], name="add_mask")
    p = g.node("Softmax", [s], name="softmax", axis=-1)
    a = g.node("MatMul", [p, v], name="attn_v")
    g.node("MatMul", [a, g.weight("Wo", [d, d])], name="o_proj", outputs=["y"])
    return _model(g, "attention_mask_min", [_vi("x", F32, ["batch", seq, d])],
                  [_vi("y", F32, ["batch", seq, d])], 18)


_register(
    "attention-mask-min",
    build_attention_mask_min,
    lambda rng: {"x": _normal(rng, [2, 8, 16])},
    "Causal self-attention whose mask is Where(causal, 0, -3.4028235e38): the float32-min constant "
    "overflows FP16, so the mask path (Where, the Add and the Softmax) must stay FP32 or be handled "
    "without producing -inf/NaN, while the Q/K/V projections run in low precision.",
)

# --------------------------------------------------------------------------------------------------
# 6. if-branches
# --------------------------------------------------------------------------------------------------


def build_if_branches() -> onnx.ModelProto:
    g = _Graph(_seed("if-branches"))
    w_then = g.weight("W_then", [16, 8])
    b_then = g.weight("b_then", [8], 0.1)
    w_else = g.weight("W_else", [16, 8])
    w_then2 = g.weight("W_then2", [8, 8])

    # If #1: condition from ReduceSum(x) > 0, branches read the graph input x and initializers.
    total = g.node("ReduceSum", ["x"], name="reducesum_all", keepdims=0)
    cond = g.node("Greater", [total, g.const("zero", np.array(0.0, np.float32))], name="greater")
    t = g.sub()
    h = t.node("MatMul", ["x", w_then], name="then_matmul")
    h = t.node("Add", [h, b_then], name="then_add")
    t.node("Relu", [h], name="then_relu", outputs=["then_out"])
    e = g.sub()
    h = e.node("MatMul", ["x", w_else], name="else_matmul")
    e.node("Relu", [h], name="else_relu", outputs=["else_out"])
    if1 = g.node("If", [cond], name="if_sum", outputs=["if1_out"],
                 then_branch=t.graph("then1", [], [_vi("then_out", F32, ["batch", 8])]),
                 else_branch=e.graph("else1", [], [_vi("else_out", F32, ["batch", 8])]))

    # If #2: condition from a bool graph input; one branch computes, the other passes through.
    t2 = g.sub()
    h = t2.node("MatMul", [if1, w_then2], name="then2_matmul")
    t2.node("Tanh", [h], name="then2_tanh", outputs=["then2_out"])
    e2 = g.sub()
    e2.node("Identity", [if1], name="else2_identity", outputs=["else2_out"])
    if2 = g.node("If", ["flag"], name="if_flag", outputs=["if2_out"],
                 then_branch=t2.graph("then2", [], [_vi("then2_out", F32, ["batch", 8])]),
                 else_branch=e2.graph("else2", [], [_vi("else2_out", F32, ["batch", 8])]))
    g.node("MatMul", [if2, g.weight("W_out", [8, 4])], name="matmul_out", outputs=["y"])
    return _model(g, "if_branches", [_vi("x", F32, ["batch", 16]), _vi("flag", BOOL, [])],
                  [_vi("y", F32, ["batch", 4])], 19, ir_version=10)


_register(
    "if-branches",
    build_if_branches,
    lambda rng: {"x": (_normal(rng, [4, 16]) + 0.2).astype(np.float32), "flag": np.array(True)},
    "Two If nodes (condition from ReduceSum(x) > 0 and from a bool input) whose branches use "
    "outer-scope tensors (the graph input and initializers) in MatMul/Add/Relu/Tanh: lowering must "
    "recurse into branches and keep both branches' outputs one dtype.",
)

# --------------------------------------------------------------------------------------------------
# 7. loop-carried
# --------------------------------------------------------------------------------------------------


def build_loop_carried() -> onnx.ModelProto:
    g = _Graph(_seed("loop-carried"))
    w = g.weight("W_loop", [16, 16], 0.3)
    b = g.weight("b_loop", [16], 0.1)
    body = g.sub()
    h = body.node("MatMul", ["h_in", w], name="body_matmul")
    h = body.node("Add", [h, b], name="body_add")
    body.node("Tanh", [h], name="body_tanh", outputs=["h_out"])
    body.node("Identity", ["h_out"], name="body_scan_identity", outputs=["h_scan"])
    body.node("Identity", ["cond_in"], name="body_cond", outputs=["cond_out"])
    body_graph = body.graph(
        "loop_body",
        [_vi("iter", I64, []), _vi("cond_in", BOOL, []), _vi("h_in", F32, ["batch", 16])],
        [_vi("cond_out", BOOL, []), _vi("h_out", F32, ["batch", 16]),
         _vi("h_scan", F32, ["batch", 16])],
    )
    g.node("Loop", [g.const("trip_count", np.array(4, np.int64)), g.const("keep_going", np.array(True)),
                    "x"], name="loop", outputs=["h_final", "h_all"], body=body_graph)
    g.node("MatMul", ["h_final", g.weight("W_out", [16, 8])], name="matmul_out", outputs=["y"])
    return _model(g, "loop_carried", [_vi("x", F32, ["batch", 16])],
                  [_vi("y", F32, ["batch", 8]), _vi("h_all", F32, [4, "batch", 16])], 20)


_register(
    "loop-carried",
    build_loop_carried,
    lambda rng: {"x": _normal(rng, [2, 16])},
    "Loop (4 iterations) carrying a float state updated by MatMul + Add + Tanh with outer-scope "
    "weights, plus a scan output: the carried input, the body's carried output and the Loop output "
    "must share one dtype.",
)

# --------------------------------------------------------------------------------------------------
# 8. scan-rnn
# --------------------------------------------------------------------------------------------------


def build_scan_rnn() -> onnx.ModelProto:
    g = _Graph(_seed("scan-rnn"))
    wx = g.weight("Wx", [8, 16])
    wh = g.weight("Wh", [16, 16], 0.2)
    b = g.weight("b_rnn", [16], 0.1)
    body = g.sub()
    a = body.node("MatMul", ["x_t", wx], name="body_matmul_x")
    c = body.node("MatMul", ["s_in", wh], name="body_matmul_h")
    s = body.node("Add", [a, c], name="body_add")
    s = body.node("Add", [s, b], name="body_add_bias")
    body.node("Tanh", [s], name="body_tanh", outputs=["s_out"])
    body.node("Identity", ["s_out"], name="body_y", outputs=["y_t"])
    body_graph = body.graph(
        "scan_body",
        [_vi("s_in", F32, [2, 16]), _vi("x_t", F32, [2, 8])],
        [_vi("s_out", F32, [2, 16]), _vi("y_t", F32, [2, 16])],
    )
    g.node("Scan", ["h0", "seq"], name="scan", outputs=["h_last", "ys"], body=body_graph,
           num_scan_inputs=1)
    g.node("MatMul", ["ys", g.weight("W_out", [16, 4])], name="matmul_out", outputs=["y"])
    return _model(g, "scan_rnn", [_vi("h0", F32, [2, 16]), _vi("seq", F32, [6, 2, 8])],
                  [_vi("y", F32, [6, 2, 4]), _vi("h_last", F32, [2, 16])], 21)


_register(
    "scan-rnn",
    build_scan_rnn,
    lambda rng: {"h0": _normal(rng, [2, 16], 0.5), "seq": _normal(rng, [6, 2, 8])},
    "Scan (opset 9+ form) over a 6-step sequence with a state updated by MatMul + Add + Tanh: state "
    "inputs/outputs and scan inputs/outputs of the body must match the Scan's dtypes.",
)

# --------------------------------------------------------------------------------------------------
# 9. qdq
# --------------------------------------------------------------------------------------------------


def build_qdq() -> onnx.ModelProto:
    g = _Graph(_seed("qdq"))
    rng = g.rng
    x_scale = g.const("x_scale", np.array(0.025, np.float32))
    x_zp = g.const("x_zero_point", np.array(128, np.uint8))
    q = g.node("QuantizeLinear", ["x", x_scale, x_zp], name="quantize_x")
    xd = g.node("DequantizeLinear", [q, x_scale, x_zp], name="dequantize_x")
    w_scale = rng.uniform(0.002, 0.004, 8).astype(np.float32)
    wq = np.clip(np.round(rng.standard_normal([16, 8]) * 0.25 / w_scale), -127, 127).astype(np.int8)
    wd = g.node("DequantizeLinear", [g.const("W_q", wq), g.const("w_scale", w_scale),
                                     g.const("w_zero_point", np.zeros(8, np.int8))],
                name="dequantize_w", axis=1)
    h = g.node("MatMul", [xd, wd], name="matmul")
    g.node("Add", [h, g.weight("b", [8], 0.1)], name="add_bias", outputs=["y"])
    return _model(g, "qdq", [_vi("x", F32, ["batch", 16])], [_vi("y", F32, ["batch", 8])], 19)


_register(
    "qdq",
    build_qdq,
    lambda rng: {"x": rng.uniform(-3.0, 3.0, [4, 16]).astype(np.float32)},
    "QuantizeLinear -> DequantizeLinear (activation, uint8, scalar scale) and a per-axis int8 "
    "DequantizeLinear weight -> MatMul -> Add: quantized ops and their float scales must stay "
    "consistent (the scale shares the float type of x / y).",
)

# --------------------------------------------------------------------------------------------------
# 10. partly-fp16
# --------------------------------------------------------------------------------------------------


def build_partly_fp16() -> onnx.ModelProto:
    g = _Graph(_seed("partly-fp16"))
    h = g.node("MatMul", ["x", g.weight("W0", [16, 16])], name="matmul0")
    c = g.node("Cast", [h], name="cast_to_fp16", to=F16)
    w16 = (g.rng.standard_normal([16, 8]) / 4.0).astype(np.float16)
    m = g.node("MatMul", [c, g.const("W16", w16)], name="matmul_fp16")
    c2 = g.node("Cast", [m], name="cast_to_fp32", to=F32)
    g.node("Add", [c2, g.weight("b", [8], 0.1)], name="add_bias", outputs=["y"])
    return _model(g, "partly_fp16", [_vi("x", F32, ["batch", 16])], [_vi("y", F32, ["batch", 8])], 17)


_register(
    "partly-fp16",
    build_partly_fp16,
    lambda rng: {"x": _normal(rng, [4, 16])},
    "A model that already holds an FP16 section: MatMul -> Cast(to fp16) -> MatMul with an fp16 "
    "initializer -> Cast(to fp32) -> Add: existing casts are retargeted or removed, never stacked, "
    "and the fp16 initializer is left alone.",
)

# --------------------------------------------------------------------------------------------------
# 11. int-cast-float
# --------------------------------------------------------------------------------------------------


def build_int_cast_float() -> onnx.ModelProto:
    g = _Graph(_seed("int-cast-float"))
    f = g.node("Cast", ["ids"], name="cast_ids", to=F32)
    m = g.node("Mul", [f, g.const("scale", g.rng.uniform(0.05, 0.2, 16).astype(np.float32))], name="mul")
    g.node("MatMul", [m, g.weight("W", [16, 8])], name="matmul", outputs=["y"])
    return _model(g, "int_cast_float", [_vi("ids", I64, ["batch", 16])], [_vi("y", F32, ["batch", 8])],
                  18, ir_version=9)


_register(
    "int-cast-float",
    build_int_cast_float,
    lambda rng: {"ids": rng.integers(0, 10, [4, 16]).astype(np.int64)},
    "int64 input -> Cast(to float) -> Mul -> MatMul: the existing Cast's target is retargeted to the "
    "low-precision type instead of stacking a second Cast after it.",
)

# --------------------------------------------------------------------------------------------------
# 12. layernorm-gelu (+ decomposed Erf variant)
# --------------------------------------------------------------------------------------------------


def _layernorm(g: _Graph, x: str, d: int, name: str, outputs=None) -> str:
    return g.node("LayerNormalization", [
        x,
        g.const(f"{name}_scale", g.rng.uniform(0.5, 1.5, d).astype(np.float32)),
        g.const(f"{name}_bias", (0.1 * g.rng.standard_normal(d)).astype(np.float32)),
    ], name=name, outputs=outputs, axis=-1, epsilon=1e-5)


def build_layernorm_gelu() -> onnx.ModelProto:
    g = _Graph(_seed("layernorm-gelu"))
    h = _layernorm(g, "x", 16, "ln1")
    h = g.node("MatMul", [h, g.weight("W1", [16, 32])], name="fc1")
    h = g.node("Add", [h, g.weight("b1", [32], 0.1)], name="fc1_bias")
    h = g.node("Gelu", [h], name="gelu", approximate="none")
    h = g.node("MatMul", [h, g.weight("W2", [32, 16])], name="fc2")
    h = g.node("Add", [h, "x"], name="residual")
    _layernorm(g, h, 16, "ln2", outputs=["y"])
    return _model(g, "layernorm_gelu", [_vi("x", F32, ["batch", 8, 16])],
                  [_vi("y", F32, ["batch", 8, 16])], 20)


def build_layernorm_gelu_erf() -> onnx.ModelProto:
    g = _Graph(_seed("layernorm-gelu-erf"))
    h = _layernorm(g, "x", 16, "ln1")
    h = g.node("MatMul", [h, g.weight("W1", [16, 32])], name="fc1")
    h = g.node("Add", [h, g.weight("b1", [32], 0.1)], name="fc1_bias")
    # Gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2))), as exporters write it.
    d = g.node("Div", [h, g.const("sqrt2", np.array(np.sqrt(2.0), np.float32))], name="gelu_div")
    e = g.node("Erf", [d], name="gelu_erf")
    e = g.node("Add", [e, g.const("one", np.array(1.0, np.float32))], name="gelu_add1")
    m = g.node("Mul", [h, e], name="gelu_mul")
    m = g.node("Mul", [m, g.const("half", np.array(0.5, np.float32))], name="gelu_half")
    h = g.node("MatMul", [m, g.weight("W2", [32, 16])], name="fc2")
    h = g.node("Add", [h, "x"], name="residual")
    _layernorm(g, h, 16, "ln2", outputs=["y"])
    return _model(g, "layernorm_gelu_erf", [_vi("x", F32, ["batch", 8, 16])],
                  [_vi("y", F32, ["batch", 8, 16])], 17)


_register(
    "layernorm-gelu",
    build_layernorm_gelu,
    lambda rng: {"x": _normal(rng, [2, 8, 16])},
    "Transformer MLP block: LayerNormalization (opset 17+, stash_type=1) -> MatMul -> Gelu (opset 20) "
    "-> MatMul -> residual Add -> LayerNormalization: norms are HIGH (or FP32 inside on providers "
    "that accumulate in FP32), Gelu follows its neighbours.",
)

_register(
    "layernorm-gelu-erf",
    build_layernorm_gelu_erf,
    lambda rng: {"x": _normal(rng, [2, 8, 16])},
    "The same block with Gelu decomposed into Div -> Erf -> Add -> Mul -> Mul (opset 17 exporters): "
    "FOLLOW ops with scalar constants sandwiched between two MatMuls become low precision.",
)

# --------------------------------------------------------------------------------------------------
# 13. reductions
# --------------------------------------------------------------------------------------------------


def build_reductions() -> onnx.ModelProto:
    g = _Graph(_seed("reductions"))
    axes = g.const("axes_last", np.array([-1], np.int64))
    # RMSNorm as exporters decompose it.
    sq = g.node("Pow", ["x", g.const("two", np.array(2.0, np.float32))], name="pow2")
    ms = g.node("ReduceMean", [sq, axes], name="reducemean", keepdims=1)
    ms = g.node("Add", [ms, g.const("eps", np.array(1e-6, np.float32))], name="add_eps")
    rms = g.node("Sqrt", [ms], name="sqrt")
    inv = g.node("Reciprocal", [rms], name="reciprocal")
    n = g.node("Mul", ["x", inv], name="mul_inv")
    n = g.node("Mul", [n, g.const("gamma", g.rng.uniform(0.5, 1.5, 16).astype(np.float32))],
               name="mul_gamma")
    h = g.node("MatMul", [n, g.weight("W", [16, 16])], name="matmul")
    # Running mean over the sequence: CumSum / position.
    cs = g.node("CumSum", [h, g.const("axis_seq", np.array(1, np.int64))], name="cumsum")
    pos = np.arange(1, 9, dtype=np.float32).reshape(1, 8, 1)
    g.node("Div", [cs, g.const("positions", pos)], name="div_pos", outputs=["running_mean"])
    g.node("ReduceSum", ["running_mean", axes], name="reducesum", keepdims=0, outputs=["total"])
    return _model(g, "reductions", [_vi("x", F32, ["batch", 8, 16])],
                  [_vi("running_mean", F32, ["batch", 8, 16]), _vi("total", F32, ["batch", 8])], 18)


_register(
    "reductions",
    build_reductions,
    lambda rng: {"x": _normal(rng, [2, 8, 16], 3.0)},
    "RMSNorm decomposition Pow(x, 2) -> ReduceMean -> Add(eps=1e-6) -> Sqrt -> Reciprocal -> Mul, "
    "then MatMul -> CumSum -> Div -> ReduceSum (a graph output that is also consumed): range-"
    "sensitive reductions and Pow/Reciprocal stay FP32.",
)

# --------------------------------------------------------------------------------------------------
# 14. resize-topk
# --------------------------------------------------------------------------------------------------


def build_resize_topk() -> onnx.ModelProto:
    g = _Graph(_seed("resize-topk"))
    h = g.node("Conv", ["x", g.weight("W1", [8, 3, 3, 3]), g.weight("B1", [8], 0.1)], name="conv1",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.node("Resize", [h, "", g.const("scales", np.array([1, 1, 2, 2], np.float32))], name="resize",
               mode="linear")
    g.node("Conv", [h, g.weight("W2", [4, 8, 3, 3])], name="conv2", outputs=["y"],
           kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    flat = g.node("Flatten", ["y"], name="flatten", axis=1)
    g.node("TopK", [flat, g.const("k", np.array([3], np.int64))], name="topk",
           outputs=["top_values", "top_indices"], axis=-1)
    return _model(g, "resize_topk", [_vi("x", F32, [1, 3, 8, 8])],
                  [_vi("y", F32, [1, 4, 16, 16]), _vi("top_values", F32, [1, 3]),
                   _vi("top_indices", I64, [1, 3])], 19)


def _resize_topk_inputs(rng):
    x = _normal(rng, [1, 3, 8, 8], 0.5)
    # Three bright spots of clearly different strength, so the top-3 are well separated.
    x[0, :, 1, 1] += 6.0
    x[0, :, 5, 2] += 4.0
    x[0, :, 3, 6] += 2.5
    return {"x": x}


_register(
    "resize-topk",
    build_resize_topk,
    _resize_topk_inputs,
    "Conv -> Resize(scales, linear) -> Conv, then Flatten -> TopK with int64 indices as a second "
    "graph output: Resize's scales input is a fixed float port, and the non-float TopK indices must "
    "stay identical to FP32.",
)

# --------------------------------------------------------------------------------------------------
# 15. lstm-gru
# --------------------------------------------------------------------------------------------------


def build_lstm_gru() -> onnx.ModelProto:
    g = _Graph(_seed("lstm-gru"))
    hid1, hid2, inp = 16, 12, 8
    y, _yh, yc = g.node("LSTM", [
        "x",
        g.weight("lstm_W", [1, 4 * hid1, inp], 0.3),
        g.weight("lstm_R", [1, 4 * hid1, hid1], 0.2),
        g.weight("lstm_B", [1, 8 * hid1], 0.1),
        "",
        "h0",
        g.const("lstm_c0", np.zeros([1, 2, hid1], np.float32)),
    ], name="lstm", outputs=["lstm_Y", "lstm_Y_h", "lstm_Y_c"], hidden_size=hid1)
    y = g.node("Squeeze", [y, g.const("axis1", np.array([1], np.int64))], name="squeeze")
    g.node("GRU", [
        y,
        g.weight("gru_W", [1, 3 * hid2, hid1], 0.3),
        g.weight("gru_R", [1, 3 * hid2, hid2], 0.2),
        g.weight("gru_B", [1, 6 * hid2], 0.1),
        "",
        g.const("gru_h0", np.zeros([1, 2, hid2], np.float32)),
    ], name="gru", outputs=["gru_Y", "gru_Y_h"], hidden_size=hid2)
    return _model(g, "lstm_gru", [_vi("x", F32, [5, 2, inp]), _vi("h0", F32, [1, 2, hid1])],
                  [_vi("gru_Y", F32, [5, 1, 2, hid2]), _vi("gru_Y_h", F32, [1, 2, hid2]),
                   _vi("lstm_Y_c", F32, [1, 2, hid1])], 21)


_register(
    "lstm-gru",
    build_lstm_gru,
    lambda rng: {"x": _normal(rng, [5, 2, 8]), "h0": _normal(rng, [1, 2, 16], 0.3)},
    "Forward LSTM (initial h from an input, initial c from an initializer) -> Squeeze -> GRU: "
    "recurrent ops are LOW; their weights, biases and initial states share the float type "
    "(sequence_lens is an omitted int32 input).",
)

# --------------------------------------------------------------------------------------------------
# 16. convtranspose-einsum
# --------------------------------------------------------------------------------------------------


def build_convtranspose_einsum() -> onnx.ModelProto:
    g = _Graph(_seed("convtranspose-einsum"))
    g.node("ConvTranspose", ["img", g.weight("W_ct", [4, 3, 4, 4], 0.2), g.weight("B_ct", [3], 0.1)],
           name="convtranspose", outputs=["up"], strides=[2, 2], pads=[1, 1, 1, 1])
    e = g.node("Einsum", ["a", g.weight("B_ein", [2, 8, 6], 0.35)], name="einsum_bmm",
               outputs=["bmm"], equation="bij,bjk->bik")
    r = g.node("Reshape", [e, g.const("shape_2d", np.array([8, 6], np.int64))], name="reshape")
    g.node("Einsum", [r], name="einsum_rowsum", outputs=["row_sums"], equation="ij->i")
    return _model(g, "convtranspose_einsum",
                  [_vi("img", F32, [1, 4, 8, 8]), _vi("a", F32, [2, 4, 8])],
                  [_vi("up", F32, [1, 3, 16, 16]), _vi("bmm", F32, [2, 4, 6]), _vi("row_sums", F32, [8])],
                  18, ir_version=10)


_register(
    "convtranspose-einsum",
    build_convtranspose_einsum,
    lambda rng: {"img": _normal(rng, [1, 4, 8, 8]), "a": _normal(rng, [2, 4, 8])},
    "ConvTranspose (stride 2), a batched-matmul Einsum 'bij,bjk->bik' (a graph output also consumed "
    "by a Reshape) and a reduction-only Einsum 'ij->i': Tensor Core ops vs an Einsum that only sums.",
)

# --------------------------------------------------------------------------------------------------
# 17. shared-initializer
# --------------------------------------------------------------------------------------------------


def build_shared_initializer() -> onnx.ModelProto:
    g = _Graph(_seed("shared-initializer"))
    w = g.weight("W_shared", [16, 16], 0.5)
    g.node("MatMul", ["x", w], name="matmul", outputs=["h"])  # low precision use of W_shared
    e = g.node("Exp", [w], name="exp")  # FP32 use of the same initializer
    s = g.node("ReduceSum", [e, g.const("axis0", np.array([0], np.int64))], name="reducesum", keepdims=0)
    lse = g.node("Log", [s], name="log")
    g.node("Add", ["h", lse], name="add_lse", outputs=["z"])
    r = g.node("Relu", ["h"], name="relu")  # h is a graph output and consumed inside the graph
    g.node("MatMul", [r, g.weight("W2", [16, 8])], name="matmul2", outputs=["y"])
    return _model(g, "shared_initializer", [_vi("x", F32, ["batch", 16])],
                  [_vi("h", F32, ["batch", 16]), _vi("y", F32, ["batch", 8]), _vi("z", F32, ["batch", 16])],
                  17, ir_version=9)


_register(
    "shared-initializer",
    build_shared_initializer,
    lambda rng: {"x": _normal(rng, [4, 16])},
    "One initializer read by a MatMul (low precision) and by Exp -> ReduceSum -> Log (FP32): it needs "
    "both an FP32 and a low-precision copy (or a Cast); the MatMul output is a graph output that is "
    "also consumed inside the graph (keep_io_types must not retype the internal use).",
)

# --------------------------------------------------------------------------------------------------
# 18. pool-pad-concat
# --------------------------------------------------------------------------------------------------


def build_pool_pad_concat() -> onnx.ModelProto:
    g = _Graph(_seed("pool-pad-concat"))
    a = g.node("Conv", ["x", g.weight("W1", [8, 3, 3, 3]), g.weight("B1", [8], 0.1)], name="conv1",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    a = g.node("Relu", [a], name="relu1")
    a = g.node("MaxPool", [a], name="maxpool", kernel_shape=[2, 2], strides=[2, 2])  # 8x8
    a = g.node("Pad", [a, g.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
                       g.const("pad_value", np.array(0.0, np.float32))], name="pad", mode="constant")
    b = g.node("Conv", ["x", g.weight("W2", [4, 3, 3, 3])], name="conv2", kernel_shape=[3, 3],
               strides=[2, 2], pads=[3, 3, 2, 2])  # 10x10
    b = g.node("Relu", [b], name="relu2")
    c = g.node("Concat", [a, b], name="concat", axis=1)
    c = g.node("GlobalAveragePool", [c], name="gap")
    c = g.node("Flatten", [c], name="flatten", axis=1)
    g.node("Gemm", [c, g.weight("W_fc", [5, 12], 0.5), g.weight("b_fc", [5], 0.1)], name="gemm",
           outputs=["y"], transB=1)
    return _model(g, "pool_pad_concat", [_vi("x", F32, [1, 3, 16, 16])], [_vi("y", F32, [1, 5])], 21)


_register(
    "pool-pad-concat",
    build_pool_pad_concat,
    lambda rng: {"x": _normal(rng, [1, 3, 16, 16])},
    "Conv -> Relu -> MaxPool -> Pad(constant value input) and a strided Conv branch -> Concat -> "
    "GlobalAveragePool -> Flatten -> Gemm: PASS ops (pooling, padding, concatenation) join their "
    "low-precision neighbours; Pad's constant_value shares the data type.",
)

# --------------------------------------------------------------------------------------------------
# 19. constant-nodes
# --------------------------------------------------------------------------------------------------


def build_constant_nodes() -> onnx.ModelProto:
    g = _Graph(_seed("constant-nodes"))
    rng = g.rng
    scale = g.node("Constant", [], name="const_scale", outputs=["scale"],
                   value=numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), "scale_v"))
    shift = g.node("Constant", [], name="const_shift", outputs=["shift"], value_float=0.5)
    w = g.node("Constant", [], name="const_w", outputs=["w"],
               value=numpy_helper.from_array((rng.standard_normal([16, 8]) / 4).astype(np.float32), "w_v"))
    bias = g.node("Constant", [], name="const_bias", outputs=["bias"],
                  value_floats=[float(v) for v in 0.1 * rng.standard_normal(8)])
    big = g.node("Constant", [], name="const_big", outputs=["big"], value_float=1.0e5)
    h = g.node("Mul", ["x", scale], name="mul_scale")
    h = g.node("Add", [h, shift], name="add_shift")
    h = g.node("MatMul", [h, w], name="matmul")
    h = g.node("Add", [h, bias], name="add_bias", outputs=["y"])
    # A constant beyond FP16's range: its consumer must stay FP32 (no silent clamp to 65504).
    g.node("Div", [h, big], name="div_big", outputs=["y_small"])
    return _model(g, "constant_nodes", [_vi("x", F32, ["batch", 16])],
                  [_vi("y", F32, ["batch", 8]), _vi("y_small", F32, ["batch", 8])], 20)


_register(
    "constant-nodes",
    build_constant_nodes,
    lambda rng: {"x": _normal(rng, [4, 16])},
    "Constant nodes (value tensors, value_float, value_floats) feeding Mul/Add/MatMul, and a "
    "value_float of 1e5 (beyond FP16) feeding a Div: Constants are converted offline like "
    "initializers, and the out-of-range one keeps its consumer in FP32.",
)

# --------------------------------------------------------------------------------------------------
# 20. rnn-batch-first
# --------------------------------------------------------------------------------------------------


def build_rnn_batch_first() -> onnx.ModelProto:
    g = _Graph(_seed("rnn-batch-first"))
    hid, inp, out = 16, 8, 5
    seq_first = g.node("Transpose", ["x"], name="to_seq_first", perm=[1, 0, 2])
    y, _ = g.node("GRU", [
        seq_first,
        g.weight("gru_W", [1, 3 * hid, inp], 0.3),
        g.weight("gru_R", [1, 3 * hid, hid], 0.2),
        g.weight("gru_B", [1, 6 * hid], 0.1),
    ], name="gru", outputs=["gru_Y", "gru_Y_h"], hidden_size=hid)
    y = g.node("Squeeze", [y, g.const("axis1", np.array([1], np.int64))], name="squeeze")
    y = g.node("Transpose", [y], name="to_batch_first", perm=[1, 0, 2])
    g.node("MatMul", [y, g.weight("proj_W", [hid, out])], name="proj", outputs=["y"])
    return _model(g, "rnn_batch_first", [_vi("x", F32, ["batch", "time", inp])], [_vi("y", F32, ["batch", "time", out])], 17)


_register(
    "rnn-batch-first",
    build_rnn_batch_first,
    lambda rng: {"x": _normal(rng, [2, 6, 8])},
    "A batch-first GRU as PyTorch exports it: Transpose -> GRU -> Squeeze -> Transpose(1,0,2) -> "
    "MatMul(2-D weight). A Cast between that Transpose and the MatMul crashes onnxruntime >= 1.22 at "
    "session creation (the CPU provider inserts one around an FP16 MatMul): both stay FP32 "
    "(runtime.ort-transpose-matmul).",
)

# --------------------------------------------------------------------------------------------------
# 21. moe-router
# --------------------------------------------------------------------------------------------------


def build_moe_router() -> onnx.ModelProto:
    """A mixture-of-experts layer as torch.onnx.export writes Qwen3-MoE/OLMoE/DBRX: router MatMul (64 experts,
    logits near zero as at initialisation) -> Softmax -> Cast(FLOAT) -> TopK(2) whose indices a OneHot turns
    into the gates weighting the experts' product (the 64 experts as one MatMul, dense)."""
    g = _Graph(_seed("moe-router"))
    hid, experts, k = 32, 64, 2
    logits = g.node("MatMul", ["x", g.weight("router_W", [hid, experts], 0.02)], name="router")
    p = g.node("Softmax", [logits], name="router_softmax", axis=-1)
    p = g.node("Cast", [p], name="router_cast", to=TensorProto.FLOAT)
    vals, idx = g.node("TopK", [p, g.const("k", np.array([k], np.int64))], name="router_topk",
                       outputs=["top_p", "experts_chosen"], axis=-1)
    last = g.const("last", np.array([-1], np.int64))
    w = g.node("Div", [vals, g.node("ReduceSum", [vals, last], name="top_sum", keepdims=1)], name="top_norm")
    onehot = g.node("OneHot", [idx, g.const("depth", np.array(experts, np.int64)),
                               g.const("onoff", np.array([0, 1], np.float32))], name="expert_mask", axis=-1)
    gates = g.node("ReduceSum", [g.node("Mul", [onehot, g.node("Unsqueeze", [w, last], name="w3")], name="ohw"),
                                 g.const("axis1", np.array([1], np.int64))], name="gates", keepdims=0)
    e = g.node("MatMul", ["x", g.weight("experts_W", [hid, experts * hid])], name="experts")
    e = g.node("Reshape", [e, g.const("eshape", np.array([0, experts, hid], np.int64))], name="per_expert")
    eg = g.node("Mul", [e, g.node("Unsqueeze", [gates, last], name="g3")], name="weighted")
    g.node("ReduceSum", [eg, "axis1"], name="combine", outputs=["y"], keepdims=0)
    return _model(g, "moe_router", [_vi("x", F32, ["tokens", hid])],
                  [_vi("y", F32, ["tokens", hid]), _vi("experts_chosen", I64, ["tokens", k])], 18)


_register(
    "moe-router",
    build_moe_router,
    lambda rng: {"x": _normal(rng, [512, 32])},
    "A mixture-of-experts router: MatMul (64 experts) -> Softmax -> Cast -> TopK(2), the indices read by a "
    "OneHot that picks the experts weighting a dense experts' MatMul. Probabilities near 1/64 tie in FP16 and "
    "TopK picks another expert (routing.score keeps the router FP32; the experts' MatMul stays FP16).",
)
