"""The range probe and compare on inputs and values that are not float tensors: sequences and optionals
(no crash, and where inputs can be generated, the probe runs), FP16 graph inputs, a generation's length
limit (sweeps of graph structures nobody had converted: If/Loop/Scan, sequences, onnxruntime's
GreedySearch/BeamSearch)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.runtime.input_kinds import GENERATED_TOKENS, input_kinds
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.runtime.samples import random_samples
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _reading(first: onnx.NodeProto, value: onnx.ValueInfoProto) -> onnx.ModelProto:
    """``first`` makes x [2, 8] of the graph input ``value`` (a sequence or an optional), then x @ w."""
    return model([first, helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [value], [vi("y", F32, [2, 8])],
                 [tensor("w", weights((8, 8))), tensor("i", np.array(0, np.int64))])


_ELEMENT = helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 8])
NOT_TENSORS = {
    "optional": _reading(helper.make_node("OptionalGetElement", ["o"], ["x"], name="get"),
                         helper.make_value_info("o", helper.make_optional_type_proto(_ELEMENT))),
    "sequence": _reading(helper.make_node("SequenceAt", ["o", "i"], ["x"], name="at"),
                         helper.make_value_info("o", helper.make_sequence_type_proto(_ELEMENT))),
}


@pytest.mark.parametrize("kind", NOT_TENSORS)
def test_an_input_that_is_no_tensor_skips_the_probe_with_a_line_and_compare_says_give_data(kind, tmp_path, capsys):
    """Before: an internal error (the probe read the input's tensor element type: 0)."""
    source, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(NOT_TENSORS[kind], source)
    assert main(["convert", str(source), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert (f"warning: converted without the range probe: input 'o' is of {kind} type, and generated inputs are "
            "tensors: give the inputs as data") in err
    assert "internal error" not in err
    assert main(["compare", str(source), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"input 'o' is of {kind} type" in err


def test_a_sequence_inside_the_graph_keeps_the_probe():
    """Before: the probe's model declared the sequence a float tensor (its op's schema) and onnxruntime
    refused to load it: no ranges, no stated error."""
    m = model([helper.make_node("SplitToSequence", ["x"], ["s"], name="split", axis=0),
               helper.make_node("SequenceAt", ["s", "i"], ["x0"], name="at"),
               helper.make_node("MatMul", ["x0", "w"], ["y"], name="mm")],
              [vi("x", F32, [2, 8])], [vi("y", F32, [1, 8])],
              [tensor("w", weights((8, 8))), tensor("i", np.array(0, np.int64))])
    result = convert(m, runner=InProcessRunner())
    assert result.probe_skipped == "" and result.accuracy and result.accuracy_not_measured == ""


def test_an_fp16_graph_input_is_measured():
    """Before: the emulated written model (FP32 inputs) was fed the FP16 sample and refused it, and the
    warning blamed the written model."""
    m = model([helper.make_node("Cast", ["x"], ["x32"], name="widen", to=F32),
               helper.make_node("MatMul", ["x32", "w"], ["y"], name="mm")],
              [vi("x", TensorProto.FLOAT16, [2, 8])], [vi("y", F32, [2, 8])], [tensor("w", weights((8, 8)))])
    result = convert(m, runner=InProcessRunner())
    assert result.accuracy_not_measured == "" and result.accuracy and result.accuracy[0].error_of_range < 0.01


def test_a_generations_length_limit_runs_past_the_prompt_and_penalties_are_neutral():
    """onnxruntime's GreedySearch/BeamSearch take max_length (ones made it 1, below any prompt: every run
    refused) and penalties (N(0, 1): negative ones)."""
    m = model([helper.make_node("Identity", ["input_ids"], ["ids"], name="ids")],
              [vi("input_ids", TensorProto.INT32, ["batch", "sequence"]), vi("max_length", TensorProto.INT32, [1]),
               vi("repetition_penalty", F32, [1]), vi("temperature", F32, [])],
              [vi("ids", TensorProto.INT32, ["batch", "sequence"])])
    kinds = input_kinds(m)
    assert kinds["max_length"].kind == "beyond" and kinds["repetition_penalty"].bounds == (1.0, 1.0)
    (sample,) = random_samples(m, {"input_ids": (1, 24)}, informed=True)
    assert sample["max_length"].tolist() == [24 + GENERATED_TOKENS] and sample["max_length"].dtype == np.int32
    assert sample["repetition_penalty"].tolist() == [1.0] and float(sample["temperature"]) == 1.0


def test_token_ids_of_a_fused_embedding_or_a_dequantized_table_are_ids():
    """onnxruntime's optimizer fuses BERT's embeddings into EmbedLayerNormalization (tables: its inputs 2
    and 4), and static quantization dequantizes the table before its Gather: both inputs were generated
    as ones (one embedding row for every token)."""
    ids, segments = vi("input_ids", TensorProto.INT32, [1, 16]), vi("segment_ids", TensorProto.INT32, [1, 16])
    fused = model(
        [helper.make_node("EmbedLayerNormalization",
                          ["input_ids", "segment_ids", "words", "positions", "segments", "gamma", "beta"],
                          ["y", "mask_index"], name="embed", domain="com.microsoft")],
        [ids, segments], [vi("y", F32, [1, 16, 8])],
        [tensor("words", weights((50, 8))), tensor("positions", weights((16, 8))), tensor("segments", weights((2, 8))),
         tensor("gamma", np.ones(8, np.float32)), tensor("beta", np.zeros(8, np.float32))],
        extra_opsets=[helper.make_opsetid("com.microsoft", 1)],
    )
    kinds = input_kinds(fused)
    assert kinds["input_ids"].bounds == (0.0, 50.0) and kinds["segment_ids"].bounds == (0.0, 2.0)
    quantized = model(
        [helper.make_node("DequantizeLinear", ["words_q", "scale"], ["words"], name="dq"),
         helper.make_node("Gather", ["words", "input_ids"], ["y"], name="embed")],
        [ids], [vi("y", F32, [1, 16, 8])],
        [tensor("words_q", np.ones((30, 8), np.int8)), tensor("scale", np.array(0.1, np.float32))],
    )
    assert input_kinds(quantized)["input_ids"].bounds == (0.0, 30.0)


def test_an_input_already_fp16_is_measured_against_its_own_exact_emulation():
    """Its conversion changes nothing: before, the stated error was onnxruntime's CPU run of the FP16
    input against exact emulation of the same model (rel-L2 1.6e-4 to 4.4e-4, never 0)."""
    m = model([helper.make_node("Cast", ["x"], ["x16"], name="narrow", to=TensorProto.FLOAT16),
               helper.make_node("MatMul", ["x16", "w"], ["m"], name="mm"),
               helper.make_node("Tanh", ["m"], ["t"], name="tanh"),
               helper.make_node("MatMul", ["t", "w"], ["m2"], name="mm2"),
               helper.make_node("Cast", ["m2"], ["y"], name="widen", to=F32)],
              [vi("x", F32, ["b", 64])], [vi("y", F32, ["b", 64])],
              [tensor("w", weights((64, 64)).astype(np.float16))])
    result = convert(m, runner=InProcessRunner())
    assert result.accuracy and result.accuracy[0].error_of_range == 0.0 and result.accuracy[0].rel_l2 == 0.0


def test_8_bit_integer_inputs_span_their_type_unless_another_rule_claims_them():
    def inp(name, elem, dims):
        return helper.make_tensor_value_info(name, elem, dims)

    nodes = [helper.make_node("Cast", [n], [f"{n}_f"], to=TensorProto.FLOAT) for n in ("img", "q", "attention_mask", "bytes")]
    nodes.append(helper.make_node("Sum", [f"{n}_f" for n in ("q", "attention_mask", "bytes")], ["s"]))
    m = model(nodes, [inp("img", TensorProto.UINT8, ["N", 3, 8, 8]), inp("q", TensorProto.INT8, ["N", 5]),
                      inp("attention_mask", TensorProto.UINT8, ["N", 5]), inp("bytes", TensorProto.UINT8, ["N", 5])],
              [vi("img_f", F32, ["N", 3, 8, 8]), vi("s", F32, ["N", 5])], opset=17)
    kinds = input_kinds(m)
    assert (kinds["img"].bounds, kinds["img"].why) == ((0.0, 255.0), "image 0..255")
    assert (kinds["q"].bounds, kinds["q"].why) == ((-128.0, 127.0), "int8 values -128..127")
    assert "attention_mask" not in kinds and kinds["bytes"].why == "byte values"
    (sample,) = random_samples(m, {"img": (1, 3, 8, 8), "q": (64, 5), "attention_mask": (1, 5), "bytes": (1, 5)},
                                informed=True)
    assert sample["img"].dtype == np.uint8 and sample["img"].min() < 10 and sample["img"].max() > 245
    assert sample["q"].min() < -100 and sample["q"].max() > 100
    assert (sample["attention_mask"] == 1).all()


def test_a_uint8_image_is_probed_over_its_pixel_range():
    # Cast -> Conv -> Relu -> Conv of all-ones weights: FP32 peaks at 255 * 27 * 144 = 9.9e5 on real 0..255
    # images, beyond FP16's 65504; probed with ones (the old integer default) it peaked at 3888 and went FP16,
    # and every real image gave inf
    nodes = [helper.make_node("Cast", ["img"], ["x"], to=TensorProto.FLOAT),
             helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["y"])]
    m = model(nodes, [helper.make_tensor_value_info("img", TensorProto.UINT8, ["N", 3, 16, 16])],
              [vi("y", F32, ["N", 8, 1, 1])],
              [tensor("w1", np.ones((16, 3, 3, 3), np.float32)), tensor("w2", np.ones((8, 16, 3, 3), np.float32))],
              opset=17)
    result = convert(m, runner=InProcessRunner())
    from amp_compiler.onnx.measure.emulate import emulate

    img = np.random.default_rng(0).integers(0, 256, size=(2, 3, 16, 16), dtype=np.uint8)
    session = InProcessRunner().load(emulate(result.model))
    (got,) = session.run({"img": img})
    assert np.isfinite(got).all()
