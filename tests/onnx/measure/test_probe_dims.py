"""The range probe runs a model at the sizes real inputs have: token sequences at the position table's
length, an empty KV cache, waveforms of a second or a chunk, a recurrent state's batch at 1."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler.errors import RunBudgetError
from amp_compiler.onnx.measure import range_probe
from amp_compiler.onnx.measure.generated_inputs import batch_dims, dynamic_dims
from amp_compiler.onnx.measure.probe_dims import (
    DEFAULT_SEQUENCE,
    MAX_SEQUENCE,
    WAVEFORM_SAMPLES,
    head_sizes,
    position_table_size,
    probe_dims,
    probe_shapes,
)
from amp_compiler.runtime.input_kinds import InputKind, input_kinds, waveform_inputs
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.runtime.samples import random_samples
from models import catalog
from tests.support.onnx_builders import F32, model, tensor, vi, weights

I64 = TensorProto.INT64


def _embedding(positions: int | None, vocab: int = 50) -> object:
    """ids [batch, sequence] -> token table (+ a position table indexed by Range(0, sequence)) ->
    attention scores x x^T -> Softmax: a transformer's embedding and one attention, weights only."""
    nodes = [helper.make_node("Gather", ["tokens", "ids"], ["emb"], name="embed")]
    inits = [tensor("tokens", weights((vocab, 8)))]
    x = "emb"
    if positions is not None:
        nodes += [
            helper.make_node("Shape", ["ids"], ["shape"], name="shape", start=1, end=2),
            helper.make_node("Squeeze", ["shape"], ["length"], name="length"),
            helper.make_node("Range", ["zero", "length", "one"], ["arange"], name="arange"),
            helper.make_node("Unsqueeze", ["arange", "axis0"], ["pos_ids"], name="unsq"),
            helper.make_node("Gather", ["positions", "pos_ids"], ["pos"], name="embed_pos"),
            helper.make_node("Add", ["emb", "pos"], ["x"], name="add_pos"),
        ]
        inits += [tensor("positions", weights((positions, 8), seed=1)), tensor("zero", np.array(0, np.int64)),
                  tensor("one", np.array(1, np.int64)), tensor("axis0", np.array([0], np.int64))]
        x = "x"
    nodes += [helper.make_node("Transpose", [x], ["xt"], name="t", perm=[0, 2, 1]),
              helper.make_node("MatMul", [x, "xt"], ["scores"], name="scores"),
              helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["probs", x], ["y"], name="attend")]
    return model(nodes, [vi("ids", I64, ["batch", "sequence"])], [vi("y", F32, ["batch", "sequence", 8])], inits)


@pytest.mark.parametrize("positions, expected", [(32, 32), (4096, MAX_SEQUENCE), (None, DEFAULT_SEQUENCE)])
def test_a_token_sequence_takes_the_position_tables_length_else_a_default(positions, expected):
    m = _embedding(positions)
    assert position_table_size(m) == (positions or 0)
    assert probe_dims(m)[0] == {"batch": 1, "sequence": expected}
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["ids"].shape == (1, expected) and probe.dims == {"batch": 1, "sequence": expected}
    # attention over the sequence: no probability is 1 any more (at one token every one is; the table's rows of
    # largest norm, among the probe's ids, draw the most: 0.75 at 32 tokens)
    assert probe.ranges["probs"].max < 0.9 and probe.ranges["probs"].count == expected * expected


