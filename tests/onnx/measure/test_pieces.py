"""A model cut into a chain of pieces computes what the whole model computes: calibration's ranges
through the chain are those of one run with every tensor exposed, on catalog models with subgraphs
(If, Loop, Scan), shared initializers and the wheels' real networks."""

from __future__ import annotations

import numpy as np
import pytest

from amp_compiler.onnx.measure.calibrate import IntermediateRunner, collect_ranges
from amp_compiler.onnx.measure.chain import exposed_model
from amp_compiler.onnx.measure.pieces import MAX_NODES, NODES_PER_PIECE, chain_pieces, live_bytes
from amp_compiler.runtime import child_folds
from amp_compiler.runtime.runner import InProcessRunner
from models import catalog

MODELS = ["if-branches", "loop-carried", "scan-rnn", "shared-initializer", "lstm-gru", "bert-base-small",
          "t5-small-decoder-small", "llama-torch-kv-small", "ppocr-cls", "silero-vad"]


@pytest.mark.parametrize("name", MODELS)
def test_chain_ranges_are_the_whole_models(name):
    entry = catalog.get(name)
    model = catalog.load(entry)
    rng = np.random.default_rng(0)
    samples = [entry.make_inputs(rng) for _ in range(2)]
    runner = InProcessRunner()
    whole = IntermediateRunner(model, runner)
    expected: dict[str, list] = {}
    for sample in samples:
        for tensor, value in whole.run(sample).items():
            if np.asarray(value).dtype.kind == "f":
                child_folds.fold_array(np, expected, tensor, np.asarray(value))
        for tensor, value in sample.items():
            if value.dtype.kind == "f":
                child_folds.fold_array(np, expected, tensor, value)
    whole.close()
    ranges = collect_ranges(model, samples, runner=runner)
    assert set(ranges) == set(expected)
    # to the last bits: with few samples the pieces skip weight prepacking, and onnxruntime's LSTM then
    # takes another GEMM path (a relative 1e-7 in its products, which no range decides on)
    last_bits = 1e-6
    for tensor, stats in expected.items():
        got = ranges[tensor]
        assert got.count == stats[6], tensor
        assert got.absmax == pytest.approx(stats[2], rel=last_bits), tensor
        if stats[6]:
            assert (got.min, got.max) == pytest.approx((stats[0], stats[1]), rel=last_bits), tensor


def test_pieces_cover_the_graph_in_order():
    model = catalog.load("bert-base-small")
    exposed, names = exposed_model(model)
    pieces = list(chain_pieces(exposed, names))
    assert len(pieces) == -(-len(exposed.graph.node) // NODES_PER_PIECE)
    assert [n.SerializeToString() for p in pieces for n in p.graph.node] == [
        n.SerializeToString() for n in exposed.graph.node
    ]
    given = [o.name for p in pieces for o in p.graph.output if o.name in set(names)]
    assert sorted(given) == sorted(names)  # every exposed tensor comes out of exactly one piece


def test_pieces_cut_by_size_hold_at_most_the_budget():
    model = catalog.load("ppocr-v4-det")
    exposed, names = exposed_model(model)
    sizes = {n: 1000 * (i % 7 + 1) for i, n in enumerate(names)}
    budget = live_bytes(exposed, sizes)
    pieces = list(chain_pieces(exposed, names, sizes, budget))
    assert 1 < len(pieces) < len(exposed.graph.node)
    for piece in pieces:
        held = sum(sizes[o] for node in piece.graph.node for o in node.output if o in sizes)
        assert len(piece.graph.node) == 1 or held <= budget
        assert len(piece.graph.node) <= MAX_NODES


def test_live_bytes_counts_values_from_producer_to_last_consumer():
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", f, None)], [helper.make_tensor_value_info("y", f, None)],
    )
    sizes = {"x": 1, "a": 10, "b": 100, "c": 1000, "y": 10000}
    # x lives until Relu a; a until the Add; at the Add: a, b, c alive; at the last Relu: c and y
    assert live_bytes(helper.make_model(graph), sizes) == 11000


def test_no_value_of_joined_crosses_between_pieces():
    """Emulated BF16 and FP8 models' bfloat16 and float8 values, which onnxruntime cannot hand over, stay
    inside one piece."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Relu", ["x"], ["t0"])]
    for k in range(20):
        nodes += [helper.make_node("Cast", [f"t{k}"], [f"h{k}"], to=TensorProto.BFLOAT16),
                  helper.make_node("Cast", [f"h{k}"], [f"t{k + 1}"], to=f)]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f, [4])], [helper.make_tensor_value_info("t20", f, [4])],
        value_info=[helper.make_tensor_value_info(f"h{k}", TensorProto.BFLOAT16, [4]) for k in range(20)]
        + [helper.make_tensor_value_info(f"t{k}", f, [4]) for k in range(20)],
    ), opset_imports=[helper.make_opsetid("", 17)])
    joined = {f"h{k}" for k in range(20)}
    names = [f"t{k}" for k in range(21)]
    free = list(chain_pieces(model, names))
    assert any(i.name in joined for p in free for i in p.graph.input)  # NODES_PER_PIECE (even) cuts them
    pieces = list(chain_pieces(model, names, joined=joined))
    assert len(pieces) > 1 and not any(i.name in joined for p in pieces for i in p.graph.input)
    assert [n.output[0] for p in pieces for n in p.graph.node] == [n.output[0] for n in nodes]


def test_a_graph_output_no_node_computes_keeps_the_model_whole():
    model = catalog.load("bert-base-small")
    exposed, names = exposed_model(model)
    exposed.graph.output.append(exposed.graph.input[0])
    assert list(chain_pieces(exposed, names)) == [exposed]
