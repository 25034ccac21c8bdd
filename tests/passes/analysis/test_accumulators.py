"""Loop accumulators: a Loop/Scan state its body adds into itself stays FP32 (a running sum, like CumSum)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from tests.support.onnx_builders import F32, model, tensor, vi, weights

D = 16


def _scan_model(update: str = "add") -> onnx.ModelProto:
    """A Scan over seq [T, D]: p = x_t @ W; the state s' = s + p ("add"), or s' = tanh(s + p) ("tanh");
    the final state and every step's state projected by MatMuls (so, without the rule, the state is painted
    FP16 between them)."""
    nodes = [helper.make_node("MatMul", ["x_t", "W"], ["p"], name="body_mm"),
             helper.make_node("Add", ["s", "p"], ["a" if update == "tanh" else "s2"], name="body_add")]
    if update == "tanh":
        nodes.append(helper.make_node("Tanh", ["a"], ["s2"], name="body_tanh"))
    nodes.append(helper.make_node("Identity", ["s2"], ["y_t"], name="body_out"))
    body = helper.make_graph(nodes, "body", [vi("s", F32, [D]), vi("x_t", F32, [D])],
                             [vi("s2", F32, [D]), vi("y_t", F32, [D])])
    return model(
        [helper.make_node("Scan", ["s0", "seq"], ["s_final", "running"], name="scan", num_scan_inputs=1, body=body),
         helper.make_node("Unsqueeze", ["s_final", "ax0"], ["s_row"]),
         helper.make_node("MatMul", ["s_row", "Wo"], ["y"], name="after"),
         helper.make_node("MatMul", ["running", "Wo"], ["ys"], name="every")],
        [vi("seq", F32, ["T", D])], [vi("y", F32, [1, 4]), vi("ys", F32, ["T", 4])],
        [tensor("W", weights((D, D), seed=5, scale=1 / np.sqrt(D))), tensor("s0", np.zeros(D, np.float32)),
         tensor("Wo", weights((D, 4), seed=7, scale=1 / np.sqrt(D))), tensor("ax0", np.array([0], np.int64))],
    )


def _decisions(result):
    return {d.node: d for d in result.decisions}


def test_a_scan_state_added_into_itself_is_fp32_and_its_matmul_stays_fp16():
    d = _decisions(convert(_scan_model(), probe=False))
    assert (d["body_add"].precision, d["body_add"].rule) == ("fp32", "policy.high.loop-accumulator")
    assert "running sum over the Scan's iterations" in d["body_add"].reason
    assert d["body_mm"].precision == "fp16"
    assert d["scan"].rule == "policy.high.loop-accumulator"  # the carried state itself


def test_a_state_through_an_activation_is_no_accumulator():
    """s' = tanh(s + x @ W) is bounded (an RNN cell): nothing is pinned for it."""
    d = _decisions(convert(_scan_model("tanh"), probe=False))
    assert d["body_add"].rule != "policy.high.loop-accumulator"
    assert all(x.rule != "policy.high.loop-accumulator" for x in d.values())


def test_a_loop_residual_state_is_an_accumulator():
    """A Loop body h' = h + tanh(h @ W): the Add reads the state directly (the Tanh is off the state's path)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["hm"], name="loop_mm"), helper.make_node("Tanh", ["hm"], ["ht"]),
         helper.make_node("Add", ["h", "ht"], ["h2"], name="loop_add"), helper.make_node("Identity", ["c"], ["c2"])],
        "lb", [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []), vi("h", F32, [D])],
        [vi("c2", TensorProto.BOOL, []), vi("h2", F32, [D])])
    m = model([helper.make_node("Loop", ["trip", "cond", "x"], ["hf"], name="loop", body=body)],
              [vi("x", F32, [D])], [vi("hf", F32, [D])],
              [tensor("W", weights((D, D), seed=6)), tensor("trip", np.array(8, np.int64)),
               tensor("cond", np.array(True))])
    d = _decisions(convert(m, probe=False))
    assert (d["loop_add"].precision, d["loop_add"].rule) == ("fp32", "policy.high.loop-accumulator")
    assert d["loop_mm"].precision == "fp16"


def test_a_long_running_sum_errs_less_with_the_state_fp32(monkeypatch):
    """T=20000 steps under exact FP16 emulation: the FP32 state's error is far below the FP16 state's
    (measured: 0.013% against 15.6% of range on the sweep's 64-wide model)."""
    from amp_compiler.passes.analysis import accumulators

    m = _scan_model()
    rng = np.random.default_rng(5)
    feeds = {"seq": (rng.standard_normal((20000, D)) + 0.3).astype(np.float32)}
    ref = run_onnxruntime(m, feeds)[1]

    def error(converted) -> float:
        got = run_onnxruntime(emulate(converted.model), feeds)[1]  # every step's state, projected
        return float(np.abs(got - ref).max() / (ref.max() - ref.min()))

    kept = error(convert(m, probe=False))
    monkeypatch.setattr(accumulators, "loop_accumulators", lambda graph: {})
    fp16_state = error(convert(m, probe=False))
    assert kept < fp16_state / 10, (kept, fp16_state)