def _offset_positions(rows: int, counted: bool, vocab: int = 50) -> object:
    """ids [batch, sequence] -> a token table plus a position table of ``rows`` rows indexed from 2 on:
    positions ``Range(0, sequence) + 2`` (BART's learned positions), or with ``counted`` a running count
    over the mask of non-padding ids, times that mask, + 1 (RoBERTa's, from padding index 1)."""
    nodes = [helper.make_node("Gather", ["tokens", "ids"], ["emb"], name="embed")]
    if counted:
        nodes += [
            helper.make_node("Equal", ["ids", "one"], ["is_pad"], name="is_pad"),
            helper.make_node("Not", ["is_pad"], ["real"], name="real"),
            helper.make_node("Cast", ["real"], ["mask"], name="mask", to=I64),
            helper.make_node("CumSum", ["mask", "one"], ["count"], name="count"),
            helper.make_node("Mul", ["count", "mask"], ["counted"], name="masked"),
            helper.make_node("Add", ["counted", "one_scalar"], ["pos_ids"], name="from_padding"),
        ]
    else:
        nodes += [
            helper.make_node("Shape", ["ids"], ["shape"], name="shape", start=1, end=2),
            helper.make_node("Squeeze", ["shape"], ["length"], name="length"),
            helper.make_node("Range", ["zero", "length", "one_scalar"], ["arange"], name="arange"),
            helper.make_node("Add", ["arange", "two"], ["pos_ids"], name="offset"),
        ]
    nodes += [helper.make_node("Gather", ["positions", "pos_ids"], ["pos"], name="embed_pos"),
              helper.make_node("Add", ["emb", "pos"], ["y"], name="add_pos")]
    inits = [tensor("tokens", weights((vocab, 8))), tensor("positions", weights((rows, 8), seed=1)),
             tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
             tensor("one_scalar", np.array(1, np.int64)), tensor("two", np.array(2, np.int64))]
    return model(nodes, [vi("ids", I64, ["batch", "sequence"])], [vi("y", F32, ["batch", "sequence", 8])], inits)


@pytest.mark.parametrize("counted", [False, True], ids=["bart-arange-plus-2", "roberta-count-over-mask"])
def test_a_position_table_indexed_from_an_offset_takes_its_rows_less_the_offset(counted):
    """Before: the table's 130 rows were taken for the length; onnxruntime refused 130 tokens (index
    131 beyond the table) and the probe ran one token."""
    m = _offset_positions(130, counted)
    assert position_table_size(m) == 128
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["ids"].shape == (1, 128) and probe.dims["sequence"] == 128


def test_a_position_table_indexed_by_a_constant_nodes_count_takes_its_rows():
    """TorchScript's export (BERT, CLIP's text tower): the position ids buffer [1, rows] is a Constant
    node, sliced to the sequence. Before, only an initializer's count was read: a 512-row table was
    probed at the default 128 tokens, and CLIP's 77-row one at 128 (refused), then 64."""
    positions = np.arange(77, dtype=np.int64)[None]
    nodes = [
        helper.make_node("Gather", ["tokens", "ids"], ["emb"], name="embed"),
        helper.make_node("Constant", [], ["buffer"], name="position_ids", value=tensor("buffer", positions)),
        helper.make_node("Shape", ["ids"], ["length"], name="shape", start=1, end=2),
        helper.make_node("Slice", ["buffer", "zero", "length", "one"], ["pos_ids"], name="slice"),
        helper.make_node("Gather", ["positions", "pos_ids"], ["pos"], name="embed_pos"),
        helper.make_node("Add", ["emb", "pos"], ["y"], name="add_pos"),
    ]
    inits = [tensor("tokens", weights((50, 8))), tensor("positions", weights((77, 8), seed=1)),
             tensor("zero", np.array([0], np.int64)), tensor("one", np.array([1], np.int64))]
    m = model(nodes, [vi("ids", I64, ["batch", "sequence"])], [vi("y", F32, ["batch", "sequence", 8])], inits)
    assert position_table_size(m) == 77
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["ids"].shape == (1, 77) and probe.dims["sequence"] == 77


