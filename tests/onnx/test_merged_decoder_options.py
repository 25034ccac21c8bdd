"""Data-driven options on a model whose compute lies inside an If (Optimum's merged decoders): --tolerance
says why it can pin nothing, and --target fp8 converts it (a sweep of such exports: both failed)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from amp_compiler import convert, refine
from amp_compiler.onnx.load.opset import raise_opset
from amp_compiler.onnx.load.proto_walk import model_graphs
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.onnx_builders import F32, tensor, vi, weights


def _branches(opset: int = 17, described: bool = False) -> onnx.ModelProto:
    """If(cond): then x @ w1 + an int64 Constant ``c`` cast to float, else x @ w2 + a float Constant ``c``:
    each branch makes a tensor ``c`` of its own type (legal: a branch is its own scope); ``described``:
    each branch's value_info says so, and gives its product a stale shape."""
    def branch(tag: str, w: str, c: onnx.TensorProto, cast: bool):
        nodes = [helper.make_node("MatMul", ["x", w], [f"p_{tag}"], name=f"mm_{tag}"),
                 helper.make_node("Constant", [], ["c"], name=f"c_{tag}", value=c)]
        added = "c"
        if cast:
            nodes.append(helper.make_node("Cast", ["c"], [f"cf_{tag}"], name=f"cast_{tag}", to=F32))
            added = f"cf_{tag}"
        nodes.append(helper.make_node("Add", [f"p_{tag}", added], [f"y_{tag}"], name=f"add_{tag}"))
        nodes.append(helper.make_node("Exp", [f"p_{tag}"], [f"e_{tag}"], name=f"exp_{tag}"))  # FP32: the If is mixed
        # with a stale shape too: strict inference refuses it, and the declared types are compared then
        info = [vi("c", c.data_type, [1]), vi(f"p_{tag}", F32, [5, 5])] if described else []
        return helper.make_graph(nodes, tag, [], [vi(f"y_{tag}", F32, ["n", 16]), vi(f"e_{tag}", F32, ["n", 16])],
                                 value_info=info)
    then = branch("then", "w1", helper.make_tensor("c", TensorProto.INT64, [1], [2]), True)
    other = branch("else", "w2", helper.make_tensor("c", TensorProto.FLOAT, [1], [0.5]), False)
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y", "e"], name="branch", then_branch=then, else_branch=other)], "g",
        [vi("cond", TensorProto.BOOL, []), vi("x", F32, ["n", 16])], [vi("y", F32, ["n", 16]), vi("e", F32, ["n", 16])],
        [tensor("w1", weights((16, 16), seed=1)), tensor("w2", weights((16, 16), seed=2))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    if not described:  # the stale shape is what onnx's full check refuses
        onnx.checker.check_model(m, full_check=True)
    return m


def _samples(n: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"cond": np.array(bool(i % 2)), "x": rng.standard_normal((3, 16)).astype(np.float32)} for i in range(n)]


def test_tolerance_says_why_it_pins_nothing_when_every_low_node_is_inside_an_if():
    """Before: "NOT met, 0 node(s) pinned" and no reason."""
    r = refine(_branches(), _samples(), 1e-5, runner=InProcessRunner())
    assert r.pinned == [] and r.why_fp32 is not None
    assert r.why_fp32.startswith("--tolerance pins nodes of the main graph only, and this model's ")
    assert "inside If/Loop/Scan bodies" in r.why_fp32


def test_same_named_tensors_of_two_branches_are_no_type_conflict():
    """Before: "invalid ONNX model: value_info says tensor 'c' is int64, but its producer Constant makes
    float": every subgraph's inferred types in one dict by name."""
    result = convert(_branches(described=True), probe=False)
    assert any(d.node == "mm_then" and d.precision == "fp16" for d in result.decisions)


def test_raising_the_opset_for_fp8_adds_no_value_info():
    """onnx's version converter writes its shape inference's value_info into every graph; in an If's
    branches it can contradict itself, and onnxruntime refused the written FP8 model."""
    raised = raise_opset(_branches(opset=17))
    assert all(len(g.value_info) == 0 for g in model_graphs(raised))
    result = convert(_branches(opset=17), target="fp8", samples=_samples(8), runner=InProcessRunner())
    ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
