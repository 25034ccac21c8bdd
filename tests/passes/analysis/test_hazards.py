"""Patterns onnxruntime crashes on once a Cast sits inside them stay FP32 (``runtime.ort-transpose-matmul``).

onnxruntime 1.32's CPU provider dies with SIGSEGV creating a session of a model where a Cast sits
between a batch-moving Transpose and a MatMul whose other input has another rank (its own inserted
Cast around an FP16 MatMul does it too). Every FP16 conversion of a batch-first RNN exported by
PyTorch had that shape; sessions run in a child process here, so a regression is a failed test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.core.plan import Rule
from amp_compiler.errors import ModelCrashError
from amp_compiler.passes.analysis import RuntimeHazardPass
from amp_compiler.passes.analysis.hazards import moves_batch
from amp_compiler.runtime.budget import RunBudget
from amp_compiler.runtime.runner import ChildRunner
from models import catalog
from tests.support.onnx_builders import F16, F32, model, tensor, vi, weights

RULE = Rule.RUNTIME_TRANSPOSE_MATMUL.value


def test_the_batch_moving_perms_are_the_ones_onnxruntime_crashes_on():
    """Measured with onnxruntime 1.32 over every perm of rank 3 and 4 (findings of issue 15)."""
    moving = {p for rank in (2, 3, 4, 5) for p in itertools.permutations(range(rank)) if moves_batch(list(p))}
    assert {p for p in moving if len(p) <= 4} == {(1, 0, 2), (1, 2, 0), (1, 2, 0, 3), (1, 2, 3, 0)}
    assert moving - {(1, 0, 2), (1, 2, 0), (1, 2, 0, 3), (1, 2, 3, 0)} == {(1, 2, 3, 0, 4), (1, 2, 3, 4, 0)}


def _projection(perm=(1, 0, 2), w_shape=(8, 3), elem=F32, pre=True):
    """x [5, 2, 8] -> MatMul(w0) (``pre``) -> Transpose(perm) -> MatMul(w) -> o, in ``elem``."""
    t_shape = [[5, 2, 8][p] for p in perm]
    o_shape = list(np.broadcast_shapes(tuple(t_shape[:-2]), tuple(w_shape[:-2]))) + [t_shape[-2], w_shape[-1]]
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["s"], name="pre")] if pre else []
    nodes += [helper.make_node("Transpose", ["s" if pre else "x"], ["t"], perm=list(perm), name="transpose"),
              helper.make_node("MatMul", ["t", "w"], ["o"], name="proj")]
    inits = [tensor("w", weights(w_shape).astype(np_type))]
    if pre:
        inits.append(tensor("w0", weights((8, 8), seed=1).astype(np_type)))
    return model(nodes, [vi("x", elem, [5, 2, 8])], [vi("o", elem, o_shape)], inits, opset=17, ir_version=8)


def _loads(m) -> bool:
    with ChildRunner(RunBudget(seconds=60, memory=1 << 30)) as runner:
        try:
            runner.load(m).close()
            return True
        except ModelCrashError:
            return False


def test_the_pattern_in_fp16_crashes_onnxruntime():
    """Why the rule exists: the same graph, FP16, crashes; FP32 loads."""
    assert not _loads(_projection(elem=F16, pre=False))
    assert _loads(_projection(elem=F32, pre=False))


@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_the_transpose_and_the_matmul_stay_fp32_and_the_output_loads(target):
    result = convert(_projection(), target=target, keep_io_types=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["pre"] == (target, "policy.low")
    assert rules["transpose"] == ("fp32", RULE) and rules["proj"] == ("fp32", RULE)
    reason = next(d.reason for d in result.decisions if d.node == "proj")
    assert "matmul_transpose_fusion.cc" in reason and "'transpose'" in reason and "'proj'" in reason
    # The one Cast between low precision and FP32 goes before the Transpose.
    casts = [n for n in result.model.graph.node if n.op_type == "Cast"]
    assert [list(c.input) for c in casts] == [["s"]]
    if target == "fp16":  # onnxruntime's CPU provider has no BF16 MatMul: it loads FP16 models only
        assert _loads(result.model)


@pytest.mark.parametrize("perm, w_shape", [((0, 2, 1), (2, 3)), ((1, 0, 2), (2, 8, 3)), ((1, 0, 2), (1, 8, 3))],
                         ids=["not-batch-moving", "equal-ranks", "equal-ranks-broadcast"])
def test_other_transposes_and_equal_ranks_are_converted(perm, w_shape):
    result = convert(_projection(perm, w_shape), keep_io_types=False)
    assert {d.node: d.precision for d in result.decisions} == {"pre": "fp16", "transpose": "fp16", "proj": "fp16"}
    assert _loads(result.model)


def test_the_batch_first_rnn_of_the_catalog_loads_only_with_the_rule(monkeypatch):
    m = catalog.load("rnn-batch-first")
    result = convert(m)
    decided = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert decided["gru"] == ("fp16", "policy.low")
    assert decided["to_batch_first"] == ("fp32", RULE) and decided["proj"] == ("fp32", RULE)
    assert _loads(result.model)
    monkeypatch.setattr(RuntimeHazardPass, "call", lambda self, graph, plan: None)
    monkeypatch.setattr(RuntimeHazardPass, "ensures", lambda self, graph, plan, before: None)
    unguarded = convert(m)
    assert {d.node: d.precision for d in unguarded.decisions}["proj"] == "fp16"
    assert not _loads(unguarded.model)
