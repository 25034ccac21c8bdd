"""Patterns onnxruntime crashes on once a Cast sits inside them get no Cast there (``runtime.ort-transpose-matmul``).

onnxruntime 1.32's CPU provider dies with SIGSEGV creating a session of a model where a Cast sits
between a batch-moving Transpose and a MatMul whose other input has another rank (its own inserted
Cast around an FP16 MatMul does it too). Every FP16 conversion of a batch-first RNN exported by
PyTorch had that shape; sessions run in a child process here, so a regression is a failed test. On
the CPU provider both ops stay FP32; on CUDA and TensorRT the Transpose takes the MatMul's precision.
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


def _projection(perm=(1, 0, 2), w_shape=(16, 3), elem=F32, pre=True):
    """x [5, 2, 16] -> MatMul(w0) (``pre``) -> Transpose(perm) -> MatMul(w) -> o, in ``elem``. K = 16: a shorter
    product of the raw input would stay FP32 for its own reason (``policy.high.raw-small-product``)."""
    t_shape = [[5, 2, 16][p] for p in perm]
    o_shape = list(np.broadcast_shapes(tuple(t_shape[:-2]), tuple(w_shape[:-2]))) + [t_shape[-2], w_shape[-1]]
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["s"], name="pre")] if pre else []
    nodes += [helper.make_node("Transpose", ["s" if pre else "x"], ["t"], perm=list(perm), name="transpose"),
              helper.make_node("MatMul", ["t", "w"], ["o"], name="proj")]
    inits = [tensor("w", weights(w_shape).astype(np_type))]
    if pre:
        inits.append(tensor("w0", weights((16, 16), seed=1).astype(np_type)))
    return model(nodes, [vi("x", elem, [5, 2, 16])], [vi("o", elem, o_shape)], inits, opset=17, ir_version=8)


def test_the_pattern_in_fp16_crashes_onnxruntime():
    """Why the rule exists: the same graph, FP16, crashes; FP32 loads."""
    assert not _loads(_projection(elem=F16, pre=False))
    assert _loads(_projection(elem=F32, pre=False))


SKIP = ("MatmulTransposeFusion",)


def _loads(m, disabled=()) -> bool:
    with ChildRunner(RunBudget(seconds=60, memory=1 << 30)) as runner:
        try:
            runner.load(m, disabled=disabled).close()
            return True
        except ModelCrashError:
            return False


def _between(model) -> list[str]:
    """Casts that sit between a batch-moving Transpose and the MatMul it feeds (what crashes)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out = []
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        for name in node.input:
            cast = producer.get(name)
            source = producer.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
            if source is not None and source.op_type == "Transpose" and moves_batch(list(source.attribute[0].ints)):
                out.append(cast.name)
    return out


