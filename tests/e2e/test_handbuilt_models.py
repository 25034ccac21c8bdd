"""The hand-built rule graphs (models/handbuilt.py): valid FP32 models, valid and accurate conversions,
and the decision each one exists to exercise.

FP16 conversions run in onnxruntime CPU and are compared with FP32. Caveat: for ops without an FP16
CPU kernel, onnxruntime computes in FP32 and drops the fp32->fp16->fp32 Cast pairs it inserts
("InsertedPrecisionFreeCast"), so CPU numerics understate FP16 error; the rule-specific assertions on
the decisions and on the converted graph are what pin the rules. onnxruntime CPU has almost no BF16
kernels, so BF16 conversions are only checked for validity (checker + strict shape inference).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.shape_inference
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from amp_compiler import convert
from amp_compiler.onnx.load.opset import opset_of
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.onnx.measure.emulate import emulate
from models import catalog
from models.entry import calibration_ranges
from tests.conftest import EXPECTED_SKIP

ENTRIES = catalog.entries(size="small", kind="rule")
NAMES = [e.name for e in ENTRIES]

EXPECTED = {
    "mlp-softmax", "exp-range", "clip-log", "bn-big-variance", "attention-mask-min", "if-branches",
    "loop-carried", "scan-rnn", "qdq", "partly-fp16", "int-cast-float", "layernorm-gelu",
    "layernorm-gelu-erf", "reductions", "resize-topk", "lstm-gru", "convtranspose-einsum",
    "shared-initializer", "pool-pad-concat", "constant-nodes",
}

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


@functools.cache
def _fp32(name: str) -> onnx.ModelProto:
    return catalog.load(name)


@functools.cache
def _converted(name: str, target: str):
    # Entries whose overflow only observed values show are converted with calibration ranges.
    ranges = calibration_ranges(catalog.get(name), _fp32(name))
    return convert(_fp32(name), target=target, provider="cuda", keep_io_types=True, ranges=ranges, probe=False)


def _feeds(name: str) -> dict[str, np.ndarray]:
    return catalog.get(name).make_inputs(np.random.default_rng(0))


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], disabled: tuple[str, ...] = ()) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled) or None)
    return sess.run(None, feeds)


@functools.cache
def _reference(name: str) -> list[np.ndarray]:
    return _run(_fp32(name), _feeds(name))


def _validate(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)



def _all_nodes(model: onnx.ModelProto):
    for g in iter_proto_graphs(model.graph):
        yield from g.node


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    for n in _all_nodes(model):
        if n.name == name:
            return n
    raise AssertionError(f"no node named {name!r} in the converted model")


def _attr(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def _initializer(model: onnx.ModelProto, name: str) -> TensorProto | None:
    for g in iter_proto_graphs(model.graph):
        for t in g.initializer:
            if t.name == name:
                return t
    return None


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every value whose type is known (inputs, initializers, inferred, Constants)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types: dict[str, int] = {}
    for g in iter_proto_graphs(inferred.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
        for n in g.node:
            if n.op_type == "Cast":
                types[n.output[0]] = _attr(n, "to")
            elif n.op_type == "Constant":
                v = _attr(n, "value")
                if v is not None:
                    types[n.output[0]] = v.data_type
                elif any(a.name in ("value_float", "value_floats") for a in n.attribute):
                    types[n.output[0]] = TensorProto.FLOAT
    return types


def _decision(result, node: str):
    found = [d for d in result.decisions if d.node == node]
    assert found, f"no decision for node {node!r}"
    return found[0]


def _precision(result, node: str) -> str:
    return _decision(result, node).precision


def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.floating)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb))


# --------------------------------------------------------------------------------------------------
# the FP32 models
# --------------------------------------------------------------------------------------------------


def test_every_rule_graph_is_registered():
    assert EXPECTED <= set(NAMES), sorted(EXPECTED - set(NAMES))
    for e in ENTRIES:
        assert e.kind == "rule" and e.size == "small" and e.description


@pytest.mark.parametrize("name", NAMES)
def test_fp32_model_is_valid_and_runs(name):
    model = _fp32(name)
    _validate(model)
    assert 17 <= {o.domain: o.version for o in model.opset_import}[""] <= 21
    assert 8 <= model.ir_version <= 10
    outs = _reference(name)
    assert len(outs) == len(model.graph.output)
    for o, value in zip(model.graph.output, outs):
        if _is_float(value):
            assert np.isfinite(value).all(), f"{o.name}: FP32 reference is not finite"
            assert value.max() > value.min(), f"{o.name}: FP32 reference is constant"


@pytest.mark.parametrize("name", NAMES)
def test_build_is_deterministic(name):
    entry = catalog.get(name)
    assert entry.build(None).SerializeToString() == _fp32(name).SerializeToString()
    a, b = entry.make_inputs(np.random.default_rng(3)), entry.make_inputs(np.random.default_rng(3))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------------------------------
# generic checks of the conversions
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_fp16_conversion_is_valid(name):
    _validate(_converted(name, "fp16").model)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_conversion_is_valid(name):
    _validate(_converted(name, "bf16").model)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_io_types_and_ir_version_kept(name, target):
    """... and the opset imports, but where a BF16 conversion raised the default domain's for bfloat16
    Conv (to 22, at the IR version 22 needs: 10), which it says."""
    result = _converted(name, target)
    src, out = _fp32(name), result.model
    sig = lambda vis: [(v.name, v.type.tensor_type.elem_type) for v in vis]  # noqa: E731
    assert sig(out.graph.input) == sig(src.graph.input)
    assert sig(out.graph.output) == sig(src.graph.output)
    raised = target == "bf16" and any(n.op_type == "Conv" for n in src.graph.node) and opset_of(src) < 22
    assert (result.opset_change != "") == raised
    assert out.ir_version == (max(src.ir_version, 10) if raised else src.ir_version)
    expected = {(o.domain, 22 if raised and o.domain in ("", "ai.onnx") else o.version) for o in src.opset_import}
    assert {(o.domain, o.version) for o in out.opset_import} == expected


@pytest.mark.parametrize("name", NAMES)
def test_fp16_conversion_matches_fp32(name):
    entry = catalog.get(name)
    model = _converted(name, "fp16").model
    # the FP16 model itself runs (on the CPU provider standing in for CUDA, without what only its
    # own Casts crash: the conversion's load_check_skips)
    _run(model, _feeds(name), _converted(name, "fp16").load_check_skips)
    # Numbers with FP16 storage emulated exactly (onnxruntime's CPU provider runs most FP16 ops in
    # FP32 and drops the rounding between them).
    ref, got = _reference(name), _run(emulate(model), _feeds(name))
    assert len(got) == len(ref)
    if entry.blind_fails:  # a failure pattern: what the conversion does about it is tested with it
        pytest.skip(f"{EXPECTED_SKIP}{name}: {entry.blind_fails}")
    for o, r, g in zip(_fp32(name).graph.output, ref, got):
        if not _is_float(r):
            np.testing.assert_array_equal(g, r, err_msg=f"non-float output {o.name} differs")
            continue
        assert g.dtype == r.dtype, f"{o.name}: {g.dtype} instead of {r.dtype}"
        assert np.isfinite(g).all(), f"{o.name}: NaN/Inf in the FP16 model's output"
        cos = _cosine(r, g)
        assert cos >= entry.tolerance.min_cosine, f"{o.name}: cosine {cos:.6f}"
        err = float(np.max(np.abs(r.astype(np.float64) - g.astype(np.float64))))
        span = float(r.max() - r.min())
        assert err <= entry.tolerance.max_error_of_range * span, (
            f"{o.name}: max |error| {err:.4g} is {err / span:.2%} of the FP32 range {span:.4g}"
        )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_no_cast_undoes_another(name, target):
    model = _converted(name, target).model
    types = _elem_types(model)
    for g in iter_proto_graphs(model.graph):
        producers = {o: n for n in g.node for o in n.output}
        for n in g.node:
            if n.op_type != "Cast" or n.input[0] not in producers:
                continue
            first = producers[n.input[0]]
            if first.op_type != "Cast":
                continue
            source = types.get(first.input[0])
            assert source is None or _attr(n, "to") != source, (
                f"Cast {n.name!r} undoes Cast {first.name!r} ({first.input[0]!r} goes "
                f"{TensorProto.DataType.Name(source)} -> "
                f"{TensorProto.DataType.Name(_attr(first, 'to'))} -> back)"
            )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_one_cast_per_tensor_and_dtype(name, target):
    model = _converted(name, target).model
    for g in iter_proto_graphs(model.graph):
        seen: dict[tuple[str, int], str] = {}
        for n in g.node:
            if n.op_type != "Cast":
                continue
            key = (n.input[0], _attr(n, "to"))
            assert key not in seen, f"{n.name!r} and {seen[key]!r} both cast {key[0]!r} to {key[1]}"
            seen[key] = n.name


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_every_node_has_a_decision(name, target):
    r = _converted(name, target)
    decided = {(d.node, d.op_type) for d in r.decisions}
    for n in _all_nodes(r.model):
        assert (n.name, n.op_type) in decided, f"no decision for {n.op_type} {n.name!r}"
    for d in r.decisions:
        assert d.rule and d.reason, d


# --------------------------------------------------------------------------------------------------
# rule-specific checks (FP16 unless named otherwise)
# --------------------------------------------------------------------------------------------------


def _assert_fp16(r, *nodes):
    for node in nodes:
        d = _decision(r, node)
        assert d.precision == "fp16", f"{node}: {d.precision} ({d.rule}: {d.reason})"


def _assert_fp32(r, *nodes, rule: str | None = None):
    for node in nodes:
        d = _decision(r, node)
        assert d.precision == "fp32", f"{node}: {d.precision} ({d.rule}: {d.reason})"
        if rule is not None:
            assert d.rule == rule, f"{node}: rule {d.rule} instead of {rule} ({d.reason})"


def _assert_initializer_unchanged(name: str, model_name: str, target: str = "fp16"):
    before = _initializer(_fp32(model_name), name)
    after = _initializer(_converted(model_name, target).model, name)
    assert after is not None, f"initializer {name!r} is gone"
    assert after.data_type == before.data_type, f"{name!r} changed type to {after.data_type}"
    np.testing.assert_array_equal(numpy_helper.to_array(after), numpy_helper.to_array(before))


def _input_type(model: onnx.ModelProto, node: str, index: int = 0) -> int:
    return _elem_types(model)[_node(model, node).input[index]]


def check_mlp_softmax():
    r = _converted("mlp-softmax", "fp16")
    _assert_fp16(r, "matmul1", "matmul2", "add_bias")
    # the Softmax kernel accumulates in FP32 on CUDA: no casts between the two MatMuls
    assert r.casts_inserted == 2, f"{r.casts_inserted} casts (only the graph input and output need one)"


def check_exp_range():
    r = _converted("exp-range", "fp16")
    _assert_fp32(r, "exp", "reducesum", "log")
    assert _decision(r, "exp").rule.startswith("policy.high")
    _assert_fp16(r, "matmul1", "matmul2")
    assert _input_type(r.model, "exp") == TensorProto.FLOAT


def check_clip_log():
    r = _converted("clip-log", "fp16")
    _assert_fp32(r, "clip", rule="constant.underflow")
    _assert_fp32(r, "log")
    _assert_fp16(r, "matmul0", "matmul1")
    _assert_initializer_unchanged("clip_min", "clip-log")


def check_bn_big_variance():
    r = _converted("bn-big-variance", "fp16")
    _assert_fp32(r, "bn", rule="constant.overflow")
    _assert_fp16(r, "conv1", "conv2")
    for init in ("bn_var", "bn_mean", "bn_scale", "bn_bias"):
        _assert_initializer_unchanged(init, "bn-big-variance")
    assert _input_type(r.model, "bn") == TensorProto.FLOAT


def check_attention_mask_min():
    # float32 min used as -infinity in an additive mask: it becomes -32768 (same softmax), so the
    # whole attention block stays FP16 instead of being pinned to FP32.
    r = _converted("attention-mask-min", "fp16")
    d = _decision(r, "mask_where")
    assert d.precision == "fp16" and "-32768" in d.reason, d.reason
    _assert_fp16(r, "add_mask", "softmax")
    _assert_fp16(r, "q_proj", "k_proj", "v_proj", "scores", "attn_v", "o_proj")
    # the FP32 constant is never clamped in place: the converted copy holds -32768
    mask_inits = [i for i in r.model.graph.initializer if i.name.startswith("mask_min")]
    assert [numpy_helper.to_array(i).min() for i in mask_inits] == [-32768.0]


def check_attention_mask_min_bf16():
    # float32 min rounds to -inf in BF16 as well (BF16's largest finite value is 3.3895e38)
    r = _converted("attention-mask-min", "bf16")
    d = _decision(r, "mask_where")
    assert d.precision == "bf16" and "-32768" in d.reason, d.reason


def check_if_branches():
    r = _converted("if-branches", "fp16")
    _assert_fp16(r, "then_matmul", "else_matmul", "then2_matmul", "matmul_out")
    graphs = {d.graph for d in r.decisions}
    assert any("then_branch" in g for g in graphs) and any("else_branch" in g for g in graphs)
    # both branches of each If return the same dtype
    for if_name in ("if_sum", "if_flag"):
        node = _node(r.model, if_name)
        then_g, else_g = _attr(node, "then_branch"), _attr(node, "else_branch")
        t = [o.type.tensor_type.elem_type for o in then_g.output]
        e = [o.type.tensor_type.elem_type for o in else_g.output]
        assert t == e, f"{if_name}: then {t} vs else {e}"


def check_if_branches_bool_flag_false():
    model = _converted("if-branches", "fp16").model
    feeds = dict(_feeds("if-branches"), flag=np.array(False))
    ref, got = _run(_fp32("if-branches"), feeds)[0], _run(model, feeds)[0]
    assert _cosine(ref, got) >= 0.999


def check_loop_carried():
    r = _converted("loop-carried", "fp16")
    _assert_fp16(r, "body_matmul", "matmul_out")
    body = _attr(_node(r.model, "loop"), "body")
    carried_in = body.input[2].type.tensor_type.elem_type
    carried_out = body.output[1].type.tensor_type.elem_type
    assert carried_in == carried_out, (carried_in, carried_out)


def check_scan_rnn():
    r = _converted("scan-rnn", "fp16")
    _assert_fp16(r, "body_matmul_x", "body_matmul_h", "matmul_out")
    body = _attr(_node(r.model, "scan"), "body")
    assert body.input[0].type.tensor_type.elem_type == body.output[0].type.tensor_type.elem_type


def check_qdq():
    r = _converted("qdq", "fp16")
    _assert_fp16(r, "matmul")
    for init in ("W_q", "x_zero_point", "w_zero_point"):
        _assert_initializer_unchanged(init, "qdq")


def check_partly_fp16_not_stacked():
    r = _converted("partly-fp16", "fp16")
    _assert_initializer_unchanged("W16", "partly-fp16")
    _assert_fp16(r, "matmul_fp16")
    # never two Casts in a row
    model = r.model
    producers = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        if n.op_type == "Cast" and n.input[0] in producers:
            assert producers[n.input[0]].op_type != "Cast", f"{n.name} follows another Cast"


def check_partly_fp16_no_identity_cast():
    model = _converted("partly-fp16", "fp16").model
    types = _elem_types(model)
    for n in model.graph.node:
        if n.op_type == "Cast":
            assert types.get(n.input[0]) != _attr(n, "to"), (
                f"Cast {n.name!r} casts {n.input[0]!r} to the type it already has"
            )


def check_int_cast_float_not_stacked():
    model = _converted("int-cast-float", "fp16").model
    cast = _node(model, "cast_ids")
    consumers = [n for n in model.graph.node if cast.output[0] in n.input]
    assert consumers and all(n.op_type != "Cast" for n in consumers), [n.name for n in consumers]


def check_int_cast_float_retargeted():
    r = _converted("int-cast-float", "fp16")
    assert _attr(_node(r.model, "cast_ids"), "to") == TensorProto.FLOAT16
    _assert_fp16(r, "mul", "matmul")
    assert r.casts_inserted == 1, f"{r.casts_inserted} casts (only the graph output needs one)"


def check_layernorm_gelu():
    r = _converted("layernorm-gelu", "fp16")
    _assert_fp16(r, "fc1", "fc1_bias", "gelu", "fc2")


def check_layernorm_gelu_erf():
    r = _converted("layernorm-gelu-erf", "fp16")
    _assert_fp16(r, "fc1", "gelu_div", "gelu_erf", "gelu_add1", "gelu_mul", "gelu_half", "fc2")


def check_reductions():
    r = _converted("reductions", "fp16")
    _assert_fp32(r, "pow2", "reciprocal", "cumsum", "reducesum")
    _assert_fp32(r, "reducemean", "add_eps", "sqrt")
    _assert_fp16(r, "matmul")
    _assert_initializer_unchanged("eps", "reductions")


def check_resize_topk():
    r = _converted("resize-topk", "fp16")
    _assert_fp16(r, "conv1", "conv2")
    # Resize's scales are a fixed float input
    assert _input_type(r.model, "resize", 2) == TensorProto.FLOAT


def check_lstm_gru():
    r = _converted("lstm-gru", "fp16")
    _assert_fp16(r, "lstm", "gru")


def check_convtranspose_einsum():
    r = _converted("convtranspose-einsum", "fp16")
    _assert_fp16(r, "convtranspose")
    # K = 8 of the raw graph input 'a': below one MMA tile, kept FP32 (passes/analysis/raw_products.py)
    _assert_fp32(r, "einsum_bmm", rule="policy.high.raw-small-product")


def check_shared_initializer():
    r = _converted("shared-initializer", "fp16")
    _assert_fp32(r, "exp", "reducesum", "log")
    _assert_fp16(r, "matmul", "matmul2")
    model = r.model
    types = _elem_types(model)
    assert types[_node(model, "exp").input[0]] == TensorProto.FLOAT
    assert types[_node(model, "matmul").input[1]] == TensorProto.FLOAT16
    _assert_initializer_unchanged("W_shared", "shared-initializer")


def check_pool_pad_concat():
    r = _converted("pool-pad-concat", "fp16")
    _assert_fp16(r, "conv1", "conv2", "maxpool", "pad", "concat", "gap", "gemm")
    assert r.casts_inserted == 2, f"{r.casts_inserted} casts (only the graph input and output need one)"


def check_constant_nodes():
    r = _converted("constant-nodes", "fp16")
    _assert_fp16(r, "matmul")
    _assert_fp32(r, "div_big", rule="constant.overflow")
    big = _attr(_node(r.model, "const_big"), "value_float")
    if big is None:
        big = float(numpy_helper.to_array(_attr(_node(r.model, "const_big"), "value")))
    assert big == 1.0e5


RULE_CHECKS = [
    pytest.param(check_mlp_softmax, id="mlp-softmax"),
    pytest.param(check_exp_range, id="exp-range"),
    pytest.param(check_clip_log, id="clip-log"),
    pytest.param(check_bn_big_variance, id="bn-big-variance"),
    pytest.param(check_attention_mask_min, id="attention-mask-min"),
    pytest.param(check_attention_mask_min_bf16, id="attention-mask-min-bf16"),
    pytest.param(check_if_branches, id="if-branches"),
    pytest.param(check_if_branches_bool_flag_false, id="if-branches-flag-false"),
    pytest.param(check_loop_carried, id="loop-carried"),
    pytest.param(check_scan_rnn, id="scan-rnn"),
    pytest.param(check_qdq, id="qdq"),
    pytest.param(check_partly_fp16_not_stacked, id="partly-fp16-not-stacked"),
    pytest.param(check_partly_fp16_no_identity_cast, id="partly-fp16-no-identity-cast"),
    pytest.param(check_int_cast_float_not_stacked, id="int-cast-float-not-stacked"),
    pytest.param(check_int_cast_float_retargeted, id="int-cast-float-retargeted"),
    pytest.param(check_layernorm_gelu, id="layernorm-gelu"),
    pytest.param(check_layernorm_gelu_erf, id="layernorm-gelu-erf"),
    pytest.param(check_reductions, id="reductions"),
    pytest.param(check_resize_topk, id="resize-topk"),
    pytest.param(check_lstm_gru, id="lstm-gru"),
    pytest.param(check_convtranspose_einsum, id="convtranspose-einsum"),
    pytest.param(check_shared_initializer, id="shared-initializer"),
    pytest.param(check_pool_pad_concat, id="pool-pad-concat"),
    pytest.param(check_constant_nodes, id="constant-nodes"),
]


@pytest.mark.parametrize("check", RULE_CHECKS)
def test_rule(check):
    check()
