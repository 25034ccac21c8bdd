"""Conversion options given as people give them: ``keep_io_types`` as a bool or a list of names (the CLI's
``--keep-io-types [NAME ...]`` / ``--no-keep-io-types``), and ``--allow-op``/``--allow-node`` on the
command line (the precedence itself: tests/passes/analysis/test_classify.py).

The list form is what an LLM export wants: FP16 KV-cache inputs and outputs (no Cast per layer per step
on either side), FP32 logits.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import ConvertOptions, convert
from amp_compiler.cli import main
from amp_compiler.errors import OptionError
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.options import resolve_options
from amp_compiler.targets import Provider, Target
from tests.support.onnx_builders import F16, F32, model, tensor, vi, weights


def _decoder_step() -> onnx.ModelProto:
    """One decoding step: the new token's key joins the cache (past_k -> present_k) and a head reads
    the pooled cache (logits)."""
    return model(
        [
            helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
            helper.make_node("Concat", ["past_k", "k"], ["present_k"], axis=1, name="cache"),
            helper.make_node("ReduceMean", ["present_k", "axis"], ["pooled"], keepdims=0, name="pool"),
            helper.make_node("MatMul", ["pooled", "wo"], ["logits"], name="lm_head"),
        ],
        # K = 16: a shorter product of an input (x, the cache) stays FP32 (policy.high.raw-small-product)
        [vi("x", F32, [1, 1, 16]), vi("past_k", F32, [1, "past", 16])],
        [vi("logits", F32, [1, 16]), vi("present_k", F32, [1, "total", 16])],
        [tensor("wk", weights((16, 16), seed=1)), tensor("wo", weights((16, 16), seed=2)),
         tensor("axis", np.array([1], np.int64))],
    )


def _io_types(m: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in (*m.graph.input, *m.graph.output)}


@pytest.mark.parametrize(
    "keep, expected",
    [
        (True, {"x": F32, "past_k": F32, "logits": F32, "present_k": F32}),
        (False, {"x": F16, "past_k": F16, "logits": F16, "present_k": F16}),
        (["logits"], {"x": F16, "past_k": F16, "logits": F32, "present_k": F16}),
        (("logits", "x"), {"x": F32, "past_k": F16, "logits": F32, "present_k": F16}),
    ],
    ids=["all", "none", "logits", "logits-and-x"],
)
def test_keep_io_types_keeps_the_names_it_lists(keep, expected):
    m = _decoder_step()
    result = convert(m, keep_io_types=keep, probe=False)
    assert _io_types(result.model) == expected
    validate(result.model, converted_from=m)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 1, 16)), "past_k": rng.standard_normal((1, 5, 16))}
    ref = run_onnxruntime(m, {k: v.astype(np.float32) for k, v in feeds.items()})
    runnable = emulate(result.model)
    got = run_onnxruntime(runnable, {i.name: feeds[i.name].astype(onnx.helper.tensor_dtype_to_np_dtype(
        i.type.tensor_type.elem_type)) for i in runnable.graph.input})
    for name, r, g in zip(("logits", "present_k"), ref, got, strict=True):
        accuracy = compare(name, r, np.asarray(g, np.float32))
        assert accuracy.finite and accuracy.error_of_range < 5e-3, accuracy


def test_the_list_form_costs_one_cast_at_the_kept_output_only():
    """Only lm_head's result is cast (to FP32 logits); the cache goes in and out in FP16 without any."""
    result = convert(_decoder_step(), keep_io_types=["logits"], probe=False)
    casts = [n for n in result.model.graph.node if n.op_type == "Cast"]
    assert [c.output[0] for c in casts] == ["logits"]
    kept = next(d for d in result.decisions if d.op_type == "Cast")
    assert kept.rule == "lowering.cast"


def test_keep_io_types_given_as_any_iterable_of_names_is_a_tuple():
    assert ConvertOptions(keep_io_types=["logits"]).keep_io_types == ("logits",)
    assert resolve_options(None, {"keep_io_types": {"logits": 1}}).keep_io_types == ("logits",)
    assert ConvertOptions(keep_io_types=False).keep_io_types is False
    assert ConvertOptions().keep_io_types is True
    hash(ConvertOptions(keep_io_types=["a", "b"]))  # options stay hashable


@pytest.mark.parametrize("bad", ["logits", [1, 2]])
def test_keep_io_types_that_are_neither_a_bool_nor_names_are_refused(bad):
    with pytest.raises(OptionError, match="expected True, False or a list of graph input/output names") as caught:
        ConvertOptions(keep_io_types=bad)
    assert caught.value.option == "keep_io_types"


def test_an_unknown_name_is_one_error_naming_the_models_inputs_and_outputs():
    with pytest.raises(OptionError) as caught:
        convert(_decoder_step(), keep_io_types=["logits", "present.0.key"], probe=False)
    assert caught.value.option == "keep_io_types"
    assert str(caught.value) == (
        "present.0.key: not a graph input or output of the model (inputs: x, past_k; outputs: logits, present_k)"
    )


# ---------------------------------------------------------------------------------- the command line


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def step(tmp_path) -> Path:
    path = tmp_path / "step.onnx"
    onnx.save(_decoder_step(), path)
    return path


