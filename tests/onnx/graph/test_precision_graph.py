"""The precision graph: vertices come from schema type parameters, ties and fixed types."""

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from amp_compiler.core.graph import SlotKind
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.onnx.ir.slots import Slot
from amp_compiler.policy.schemas import is_onnx_domain
from amp_compiler.targets import Target
from tests.support.onnx_builders import F32, TEST_POLICY, model, tensor, vi, weights


def _graph(m, target=Target.FP16, keep_io=True):
    import onnx.shape_inference

    irm = ir.from_proto(onnx.shape_inference.infer_shapes(m))
    return irm, build_precision_graph(irm, target, TEST_POLICY, keep_io_types=keep_io)


def _node(irm, name):
    return next(n for n in irm.graph if n.name == name)


def _vertex(g, node, kind, i):
    return g.vertex_of(Slot(kind, node, i))


def test_matmul_inputs_and_output_share_one_vertex():
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, [2, 4])], [vi("y", F32, [2, 3])], [tensor("w", weights((4, 3)))],
    )
    irm, g = _graph(m)
    mm = _node(irm, "mm")
    v = _vertex(g, mm, SlotKind.NODE_OUT, 0)
    assert v is _vertex(g, mm, SlotKind.NODE_IN, 0) is _vertex(g, mm, SlotKind.NODE_IN, 1)
    assert v.free and v.constants and v.constants[0].name == "w"
    # keep_io_types: the graph input and output are fixed vertices of their own
    assert not g.vertex_of(Slot(SlotKind.GRAPH_IN, irm.graph, 0)).free
    assert list(g.digraph.edges) and g.digraph.number_of_edges() == 2


def test_batchnorm_statistics_follow_the_data_type():
    c = 3
    m = model(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")],
        [vi("x", F32, [1, c, 4, 4])], [vi("y", F32, [1, c, 4, 4])],
        [tensor(n, np.ones(c, np.float32)) for n in "sbmv"],
        opset=15,
    )
    irm, g = _graph(m)
    bn = _node(irm, "bn")
    vertices = {id(_vertex(g, bn, SlotKind.NODE_IN, i)) for i in range(5)}
    assert len(vertices) == 1


def test_layernorm_stash_outputs_stay_fixed():
    m = model(
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], name="ln")],
        [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8]), vi("mean", F32, [2, 1]), vi("inv", F32, [2, 1])],
        [tensor("s", np.ones(8, np.float32)), tensor("b", np.zeros(8, np.float32))],
    )
    irm, g = _graph(m)
    ln = _node(irm, "ln")
    assert _vertex(g, ln, SlotKind.NODE_OUT, 0).free
    mean = _vertex(g, ln, SlotKind.NODE_OUT, 1)
    assert not mean.free and "does not allow fp16" in mean.fixed_reason
    # BF16 is allowed for the stash type by the schema, but it is an output-only type: fixed
    irm, g = _graph(m, Target.BF16)
    assert not _vertex(g, _node(irm, "ln"), SlotKind.NODE_OUT, 1).free


def test_cast_from_int_is_free_but_cast_between_floats_is_fixed():
    m = model(
        [
            helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT, name="c_int"),
            helper.make_node("Cast", ["f"], ["h"], to=TensorProto.FLOAT16, name="c_half"),
            helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="c_back"),
        ],
        [vi("i", TensorProto.INT64, [3])], [vi("y", F32, [3])],
    )
    irm, g = _graph(m)
    assert _vertex(g, _node(irm, "c_int"), SlotKind.NODE_OUT, 0).free
    back = _vertex(g, _node(irm, "c_back"), SlotKind.NODE_OUT, 0)
    assert not back.free and "explicit precision boundary" in back.fixed_reason
    # the input and output of a Cast are never one vertex
    c_half = _node(irm, "c_half")
    assert _vertex(g, c_half, SlotKind.NODE_IN, 0) is not _vertex(g, c_half, SlotKind.NODE_OUT, 0)


def test_if_outputs_are_tied_to_branch_outputs():
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"], name="relu")], "then", [], [vi("t", F32, [2])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["e"], name="tanh")], "else", [], [vi("e", F32, [2])]
    )
    m = model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if")],
        [vi("c", TensorProto.BOOL, []), vi("x", F32, [2])], [vi("y", F32, [2])],
    )
    irm, g = _graph(m)
    node = _node(irm, "if")
    v = _vertex(g, node, SlotKind.NODE_OUT, 0)
    then_b = node.attributes["then_branch"].value
    else_b = node.attributes["else_branch"].value
    assert g.vertex_of(Slot(SlotKind.GRAPH_OUT, then_b, 0)) is v
    assert g.vertex_of(Slot(SlotKind.GRAPH_OUT, else_b, 0)) is v
    assert v.free