def test_a_refused_sequence_falls_back_to_a_half_before_one_token():
    """A table of 100 rows indexed through an op the table search does not follow (a Neg twice): the
    default 128 tokens are refused, 64 run; before, the generic search ran one token."""
    m = _embedding(None)
    m.graph.node.insert(0, helper.make_node("Shape", ["ids"], ["shape"], name="shape", start=1, end=2))
    m.graph.node.insert(1, helper.make_node("Squeeze", ["shape"], ["length"], name="length"))
    m.graph.node.insert(2, helper.make_node("Range", ["zero", "length", "one"], ["arange"], name="arange"))
    m.graph.node.insert(3, helper.make_node("Neg", ["arange"], ["negated"], name="neg"))
    m.graph.node.insert(4, helper.make_node("Neg", ["negated"], ["pos_ids"], name="neg_again"))
    m.graph.node.insert(5, helper.make_node("Gather", ["positions", "pos_ids"], ["pos"], name="embed_pos"))
    m.graph.node.append(helper.make_node("ReduceSum", ["pos"], ["pos_sum"], name="pos_sum", keepdims=0))
    m.graph.output.append(vi("pos_sum", F32, []))
    m.graph.initializer.extend([tensor("positions", weights((100, 8), seed=1)), tensor("zero", np.array(0, np.int64)),
                                tensor("one", np.array(1, np.int64))])
    assert position_table_size(m) == 0
    assert [d["sequence"] for d in probe_dims(m)] == [DEFAULT_SEQUENCE, DEFAULT_SEQUENCE // 2, DEFAULT_SEQUENCE // 4]
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["ids"].shape == (1, DEFAULT_SEQUENCE // 2) and probe.dims["sequence"] == 64
    assert "sizes 128 did not run" in probe.inputs


def _clip_like(positions: int = 77):
    """CLIP's two towers, weights only: pixel_values [image_batch_size, 3, height, width] -> patch Conv
    -> mean over patches; input_ids [text_batch_size, sequence_length] -> token table + a position table
    indexed by its position_ids buffer sliced to the sequence (HF CLIP's text embeddings), one attention,
    mean over tokens; the two embeddings' products (logits_per_image)."""
    nodes = [
        helper.make_node("Conv", ["pixel_values", "patch"], ["patches"], name="patch_embed", strides=[16, 16]),
        helper.make_node("ReduceMean", ["patches", "hw"], ["image_embeds"], name="image_pool", keepdims=0),
        helper.make_node("Gather", ["tokens", "input_ids"], ["emb"], name="embed"),
        helper.make_node("Shape", ["input_ids"], ["length"], name="shape", start=1, end=2),
        helper.make_node("Slice", ["position_ids", "zero", "length", "one"], ["pos_ids"], name="positions"),
        helper.make_node("Gather", ["position_table", "pos_ids"], ["pos"], name="embed_pos"),
        helper.make_node("Add", ["emb", "pos"], ["x"], name="add_pos"),
        helper.make_node("Transpose", ["x"], ["xt"], name="t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xt"], ["scores"], name="scores"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "x"], ["attended"], name="attend"),
        helper.make_node("ReduceMean", ["attended", "seq_axis"], ["text_embeds"], name="text_pool", keepdims=0),
        helper.make_node("Transpose", ["text_embeds"], ["text_t"], name="text_t", perm=[1, 0]),
        helper.make_node("MatMul", ["image_embeds", "text_t"], ["logits_per_image"], name="logits"),
    ]
    inits = [
        tensor("patch", weights((8, 3, 16, 16), seed=2, scale=0.05)), tensor("hw", np.array([2, 3], np.int64)),
        tensor("tokens", weights((50, 8))), tensor("position_table", weights((positions, 8), seed=1)),
        tensor("position_ids", np.arange(positions, dtype=np.int64)[None]), tensor("zero", np.array([0], np.int64)),
        tensor("one", np.array([1], np.int64)), tensor("seq_axis", np.array([1], np.int64)),
    ]
    return model(
        nodes,
        [vi("input_ids", I64, ["text_batch_size", "sequence_length"]),
         vi("pixel_values", F32, ["image_batch_size", 3, "height", "width"])],
        [vi("logits_per_image", F32, ["image_batch_size", "text_batch_size"])], inits,
    )


def test_a_model_with_an_image_and_token_ids_gets_both_sizings():
    """Before: the image took 224x224 and the generic search gave the sequence 1 (one token: every
    attention probability 1)."""
    m = _clip_like(77)
    assert position_table_size(m) == 77
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["pixel_values"].shape == (1, 3, 224, 224)
    assert probe.samples[0]["input_ids"].shape == (1, 77) and probe.dims["sequence_length"] == 77
    observed = len(range_probe.IMAGE_SAMPLES)  # noise and dead leaves; the other normalizations are measured only
    assert probe.ranges["probs"].max < 0.5 and probe.ranges["probs"].count == observed * 77 * 77
    assert "pixel_values: 1x3x224x224" in probe.inputs and "sequence_length=77" in probe.inputs


