"""A dynamic dim the probe does not recognise (points, atoms, events; named or not) and that is no batch
is probed at ``SET_SIZE``, not 1: at 1 a difference along it (``x[1:] - x[:-1]``) is empty and a softmax
over it is 1, so the probe saw nothing and the conversion stated 0.00% where real sizes gave Inf and 68%
(sweep S, D6). So is a first dim whose samples meet (``[N, N]`` pairs of N points: sweep Q). A model that
refuses the size falls back (smaller, then the search's 1). An output empty in
FP32 on the inputs is not measured, and the summary and a warning say so."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert, emulate
from amp_compiler.cli import main
from amp_compiler.core.tensor_error import ErrorStats, accuracy, exact_accuracy
from amp_compiler.onnx.measure import range_probe
from amp_compiler.onnx.measure.generated_inputs import batch_dims, dynamic_dims
from amp_compiler.onnx.measure.output_error import misses
from amp_compiler.onnx.measure.probe_dims import SET_SIZE, SHORTEST_SET, probe_dims
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.onnx_builders import F32, model, tensor, vi


def _events(points: str | None = None, batch: str = "batch") -> onnx.ModelProto:
    """events [batch, N, 8] (N unnamed, or named ``points``) -> per-step differences along N -> an MLP
    whose first layer scales them by 2e4 (raw units) -> mean over the steps: ``logits`` [batch, 3]; and
    ``weights``, a softmax over N of each event's squared norm. At N = 1 the differences are empty (the
    mean NaN) and the softmax 1."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 64)) * 2e4 / np.sqrt(8)).astype(np.float32)
    w2 = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    w3 = (rng.standard_normal((64, 3)) / 8 / 2e4).astype(np.float32)
    nodes = [
        helper.make_node("Slice", ["events", "one", "big", "axis1"], ["later"], name="later"),
        helper.make_node("Slice", ["events", "zero", "minus_one", "axis1"], ["earlier"], name="earlier"),
        helper.make_node("Sub", ["later", "earlier"], ["steps"], name="steps"),
        helper.make_node("MatMul", ["steps", "w1"], ["h1"], name="fc1"), helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="fc2"), helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w3"], ["h3"], name="fc3"),
        helper.make_node("ReduceMean", ["h3", "axis1"], ["logits"], name="mean", keepdims=0),
        helper.make_node("Mul", ["events", "events"], ["squares"], name="squares"),
        helper.make_node("ReduceSum", ["squares", "axis2"], ["norms"], name="norms", keepdims=0),
        helper.make_node("Softmax", ["norms"], ["weights"], name="softmax", axis=-1),
    ]
    inits = [tensor("w1", w1), tensor("w2", w2), tensor("w3", w3), tensor("one", np.array([1], np.int64)),
             tensor("zero", np.array([0], np.int64)), tensor("big", np.array([1 << 30], np.int64)),
             tensor("minus_one", np.array([-1], np.int64)), tensor("axis1", np.array([1], np.int64)),
             tensor("axis2", np.array([2], np.int64))]
    return model(nodes, [vi("events", F32, [batch, points, 8])],
                 [vi("logits", F32, [batch, 3]), vi("weights", F32, [batch, points])], inits)


def _real(n: int = 16, seed: int = 1) -> dict[str, np.ndarray]:
    return {"events": np.random.default_rng(seed).standard_normal((2, n, 8)).astype(np.float32)}


def test_an_unnamed_dim_that_is_no_batch_is_probed_at_the_set_size():
    m = _events()
    assert batch_dims(m, dynamic_dims(m)) == {"batch"}
    assert probe_dims(m) == [{"batch": 1, "events[1]": SET_SIZE}, {"batch": 1, "events[1]": SHORTEST_SET}]


def test_a_dim_named_by_a_batchs_letter_after_the_batch_is_no_batch():
    """``[b, n, 8]`` (sweep S's export): ``n`` counted as a batch by its name before, and was probed at 1."""
    m = _events(points="n", batch="b")
    assert batch_dims(m, dynamic_dims(m)) == {"b"}
    assert probe_dims(m)[0] == {"b": 1, "n": SET_SIZE}


def test_a_dim_name_shared_by_inputs_takes_one_size():
    nodes = [helper.make_node("Mul", ["a", "b"], ["y"], name="mul")]
    m = model(nodes, [vi("a", F32, ["batch", "atoms", 3]), vi("b", F32, ["batch", "atoms", 3])],
              [vi("y", F32, ["batch", "atoms", 3])])
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["a"].shape == probe.samples[0]["b"].shape == (1, SET_SIZE, 3)
    assert probe.dims == {"batch": 1, "atoms": SET_SIZE} and f"atoms={SET_SIZE}" in probe.inputs


