"""Routing scores (``routing.score``): a TopK/ArgMax whose indices an index input reads (OneHot, Gather, Scatter,
Equal: they pick which computation runs, a mixture-of-experts router) reads scores computed in FP32, from the small
router product through Softmax/Sigmoid/bias Add/Cast; the experts' products stay FP16, a vocabulary-sized product
stays FP16, and a selection only written to a graph output (a classifier's label) pins nothing."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from tests.support.onnx_builders import F32, tensor, vi
from tests.support.onnx_builders import model as make_model

H = 64
I64 = onnx.TensorProto.INT64


def _router(experts: int, scores: list[onnx.NodeProto], reader: str = "OneHot", k: int = 2) -> onnx.ModelProto:
    """x -> ``scores`` (ending in tensor "s") -> TopK -> indices read by ``reader`` (OneHot, or only the graph
    output with "output"), the top values normalised into gates that weight the experts' product "experts"."""
    rng = np.random.default_rng(0)
    nodes = [*scores,
             helper.make_node("TopK", ["s", "k"], ["vals", "idx"], axis=-1, name="topk"),
             helper.make_node("ReduceSum", ["vals", "ax"], ["sum"], keepdims=1, name="rsum"),
             helper.make_node("Div", ["vals", "sum"], ["w"], name="norm"),
             helper.make_node("MatMul", ["x", "We"], ["e"], name="experts"),
             helper.make_node("Reshape", ["e", "eshape"], ["e3"], name="e3")]
    if reader == "OneHot":  # gates (n, E) = sum over k of onehot(idx) * w; y = sum over E of gates * experts
        nodes += [helper.make_node("OneHot", ["idx", "depth", "onoff"], ["oh"], axis=-1, name="onehot"),
                  helper.make_node("Unsqueeze", ["w", "ax"], ["w3"], name="w3"),
                  helper.make_node("Mul", ["oh", "w3"], ["ohw"], name="ohw"),
                  helper.make_node("ReduceSum", ["ohw", "one"], ["gates"], keepdims=0, name="gates")]
    else:  # the indices only leave the graph; the gates weight the first k experts
        nodes += [helper.make_node("Pad", ["w", "pads"], ["gates"], name="gates")]
    nodes += [helper.make_node("Unsqueeze", ["gates", "ax"], ["g3"], name="g3"),
              helper.make_node("Mul", ["e3", "g3"], ["eg"], name="eg"),
              helper.make_node("ReduceSum", ["eg", "one"], ["y"], keepdims=0, name="combine")]
    inits = [tensor("Wg", (rng.standard_normal((H, experts)) * 0.02).astype(np.float32)),
             tensor("bias", (rng.standard_normal(experts) * 0.001).astype(np.float32)),
             tensor("We", (rng.standard_normal((H, experts * H)) * H ** -0.5).astype(np.float32)),
             tensor("k", np.array([k], np.int64)), tensor("ax", np.array([-1], np.int64)),
             tensor("one", np.array([1], np.int64)), tensor("depth", np.array(experts, np.int64)),
             tensor("onoff", np.array([0, 1], np.float32)), tensor("eshape", np.array([0, experts, H], np.int64)),
             tensor("pads", np.array([0, 0, 0, experts - k], np.int64))]
    return make_model(nodes, [vi("x", F32, ["n", H])], [vi("y", F32, ["n", H]), vi("idx", I64, ["n", k])], inits)


def _softmax_router(experts: int, reader: str = "OneHot") -> onnx.ModelProto:
    """What torch.onnx.export writes for Qwen3-MoE/OLMoE/DBRX: MatMul -> Softmax -> Cast(FLOAT) -> TopK."""
    return _router(experts, [helper.make_node("MatMul", ["x", "Wg"], ["logits"], name="gate"),
                             helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="softmax"),
                             helper.make_node("Cast", ["p"], ["s"], to=onnx.TensorProto.FLOAT, name="cast")], reader)


def _changed_experts(m: onnx.ModelProto, converted: onnx.ModelProto, n: int = 4096) -> int:
    x = np.random.default_rng(1).standard_normal((n, H)).astype(np.float32)
    (_, want), (_, got) = (run_onnxruntime(mm, {"x": x}) for mm in (m, emulate(converted)))
    return int((np.sort(want, -1) != np.sort(got, -1)).any(-1).sum())