def _decoder_with_cache():
    """ids [batch, sequence], mask [batch, total_sequence], past [batch, 2, past_sequence, 8]: the new
    keys appended to the past ones (Concat), masked by the mask's length, as a KV-cache decoder."""
    nodes = [
        helper.make_node("Gather", ["tokens", "ids"], ["emb"], name="embed"),
        helper.make_node("Reshape", ["emb", "kshape"], ["k"], name="heads"),
        helper.make_node("Concat", ["past", "k"], ["present"], name="append", axis=2),
        helper.make_node("Cast", ["mask"], ["maskf"], name="cast", to=F32),
        helper.make_node("ReduceSum", ["present", "axes"], ["keys"], name="keys", keepdims=0),
        helper.make_node("Mul", ["keys", "maskf"], ["y"], name="masked"),
    ]
    inits = [tensor("tokens", weights((50, 16))), tensor("kshape", np.array([1, 2, -1, 8], np.int64)),
             tensor("axes", np.array([1, 3], np.int64))]
    return model(
        nodes,
        [vi("ids", I64, ["batch", "sequence"]), vi("mask", I64, ["batch", "total_sequence"]),
         vi("past", F32, ["batch", 2, "past_sequence", 8]), vi("position_ids", I64, ["batch", "sequence"])],
        [vi("y", F32, ["batch", "total_sequence"])], inits,
    )