def test_the_conversion_states_the_error_at_the_set_size():
    """Before: probed at N = 1, ``logits`` was NaN in FP32 (a mean of nothing) and ``weights`` 1, the
    first layer's 2e4-scaled differences never seen: the written model gave Inf on 16 events."""
    m = _events()
    result = convert(m, runner=InProcessRunner())
    assert result.probe_dims == {"batch": 1, "events[1]": SET_SIZE} and f"events[1]={SET_SIZE}" in result.probe_inputs
    stated = {a.name: a for a in result.accuracy}
    assert all(a.measured and a.finite for a in stated.values())
    assert 0 < stated["weights"].value_range < 1  # a softmax over 16 events, not one of 1
    real = dict(zip(["logits", "weights"], _run(m, _real()), strict=True))
    got = dict(zip(["logits", "weights"], _run(emulate(result.model), _real()), strict=True))
    for name in real:  # what was stated is what real sizes give (within the line): no Inf
        a = accuracy(name, [real[name]], [got[name]])
        assert a.finite and a.error_of_range <= max(2 * stated[name].error_of_range, 1e-3), (name, a, stated[name])


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with InProcessRunner() as runner:
        session = runner.load(m)
        try:
            return session.run(feeds)
        finally:
            session.close()


@pytest.mark.parametrize("takes, expected", [(SHORTEST_SET, SHORTEST_SET), (1, 1)])
def test_a_model_that_refuses_the_set_size_falls_back(takes, expected):
    """A Reshape to a fixed [1, takes] refuses any other size: the probe still runs, at the size it takes."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=-1)]
    m = model(nodes, [vi("x", F32, ["batch", "items"])], [vi("y", F32, [1, takes])],
              [tensor("shape", np.array([1, takes], np.int64))])
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.dims == {"batch": 1, "items": expected} and probe.samples[0]["x"].shape == (1, expected)
    assert f"items={expected}" in probe.inputs and f"{SET_SIZE}" in probe.inputs.split("did not run")[0]


def test_an_empty_output_is_not_measured():
    stats = ErrorStats()
    stats.add(np.zeros((1, 0, 8)), np.zeros((1, 0, 8)))
    a = stats.accuracy("steps")
    assert a.finite and not a.measured and a.empty
    b = exact_accuracy("idx", [np.zeros((0, 2), np.int64)], [np.zeros((0, 2), np.int64)])
    assert not b.measured and b.empty
    c = exact_accuracy("idx", [np.zeros((0, 2), np.int64)], [np.zeros((1, 2), np.int64)])
    assert c.measured and not c.empty and c.changed == 2  # another shape: changed, measured


def test_convert_says_which_outputs_were_empty(tmp_path, capsys):
    """The differences themselves as an output, the events given as one (``--input-shape``): nothing to compare."""
    m = _events()
    m.graph.output.append(vi("steps", F32, ["batch", None, 8]))
    src, dst, report = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx", tmp_path / "r.json"
    onnx.save(m, src)
    code = main([str(a) for a in ["convert", src, "-o", dst, "--input-shape", "events:1x1x8", "--report", report]])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "steps not measured (empty in FP32)" in out
    assert ("warning: output 'steps': FP32's output is empty (no values) on generated inputs, so its error is not "
            "measured; give --input-shape NAME:DIMS at sizes it has values at, or --calibration-data DIR") in (
        " ".join(err.split()))
    accuracy_of = {a["name"]: a for a in json.loads(report.read_text())["summary"]["accuracy"]}
    assert accuracy_of["steps"]["empty"] is True and accuracy_of["steps"]["measured"] is False
    assert accuracy_of["weights"]["empty"] is False


def _gram(output_dims: list) -> onnx.ModelProto:
    """pos [N, 3] -> squared distances |a|^2 + |b|^2 - 2 a.b of every pair (PointNet++'s square_distance)
    -> a cosine cutoff 0.5 (cos(pi d / 5) + 1) (SchNet's; sweep Q's repro_gram), output ``output_dims`` (an
    exporter's fresh names, or N twice)."""
    nodes = [
        helper.make_node("Transpose", ["pos"], ["pos_t"], name="t", perm=[1, 0]),
        helper.make_node("MatMul", ["pos", "pos_t"], ["gram"], name="gram"),
        helper.make_node("Mul", ["pos", "pos"], ["p2"], name="p2"),
        helper.make_node("ReduceSum", ["p2", "axis1"], ["sq"], name="sq", keepdims=1),
        helper.make_node("Transpose", ["sq"], ["sq_t"], name="sq_t", perm=[1, 0]),
        helper.make_node("Add", ["sq", "sq_t"], ["s2"], name="s2"),
        helper.make_node("Mul", ["gram", "two"], ["g2"], name="g2"),
        helper.make_node("Sub", ["s2", "g2"], ["d2_raw"], name="d2"),
        helper.make_node("Relu", ["d2_raw"], ["d2"], name="relu"),
        helper.make_node("Sqrt", ["d2"], ["d"], name="sqrt"),
        helper.make_node("Mul", ["d", "pi_cut"], ["angle"], name="angle"),
        helper.make_node("Cos", ["angle"], ["cos"], name="cos"),
        helper.make_node("Add", ["cos", "one"], ["cos1"], name="cos1"),
        helper.make_node("Mul", ["cos1", "half"], ["cutoff"], name="cutoff"),
    ]
    constants = [tensor("axis1", np.array([1], np.int64)), tensor("two", np.array(2.0, np.float32)),
                 tensor("pi_cut", np.array(np.pi / 5, np.float32)), tensor("one", np.array(1.0, np.float32)),
                 tensor("half", np.array(0.5, np.float32))]
    return model(nodes, [vi("pos", F32, ["N", 3])], [vi("cutoff", F32, output_dims)], constants)


@pytest.mark.parametrize("output_dims", [["N", "N"], ["MatMul_dim_0", "MatMul_dim_1"], [None, None]])
def test_a_first_dim_whose_samples_meet_is_no_batch(output_dims):
    """[N, 3] atoms: N is the first dim of a rank-2 input and named by a batch's letter, and was probed at 1
    (one distance, 0): the [N, N] distances say its samples meet (sweep Q: 57% off on real atoms, stated 0.00%
    even with the coordinates' range given)."""
    m = _gram(output_dims)
    assert batch_dims(m, dynamic_dims(m)) == set()
    assert probe_dims(m)[0] == {"N": SET_SIZE}
    # the Gram MatMul forced FP16 (policy.high.raw-small-product keeps it FP32 by default): the cancellation of its
    # rounding is now seen by the probe (one atom: 0.00%; real ones 57%)
    result = convert(m, runner=InProcessRunner(), input_ranges={"pos": (0.0, 70.0)}, allow_nodes=["gram"])
    assert result.probe_dims == {"N": SET_SIZE}
    (stated,) = result.accuracy
    assert misses(stated), stated  # past the line: the command line warns


def test_a_clip_heads_batch_of_pairs_is_probed_at_the_set_size():
    """image and text features [N, D] -> similarity of every pair [N, N] -> softmax over the texts: at N = 1
    the probabilities were 1 and stated 0.00%."""
    nodes = [helper.make_node("Transpose", ["text"], ["text_t"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["image", "text_t"], ["logits"], name="sim"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1)]
    m = model(nodes, [vi("image", F32, ["N", 16]), vi("text", F32, ["N", 16])],
              [vi("probs", F32, ["MatMulprobs_dim_0", "MatMulprobs_dim_1"])])
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.dims == {"N": SET_SIZE} and probe.samples[0]["text"].shape == (SET_SIZE, 16)
    assert probe.ranges["probs"].max < 1


def test_the_prompts_a_zero_shot_softmax_runs_over_are_no_batch():
    """One image's features [1, D] against N text prompts [N, D] -> logits [1, N] -> softmax over the prompts (CLIP
    zero-shot): at N = 1 the output was the constant 1, stated 0.00% (sweep C1: 1.7% off with 50 prompts)."""
    nodes = [helper.make_node("Transpose", ["text"], ["text_t"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["image", "text_t"], ["logits"], name="sim"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1)]
    m = model(nodes, [vi("image", F32, [1, 16]), vi("text", F32, ["n", 16])], [vi("probs", F32, [1, "n"])])
    assert batch_dims(m, dynamic_dims(m)) == set() and probe_dims(m)[0] == {"n": SET_SIZE}
    plain = model([helper.make_node("Softmax", ["text"], ["probs"], name="softmax", axis=-1)],
                  [vi("text", F32, ["n", 16])], [vi("probs", F32, ["n", 16])])
    assert batch_dims(plain, dynamic_dims(plain)) == {"n"}  # a softmax along another dim: a batch still


def test_a_batch_named_so_is_trusted_and_an_unpaired_first_dim_stays_a_batch():
    m = _gram(["batch", "batch"])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    assert batch_dims(m, dynamic_dims(m)) == {"batch"}
    nodes = [helper.make_node("Relu", ["pos"], ["y"], name="relu")]
    plain = model(nodes, [vi("pos", F32, ["N", 3])], [vi("y", F32, ["N", 3])])
    assert batch_dims(plain, dynamic_dims(plain)) == {"N"} and probe_dims(plain) == []


def test_a_model_that_takes_no_batch_of_one_is_probed_with_two():
    """hummingbird's compiled trees squeeze every dim of 1 before a 2-D Transpose: at batch 1 it reads a vector and
    onnxruntime refuses every size the search tried, so the conversion ran without the probe (sweep T)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.linspace(-1, 1, 12).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Squeeze", ["x"], ["s"]), helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0]),
         helper.make_node("MatMul", ["w", "t"], ["y"])], "trees",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, "N"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = convert(model, runner=InProcessRunner())
    assert not result.probe_skipped and result.probe_shapes == {"x": (2, 4)}
    assert result.accuracy and result.accuracy[0].measured