def test_a_softmax_router_computes_its_scores_in_fp32_and_routes_as_fp32_does():
    m = _softmax_router(64)
    result = convert(m, probe=False)
    by_node = {d.node: d for d in result.decisions}
    for name in ("gate", "softmax", "topk"):
        assert (by_node[name].precision, by_node[name].rule) == ("fp32", "routing.score"), name
    assert "OneHot node 'onehot' reads the indices" in by_node["softmax"].reason
    assert "64 columns" in by_node["gate"].reason
    assert by_node["experts"].precision == "fp16"  # the experts' product, the FLOPs, stays low
    # before: the Softmax placed FP16 by min-cut and the router MatMul FP16 changed 19 of 4096 tokens' experts
    # (30.7% of the output's range); the router's input is FP16-rounded still: 0 here
    assert _changed_experts(m, result.model) == 0


def test_a_router_topk_reading_a_gemm_and_a_bias_is_fp32():
    """gpt-oss: Gemm (+ bias) -> TopK, the TopK painted FP16 before; DeepSeek-V3: Sigmoid -> bias Add -> TopK."""
    gemm = _router(32, [helper.make_node("Gemm", ["x", "Wg", "bias"], ["s"], name="gate")])
    by_node = {d.node: d for d in convert(gemm, probe=False).decisions}
    assert [by_node[n].rule for n in ("gate", "topk")] == ["routing.score"] * 2
    sigmoid = _router(8, [helper.make_node("MatMul", ["x", "Wg"], ["logits"], name="gate"),
                          helper.make_node("Sigmoid", ["logits"], ["p"], name="sigmoid"),
                          helper.make_node("Add", ["p", "bias"], ["s"], name="correction")])
    by_node = {d.node: d for d in convert(sigmoid, probe=False).decisions}
    assert [by_node[n].rule for n in ("gate", "sigmoid", "correction", "topk")] == ["routing.score"] * 4
    by_node = {d.node: d for d in convert(sigmoid, probe=False, allow_ops=["MatMul"]).decisions}
    assert by_node["gate"].precision == "fp16"  # the user's --allow-op is theirs to keep


def test_a_vocabulary_sized_product_is_no_router():
    """An LM head (1024 columns here, thousands in practice) feeding an in-graph TopK stays FP16; the Softmax
    after it, which costs no product, is still kept FP32."""
    by_node = {d.node: d for d in convert(_softmax_router(1024), probe=False).decisions}
    assert by_node["gate"].precision == "fp16"
    assert (by_node["softmax"].precision, by_node["softmax"].rule) == ("fp32", "routing.score")


def test_a_selection_only_written_to_an_output_pins_nothing():
    """A classifier's label (TopK/ArgMax indices leaving the graph) is measured and reported, not pinned."""
    by_node = {d.node: d for d in convert(_softmax_router(8, reader="output"), probe=False).decisions}
    assert all(d.rule != "routing.score" for d in by_node.values())
    assert by_node["gate"].precision == "fp16"


def test_an_argmax_compared_with_equal_routes():
    """ArgMax -> Equal(expert id): a top-1 router's mask."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "Wg"], ["logits"], name="gate"),
             helper.make_node("ArgMax", ["logits"], ["top"], axis=-1, keepdims=1, name="argmax"),
             helper.make_node("Equal", ["top", "zero"], ["mask"], name="is_expert0"),
             helper.make_node("MatMul", ["x", "We"], ["e"], name="expert0"),
             helper.make_node("Where", ["mask", "e", "zeros"], ["y"], name="route")]
    m = make_model(nodes, [vi("x", F32, ["n", H])], [vi("y", F32, ["n", H])],
                   [tensor("Wg", (rng.standard_normal((H, 4)) * 0.02).astype(np.float32)),
                    tensor("We", rng.standard_normal((H, H)).astype(np.float32)),
                    tensor("zero", np.array([0], np.int64)), tensor("zeros", np.zeros(1, np.float32))])
    by_node = {d.node: d for d in convert(m, probe=False).decisions}
    assert (by_node["gate"].precision, by_node["gate"].rule) == ("fp32", "routing.score")
    assert by_node["expert0"].precision == "fp16"


def test_the_policy_says_why_for_every_selection():
    from amp_compiler.policy import default_table

    table = default_table()
    selections = {p.op: p.selects for p in table if p.selects}
    assert set(selections) == {"TopK", "ArgMax", "ArgMin"}
    assert all(len(why) > 40 for why in selections.values())
    readers = {p.op: p.index_inputs for p in table if p.index_inputs and p.domain in ("", "ai.onnx")}
    assert {"Gather": (1,), "OneHot": (0,), "ScatterElements": (1,), "Equal": (0, 1)}.items() <= readers.items()