@pytest.mark.parametrize(
    "flags, logits, cache",
    [
        ([], F32, F32),
        (["--keep-io-types"], F32, F32),
        (["--keep-io-types", "logits"], F32, F16),
        (["--keep-io-types", "logits", "x", "--keep-io-types", "past_k"], F32, F16),
        (["--no-keep-io-types"], F16, F16),
    ],
    ids=["default", "bare", "list", "repeated", "none"],
)
def test_keep_io_types_on_the_command_line(step, tmp_path, flags, logits, cache):
    out = tmp_path / "out.onnx"
    code, _, err = _cli("convert", step, "-o", out, "-q", *flags)
    assert code == 0, err
    types = _io_types(onnx.load(out))
    assert (types["logits"], types["present_k"]) == (logits, cache)
    if "past_k" in flags:
        assert types["past_k"] == F32 and types["x"] == F32


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--keep-io-types", "logit"], "--keep-io-types: logit: not a graph input or output of the model "
                                       "(inputs: x, past_k; outputs: logits, present_k)"),
        (["--keep-io-types", "logits", "--no-keep-io-types"], "not allowed with argument"),
    ],
)
def test_keep_io_types_that_cannot_work_are_one_line(step, tmp_path, flags, needle):
    out = tmp_path / "out.onnx"
    code, stdout, err = _cli("convert", step, "-o", out, *flags)
    lines = err.strip().splitlines()
    assert code == 2 and stdout == "" and len(lines) == 1 and needle in lines[0], err
    assert not out.exists()


def test_allow_op_is_a_warning_in_the_summary(step, tmp_path):
    out = tmp_path / "out.onnx"
    code, stdout, err = _cli("convert", step, "-o", out, "--allow-op", "ReduceMean", "--target", "bf16")
    assert code == 0, err
    assert "| warning: --allow-op/--allow-node forced 1 node(s) into bf16 whatever the policy says ('pool')" in stdout


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--allow-op", "Nope"], "--allow-op: unknown op type(s): Nope"),
        (["--allow-node", "("], "--allow-node: invalid regular expression '('"),
        (["--allow-op", "Exp", "--block-op", "Exp"], "--allow-op: Exp: blocked too"),
    ],
)
def test_allow_options_that_cannot_work_are_one_line(step, tmp_path, flags, needle):
    code, stdout, err = _cli("convert", step, "-o", tmp_path / "out.onnx", *flags)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err


def test_options_built_directly_take_the_plain_types_people_write():
    """``ConvertOptions(target="bf16")`` is what ``convert(..., target="bf16")`` is: strings for
    enums, lists for sets and tuples, dicts for the shape and range pairs."""
    direct = ConvertOptions(
        target="bf16", provider="tensorrt", block_ops=["Softmax"], block_nodes=["attn.*"],
        input_shapes={"x": [1, 3, 8, 8]}, input_ranges={"x": [0, 1]},
    )
    assert direct == resolve_options(None, {
        "target": "bf16", "provider": "tensorrt", "block_ops": ["Softmax"], "block_nodes": ["attn.*"],
        "input_shapes": {"x": [1, 3, 8, 8]}, "input_ranges": {"x": [0, 1]},
    })
    assert direct.target is Target.BF16 and direct.provider is Provider.TENSORRT
    assert direct.block_ops == frozenset({"Softmax"}) and direct.input_shapes == (("x", (1, 3, 8, 8)),)
    assert ConvertOptions(target="fp8", fallback="bf16").low_target is Target.BF16


def test_a_bad_name_in_options_built_directly_is_one_option_error():
    with pytest.raises(OptionError, match="fp17"):
        ConvertOptions(target="fp17")
    with pytest.raises(OptionError, match="rocm"):
        ConvertOptions(provider="rocm")


def test_op_and_node_names_given_as_none_or_one_string():
    """Before, ``block_ops=None`` raised a bare TypeError ("'NoneType' object is not iterable") and
    ``block_ops="Softmax"`` blocked the letters S, o, f, t, m, a, x."""
    assert ConvertOptions(block_ops=None, allow_nodes=None).block_ops == frozenset()
    assert ConvertOptions(block_ops="Softmax").block_ops == frozenset({"Softmax"})
    assert ConvertOptions(block_nodes="attn.*").block_nodes == ("attn.*",)
    with pytest.raises(OptionError, match="expected names") as info:
        ConvertOptions(allow_ops=3)
    assert info.value.option == "allow_ops"
    with pytest.raises(OptionError, match="got 1"):
        ConvertOptions(block_nodes=[1])


def test_bf16_for_the_cpu_provider_is_refused_before_the_model_is_read(tmp_path, capsys):
    """onnxruntime's CPU provider has no bfloat16 MatMul/Conv and inserts no Casts for them: the model
    written before would not load there (NOT_IMPLEMENTED, sweep Y)."""
    fp32 = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", shape=[2, 8])],
                      [vi("y", shape=[2, 8])], [tensor("w", weights((8, 8)))])
    with pytest.raises(OptionError, match="CPU provider has no bfloat16 kernels") as info:
        convert(fp32, target="bf16", provider="cpu")
    assert info.value.option == "target"
    path = tmp_path / "m.onnx"
    onnx.save(fp32, path)
    code = main(["convert", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "bf16", "--provider", "cpu"])
    assert code == 2 and not (tmp_path / "out.onnx").exists()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert convert(fp32, target="bf16", provider="cuda").model is not None


@pytest.mark.parametrize("fallback", ["scaled", "bf16"])
def test_a_range_fallback_given_to_a_bf16_target_is_refused_not_ignored(fallback):
    fp32 = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", shape=[2, 8])], [vi("y", shape=[2, 8])],
                 [tensor("w", weights((8, 8)))])
    with pytest.raises(OptionError, match="is for --target fp16") as info:
        convert(fp32, target="bf16", range_fallback=fallback)
    assert info.value.option == "range_fallback"
    assert convert(fp32, target="bf16", range_fallback="fp32", probe=False).model is not None  # --tolerance's