def test_loop_carried_value_is_one_vertex():
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Tanh", ["s_in"], ["s_out"], name="tanh"),
        ],
        "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("s_in", F32, [2])],
        [vi("cond_out", TensorProto.BOOL, []), vi("s_out", F32, [2])],
    )
    m = model(
        [helper.make_node("Loop", ["n", "", "s0"], ["s"], body=body, name="loop")],
        [vi("n", TensorProto.INT64, []), vi("s0", F32, [2])], [vi("s", F32, [2])],
    )
    irm, g = _graph(m)
    loop = _node(irm, "loop")
    body_g = loop.attributes["body"].value
    v = _vertex(g, loop, SlotKind.NODE_OUT, 0)
    assert _vertex(g, loop, SlotKind.NODE_IN, 2) is v
    assert g.vertex_of(Slot(SlotKind.GRAPH_IN, body_g, 2)) is v
    assert g.vertex_of(Slot(SlotKind.GRAPH_OUT, body_g, 1)) is v


def test_unknown_op_slots_are_fixed():
    m = model(
        [helper.make_node("Mystery", ["x"], ["y"], domain="custom.test", name="m")],
        [vi("x", F32, [2])], [vi("y", F32, [2])],
        extra_opsets=[helper.make_opsetid("custom.test", 1)],
    )
    irm, g = _graph(m)
    assert [n.name for n in g.unknown_ops] == ["m"]
    v = _vertex(g, _node(irm, "m"), SlotKind.NODE_IN, 0)
    assert not v.free and "no schema" in v.fixed_reason


def test_fixed_type_input_is_never_free():
    m = model(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", name="rs")],
        [vi("x", F32, [1, 1, 2, 2])], [vi("y", F32, [1, 1, 4, 4])],
        [tensor("scales", np.array([1, 1, 2, 2], np.float32))],
    )
    irm, g = _graph(m)
    rs = _node(irm, "rs")
    assert _vertex(g, rs, SlotKind.NODE_IN, 0).free
    assert not _vertex(g, rs, SlotKind.NODE_IN, 2).free


@pytest.mark.parametrize("target", [Target.FP16, Target.BF16])
def test_building_never_edits_the_model(target):
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, [2, 4])], [vi("y", F32, [2, 3])], [tensor("w", weights((4, 3)))],
    )
    irm, _ = _graph(m, target)
    assert all(v.dtype == ir.DataType.FLOAT for v in irm.graph.initializers.values())


def _summary(graph):
    """Everything a vertex carries, in vertex order, with nodes named by their position."""
    position = {id(n): k for k, n in enumerate(n for g in graph.model.graphs() for n in g)}

    def owner(o):
        return ("node", position[id(o)]) if isinstance(o, ir.Node) else ("graph", o.name)

    return [
        (
            [(s.kind, owner(s.owner), s.index) for s in v.slots],
            None if v.node is None else position[id(v.node)],
            v.dtype, v.policy.op if v.policy else None, v.fixed_reason,
            sorted(c.name for c in v.constants), sorted(graph.digraph.succ[v.id]),
        )
        for v in graph.vertices
    ]


@pytest.mark.parametrize(
    "name", ["bert-base-small", "silero-vad", "if-branches", "loop-carried", "scan-rnn", "qdq", "partly-fp16"]
)
@pytest.mark.parametrize("target", [Target.FP16, Target.BF16])
def test_templated_nodes_build_the_graph_the_slow_path_builds(name, target, monkeypatch):
    """Nodes of one shape copy the first one's grouping (a template); building every node the
    slow way gives the same graph, vertex for vertex."""
    import onnx.shape_inference

    from amp_compiler.onnx.graph import precision_graph as graph_module
    from amp_compiler.policy import default_table
    from models import catalog

    entry = next(e for e in catalog.entries("small") if e.name == name)
    proto = onnx.shape_inference.infer_shapes(catalog.load(entry))

    def build():
        return build_precision_graph(ir.from_proto(proto), target, default_table())

    fast = _summary(build())

    def slow(self, node):
        if not (node.op_type == "Constant" and is_onnx_domain(node.domain)):
            self._add_node_slow(node)

    monkeypatch.setattr(graph_module._Builder, "_add_node", slow)
    assert fast == _summary(build())


def test_a_never_touched_ops_reason_says_so_once():
    """The table's NONFLOAT reasons start 'Never touched:'; the vertex said 'ArgMax is never touched: Never
    touched: ...'."""
    from amp_compiler import convert

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("ArgMax", ["y"], ["label"], axis=1)]
    m = model(nodes, [vi("x", shape=[2, 8])], [vi("label", TensorProto.INT64, [2, 1])], [tensor("w", weights((8, 4)))])
    (argmax,) = [d for d in convert(m, probe=False).decisions if d.op_type == "ArgMax"]
    assert argmax.reason.lower().count("never touched") == 1 and "ArgMax: Never touched: it returns int64" in argmax.reason