def test_a_kv_cache_is_probed_empty_at_the_prompts_length_with_positions_counting():
    m = _decoder_with_cache()
    dims, *shorter = probe_dims(m)
    length = DEFAULT_SEQUENCE
    assert dims == {"batch": 1, "sequence": length, "total_sequence": length, "past_sequence": 0}
    # refused, the prompt is shorter, the cache still empty
    assert shorter == [{**dims, "sequence": n, "total_sequence": n} for n in (length // 2, length // 4)]
    shapes = probe_shapes(m, dims)
    assert shapes == {"ids": (1, length), "mask": (1, length), "past": (1, 2, 0, 8), "position_ids": (1, length)}
    assert input_kinds(m)["position_ids"].kind == "positions"
    sample = random_samples(m, shapes, informed=True)[0]
    assert (sample["position_ids"] == np.arange(length)).all() and (sample["mask"] == 1).all()
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["past"].shape == (1, 2, 0, 8) and probe.ranges["y"].count == length


def _voice_detector():
    """input [?, ?] (a waveform), state [2, ?, 128] (an LSTM's), sr (a sample rate): refuses a
    waveform that is not one 512-sample chunk, as Silero VAD's graph does (through If branches)."""
    nodes = [
        helper.make_node("Shape", ["input"], ["n"], name="shape", start=1, end=2),
        helper.make_node("Equal", ["n", "chunk"], ["ok"], name="is_chunk"),
        helper.make_node("Squeeze", ["ok"], ["ok0"], name="squeeze"),
        helper.make_node("If", ["ok0"], ["framed"], name="check",
                         then_branch=helper.make_graph(
                             [helper.make_node("Reshape", ["input", "frames"], ["f"], name="frame")], "then", [],
                             [vi("f", F32, [1, 4, 128])]),
                         else_branch=helper.make_graph(
                             [helper.make_node("Reshape", ["input", "bad"], ["g"], name="refuse")], "else", [],
                             [vi("g", F32, [1, 4, 128])])),
        helper.make_node("ReduceMean", ["state", "axes0"], ["s"], name="state_mean", keepdims=0),
        helper.make_node("MatMul", ["framed", "w"], ["h"], name="proj"),
        helper.make_node("Add", ["h", "s"], ["y"], name="out"),
    ]
    inits = [tensor("chunk", np.array([512], np.int64)), tensor("frames", np.array([1, 4, 128], np.int64)),
             tensor("bad", np.array([7, 7, -1], np.int64)), tensor("axes0", np.array([0], np.int64)),
             tensor("w", weights((128, 128)))]
    return model(
        nodes, [vi("input", F32, [None, None]), vi("state", F32, [2, None, 128]), vi("sr", I64, [])],
        [vi("y", F32, [1, 4, 128])], inits,
    )


def test_a_recurrent_states_dim_1_is_a_batch():
    m = _voice_detector()
    assert batch_dims(m, dynamic_dims(m)) == {"input[0]", "state[1]"}


def test_a_streaming_waveform_is_probed_at_a_second_then_at_a_chunk():
    m = _voice_detector()
    assert input_kinds(m)["input"].bounds == (-1.0, 1.0)
    assert [d["input[1]"] for d in probe_dims(m)] == list(WAVEFORM_SAMPLES)
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["input"].shape == (1, 512) and probe.samples[0]["state"].shape == (2, 1, 128)
    assert probe.runs == 3  # the second refused, the chunk run, the observed run
    assert probe.dims == {"input[0]": 1, "input[1]": 512, "state[1]": 1}


def test_silero_vad_is_probed():
    """Before: every dynamic dim at 1, 2, 4, 8 refused by its STFT's reflect Pad (inside an If, where
    onnx's inference sees no constraint), and its LSTM state's batch grown with the waveform."""
    probe = range_probe.probe_ranges(catalog.load("silero-vad"), InProcessRunner())
    assert probe.samples[0]["input"].shape == (1, 512) and probe.samples[0]["state"].shape == (2, 1, 128)
    assert np.abs(probe.samples[0]["input"]).max() <= 1.0


@pytest.mark.parametrize("name, length, causal", [
    ("bert-base-small", 64, False), ("gpt2-small", 64, True),
    ("llama-massive-activations-small", DEFAULT_SEQUENCE, True), ("t5-small-encoder-small", DEFAULT_SEQUENCE, False),
    ("llama-torch-kv-small", DEFAULT_SEQUENCE, True),
    # the cos cache's 128 rows; kv_cache_dim (a named dim) the head size its QKV projection gives: 16
    ("llama-genai-fp32-small", 128, True), ("llama-genai-int4-small", 128, True),
])
def test_the_catalogs_transformers_are_probed_at_a_real_length(name, length, causal):
    m = catalog.load(name)
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["input_ids"].shape == (1, length)
    if "genai" in name:
        assert head_sizes(m) and set(head_sizes(m).values()) == {16} and probe.dims["kv_cache_dim"] == 16
    if not causal:  # a causal softmax's first row is one token wide: 1 at any length
        softmax = [n.output[0] for n in m.graph.node if n.op_type == "Softmax"]
        assert softmax and all(probe.ranges[out].max < 1 for out in softmax)


@pytest.mark.parametrize("fits, expected", [(32, 32), (1, 1)])
def test_a_sequence_over_the_memory_budget_falls_back_to_shorter_ones_then_the_smallest(monkeypatch, fits, expected):
    m = _embedding(128)
    real = range_probe.runnable_inputs

    def over_budget(model, runner, fixed=None, **kwargs):
        if fixed and fixed.get("ids", (1, 1))[1] > fits:
            raise RunBudgetError("running the model needed more than its memory budget", option="run_memory")
        return real(model, runner, fixed, **kwargs)

    monkeypatch.setattr(range_probe, "runnable_inputs", over_budget)
    probe = range_probe.probe_ranges(m, InProcessRunner())
    refused = 2 if fits == 32 else 3  # 128 and 64; else 32 too
    assert probe.samples[0]["ids"].shape == (1, expected) and probe.runs == refused + 2  # the kept, the observed


def test_a_sequence_over_the_time_budget_stops_the_probe(monkeypatch):
    """The child that ran over its time budget is stopped: the probe is skipped, one warning line."""
    def over_time(model, runner, fixed=None, **kwargs):
        raise RunBudgetError("running the model took longer than its time budget of 60 s", option="run_seconds")

    monkeypatch.setattr(range_probe, "runnable_inputs", over_time)
    with pytest.raises(range_probe.ProbeSkipped, match="run budget"):
        range_probe.probe_ranges(_embedding(32), InProcessRunner())


def test_a_float_input_whose_last_dim_is_named_samples_is_a_waveform():
    """openWakeWord's melspectrogram takes ``input [batch_size, samples]``: before, no waveform was seen
    (its name says nothing), and the generic search ran it at 512 samples of N(0, 1)."""
    frames = [helper.make_node("Unsqueeze", ["input", "axis1"], ["x3"], name="channels"),
              helper.make_node("Conv", ["x3", "w"], ["spec"], name="stft", strides=[160]),
              helper.make_node("ReduceMean", ["spec", "axis1"], ["y"], name="mean", keepdims=0)]
    m = model(frames, [vi("input", F32, ["batch_size", "samples"])], [vi("y", F32, ["batch_size", None])],
              [tensor("axis1", np.array([1], np.int64)), tensor("w", weights((8, 1, 400), scale=0.05))])
    assert waveform_inputs(m) == {"input"} and input_kinds(m)["input"].bounds == (-1.0, 1.0)
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["input"].shape == (1, WAVEFORM_SAMPLES[0]) and "input: waveform -1..1" in probe.inputs


@pytest.mark.parametrize("channels", [1, "channels"])
def test_a_mono_waveform_with_a_channel_dim_is_a_waveform(channels):
    """EnCodec takes ``input_values [batch, 1, samples]``: before, only ranks 1 and 2 were waveforms, the
    generic search ran it at one sample and a reflect Pad refused every size ("converted without the
    range probe")."""
    frames = [helper.make_node("Pad", ["input_values", "pads"], ["padded"], name="pad", mode="reflect"),
              helper.make_node("Conv", ["padded", "w"], ["spec"], name="stft", strides=[160]),
              helper.make_node("ReduceMean", ["spec", "axis1"], ["y"], name="mean", keepdims=0)]
    inits = [tensor("pads", np.array([0, 0, 200, 0, 0, 200], np.int64)), tensor("axis1", np.array([1], np.int64)),
             tensor("w", weights((8, 1, 400), scale=0.05))]
    m = model(frames, [vi("input_values", F32, ["batch", channels, "samples"])], [vi("y", F32, ["batch", None])],
              inits)
    assert waveform_inputs(m) == {"input_values"}
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["input_values"].shape == (1, 1, WAVEFORM_SAMPLES[0])
    assert "input_values: waveform -1..1" in probe.inputs


@pytest.mark.parametrize("name", ["frames", "num_frames", "T", "time"])
def test_a_time_axis_is_probed_as_a_sequence_not_one_step(name):
    """A vocoder's mel ``[batch, 80, frames]`` and a Scan's ``[T, batch, features]`` ran at one step: the
    name said nothing the probe read. They take the default sequence length."""
    nodes = [helper.make_node("Conv", ["mel", "w"], ["y"], name="conv", pads=[1, 1])]
    m = model(nodes, [vi("mel", F32, ["batch", 80, name])], [vi("y", F32, ["batch", 16, name])],
              [tensor("w", weights((16, 80, 3), scale=0.05))])
    assert probe_dims(m)[0] == {"batch": 1, name: DEFAULT_SEQUENCE}


def test_a_float_mask_is_ones():
    """A time-series model's float ``past_observed_mask`` took N(0, 1): values observed at random, and negative."""
    nodes = [helper.make_node("Mul", ["values", "past_observed_mask"], ["y"], name="masked")]
    m = model(nodes, [vi("values", F32, ["batch", 24]), vi("past_observed_mask", F32, ["batch", 24])],
              [vi("y", F32, ["batch", 24])])
    assert input_kinds(m)["past_observed_mask"] == InputKind("value", (1.0, 1.0), "mask of ones")
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert (probe.samples[0]["past_observed_mask"] == 1).all() and "past_observed_mask: mask of ones" in probe.inputs


def test_a_short_name_is_a_batch_only_as_the_first_dim():
    """einops-style ``[b, n]`` token ids: ``n`` is the sequence, where it was taken for a batch and probed at 1
    (a text model's pooling ran over one token; sweep R)."""
    ids = vi("input_ids", I64, ["b", "n"])
    m = model([helper.make_node("Cast", ["input_ids"], ["y"], to=F32)], [ids], [vi("y", F32, ["b", "n"])], [])
    assert batch_dims(m, dynamic_dims(m)) == {"b"}
    assert probe_dims(m)[0]["n"] > 1
    leading = model([helper.make_node("Cast", ["x"], ["y"], to=F32)], [vi("x", I64, ["n", 8])],
                    [vi("y", F32, ["n", 8])], [])
    assert batch_dims(leading, dynamic_dims(leading)) == {"n"}  # the first dim alone: a batch as before


@pytest.mark.parametrize("samples", ["samples", "sequence_length", "time"])
def test_a_waveforms_samples_are_sized_as_audio_whatever_their_dim_is_named(samples):
    """Optimum names wav2vec2's ``input_values`` dims ``[batch_size, sequence_length]``: the name-based sequence
    rule sized them at 128/64/32 samples, which a conv front end with a 400-sample kernel refuses, and the
    conversion ran without the probe (sweep R)."""
    conv = tensor("w", weights((8, 1, 400)))
    nodes = [helper.make_node("Unsqueeze", ["input_values", "ax"], ["x"]),
             helper.make_node("Conv", ["x", "w"], ["y"], strides=[320])]
    m = model(nodes, [vi("input_values", F32, ["batch_size", samples])], [vi("y", F32, ["batch_size", 8, None])],
              [conv, tensor("ax", np.array([1], np.int64))])
    assert probe_dims(m)[0] == {"batch_size": 1, samples: WAVEFORM_SAMPLES[0]}