def test_on_the_cpu_provider_the_transpose_and_the_matmul_stay_fp32_and_the_output_loads():
    """The CPU provider has no FP16 MatMul kernel and inserts the Cast itself: both stay FP32 (a BF16
    target is refused for the CPU provider: it has no BF16 MatMul and inserts no Cast for it)."""
    target = "fp16"
    result = convert(_projection(), target=target, keep_io_types=False, provider="cpu", probe=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["pre"] == (target, "policy.low")
    assert rules["transpose"] == ("fp32", RULE) and rules["proj"] == ("fp32", RULE)
    reason = next(d.reason for d in result.decisions if d.node == "proj")
    assert "matmul_transpose_fusion.cc" in reason and "'transpose'" in reason and "'proj'" in reason
    assert "the cpu provider inserts that Cast" in reason
    # The one Cast between low precision and FP32 goes before the Transpose.
    casts = [n for n in result.model.graph.node if n.op_type == "Cast"]
    assert [list(c.input) for c in casts] == [["s"]]
    assert result.load_check_skips == ()
    assert _loads(result.model)


@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_on_gpu_providers_the_matmul_stays_low_and_the_transpose_takes_its_precision(provider, target):
    """CUDA has FP16/BF16 MatMul kernels and TensorRT its own engine: only a Cast of ours could sit
    between them, so the Transpose follows the MatMul and both stay low."""
    result = convert(_projection(), target=target, keep_io_types=False, provider=provider, probe=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["pre"] == rules["proj"] == (target, "policy.low")
    assert rules["transpose"] == (target, RULE)
    reason = next(d.reason for d in result.decisions if d.node == "transpose")
    assert f"the {provider} provider inserts none" in reason and "'proj'" in reason
    assert not [n for n in result.model.graph.node if n.op_type == "Cast"] and not _between(result.model)
    # onnxruntime's CPU provider, the load check's stand-in, would insert the Cast and crash: the
    # check turns the fusion off for such an output, and it loads
    assert result.load_check_skips == SKIP
    if target == "fp16":
        bare = convert(_projection(pre=False), keep_io_types=False, provider=provider, probe=False)
        assert bare.load_check_skips == SKIP
        assert not _loads(bare.model) and _loads(bare.model, SKIP)


def test_on_a_gpu_provider_an_fp32_matmul_keeps_the_transpose_fp32():
    """The MatMul pinned FP32 (here by the user): the Transpose is FP32 too, the Cast before it."""
    result = convert(_projection(), keep_io_types=False, block_nodes=["^proj$"], probe=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["proj"] == ("fp32", "user.block-node") and rules["transpose"] == ("fp32", RULE)
    assert [list(c.input) for c in result.model.graph.node if c.op_type == "Cast"] == [["s"]]
    assert result.load_check_skips == () and _loads(result.model)


def test_a_transpose_feeding_a_low_and_an_fp32_matmul_keeps_the_pattern_fp32():
    """Two MatMuls read one batch-moving Transpose, one of them blocked: no single precision lets
    both go without a Cast between, so everything tied stays FP32, as on the CPU provider."""
    m = _projection()
    m.graph.node.append(helper.make_node("MatMul", ["t", "w"], ["o2"], name="proj2"))
    m.graph.output.append(vi("o2", F32, [2, 5, 3]))
    result = convert(m, keep_io_types=False, block_nodes=["^proj2$"], probe=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["proj2"] == ("fp32", "user.block-node")
    assert rules["transpose"] == ("fp32", RULE) and rules["proj"] == ("fp32", RULE)
    assert not _between(result.model) and _loads(result.model)


@pytest.mark.parametrize("perm, w_shape", [((0, 2, 1), (2, 3)), ((1, 0, 2), (2, 16, 3)), ((1, 0, 2), (1, 16, 3))],
                         ids=["not-batch-moving", "equal-ranks", "equal-ranks-broadcast"])
@pytest.mark.parametrize("provider", ["cuda", "cpu"])
def test_other_transposes_and_equal_ranks_are_converted(perm, w_shape, provider):
    result = convert(_projection(perm, w_shape), keep_io_types=False, provider=provider, probe=False)
    assert {d.node: d.precision for d in result.decisions} == {"pre": "fp16", "transpose": "fp16", "proj": "fp16"}
    assert all(d.rule != RULE for d in result.decisions)
    assert _loads(result.model)


def test_the_batch_first_rnn_of_the_catalog_loads_only_with_the_rule(monkeypatch):
    m = catalog.load("rnn-batch-first")
    result = convert(m, provider="cpu", probe=False)
    decided = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert decided["gru"] == ("fp16", "policy.low")
    assert decided["to_batch_first"] == ("fp32", RULE) and decided["proj"] == ("fp32", RULE)
    assert _loads(result.model)
    cuda = {d.node: (d.precision, d.rule) for d in convert(m, probe=False).decisions}
    assert cuda["to_batch_first"] == ("fp16", RULE) and cuda["proj"] == ("fp16", "policy.low")
    monkeypatch.setattr(RuntimeHazardPass, "call", lambda self, graph, plan: None)
    monkeypatch.setattr(RuntimeHazardPass, "ensures", lambda self, graph, plan, before: None)
    unguarded = convert(m, provider="cpu", probe=False)
    assert {d.node: d.precision for d in unguarded.decisions}["proj"] == "fp16"
    assert not _loads(unguarded.model)


@pytest.mark.parametrize("name", ["vit-mha-small"])
def test_attention_in_projections_stay_low_on_cuda_and_the_output_loads_in_the_check(name):
    """torchvision's ViT layout (nn.MultiheadAttention, batch_first): every layer's in-projection
    reads a batch-moving Transpose. On CUDA they stay FP16 (the CPU provider's rule would keep them
    FP32); the load check loads the output without the fusion and says so."""
    m = catalog.load(name)
    result = convert(m, probe=False)
    pattern = [d for d in result.decisions if d.rule == RULE]
    assert pattern and all(d.op_type == "Transpose" and d.precision == "fp16" for d in pattern)
    matmuls = [d for d in result.decisions if d.op_type == "MatMul"]
    assert matmuls and all(d.precision == "fp16" for d in matmuls)
    assert not _between(result.model) and result.load_check_skips == SKIP
    assert _loads(result.model, SKIP)
    cpu = [d for d in convert(m, provider="cpu", probe=False).decisions if d.op_type == "MatMul" and d.rule == RULE]
    assert len(cpu) == len(pattern) and all(d.precision == "fp32" for d in cpu)


@pytest.mark.parametrize("provider, note", [("cuda", True), ("tensorrt", True), ("cpu", False)])
def test_the_command_line_load_checks_without_the_fusion_and_says_so(tmp_path, capsys, provider, note):
    """The default CUDA conversion of a batch-first RNN keeps its projection FP16: the load check,
    on onnxruntime's CPU provider, turns off the optimizer that only that provider's own Cast trips,
    writes the output and says so on the summary line; for the CPU provider nothing is turned off."""
    from amp_compiler.cli import main

    src, out = tmp_path / "rnn.onnx", tmp_path / "out.onnx"
    src.write_bytes(catalog.load("rnn-batch-first").SerializeToString())
    code = main(["convert", str(src), "-o", str(out), "--provider", provider])
    stdout, err = capsys.readouterr()
    assert code == 0 and out.exists(), err
    assert ("load check on onnxruntime's CPU provider without MatmulTransposeFusion" in stdout) == note
    assert "warning" not in err


def test_on_cuda_the_catalog_transformers_keep_every_tensor_core_flop_the_rule_took():
    """benchmarks.hazard_share on the small transformers: the rule as it was (FP32 on every provider)
    against the rule where it happens. torchvision's ViT layout loses its in-projections to FP32
    with the first (70% of its Tensor Core FLOPs FP16 in the small model) and keeps them FP16 now,
    with fewer Casts; every other transformer is unchanged."""
    from benchmarks.hazard_share import measure, transformers

    for entry in transformers("small"):
        shapes = {k: tuple(v.shape) for k, v in entry.make_inputs(np.random.default_rng(0)).items()}
        before = measure(catalog.load(entry), shapes, everywhere=True)
        after = measure(catalog.load(entry), shapes, everywhere=False)
        if entry.name == "vit-mha-small":
            assert before.tc_low < 0.75 and after.tc_low == 1.0 and after.casts < before.casts
        else:
            assert after == before, entry.name
