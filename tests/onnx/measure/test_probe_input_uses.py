"""Generated inputs follow what the graph does with them (sweep S, D1/D3): a float added to a softmax's logits is an
additive mask (0 / finfo.min, causal, left-padded), a bool mask holds both values, a float an op needing positive
values reads is drawn positive; and the conversion measured on them keeps what real inputs need."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert, emulate
from amp_compiler.onnx.measure import range_probe
from amp_compiler.runtime.input_kinds import POSITIVE, InputKind, input_kinds
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.runtime.samples import random_samples
from amp_compiler.runtime.value_patterns import additive_mask, log_spaced, padded_tail
from tests.support.onnx_builders import F32, model, tensor, vi, weights

FMIN = float(np.finfo(np.float32).min)
BOOL = TensorProto.BOOL


def _run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _attention(mask: str = "attention_mask", mask_nodes=(), name: str = "attention_mask", seq: int = 4):
    """Two attentions over x [1, seq, 8] whose first adds ``mask`` (made from the input ``name`` by
    ``mask_nodes``) to its scores before the Softmax: a fully masked query row of the first spreads through the
    second's P @ V (sweep S's mask_min)."""
    nodes = [*mask_nodes,
             helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "xt"], ["s"]),
             helper.make_node("Add", ["s", mask], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["h"]),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h", "ht"], ["s2"]),
             helper.make_node("Softmax", ["s2"], ["p2"], axis=-1),
             helper.make_node("MatMul", ["p2", "h"], ["y"])]
    return model(nodes, [vi("x", F32, [1, seq, 8]), vi(name, F32, [1, seq, seq])], [vi("y", F32, [1, seq, 8])],
                 [tensor("w", weights((8, 8), scale=0.33)), tensor("one", np.array(1.0, np.float32)),
                  tensor("big", np.array(-10000.0, np.float32))])


def _causal_left_padded(seq: int, pad: int, fill: float) -> np.ndarray:
    mask = np.triu(np.full((seq, seq), fill, np.float32), 1)
    mask[:, :pad] = fill
    return mask[None]


def test_an_additive_float_mask_is_drawn_causal_and_left_padded_at_finfo_min():
    """Before, a float input named like a mask was 'mask of ones' whatever the graph did with it."""
    m = _attention()
    kind = input_kinds(m)["attention_mask"]
    assert (kind.kind, kind.bounds) == ("additive", (FMIN, 0.0)) and "additive mask" in kind.why
    mask = random_samples(m, informed=True)[0]["attention_mask"][0]
    assert set(np.unique(mask)) == {FMIN, 0.0}
    assert (mask == FMIN).all(axis=-1).any() and not (mask == FMIN).all(axis=-1).all()  # a fully masked query row
    assert (np.triu(mask, 1) == FMIN)[np.triu_indices(4, 1)].all()  # causal


def test_an_additive_mask_through_reshapes_and_a_constant_scale_is_found_by_structure_not_name():
    nodes = [helper.make_node("Cast", ["onnx__Add_1"], ["c"], to=F32),
             helper.make_node("Mul", ["c", "one"], ["scaled"]),
             helper.make_node("Identity", ["scaled"], ["m"])]
    m = _attention("m", nodes, name="onnx__Add_1")
    assert input_kinds(m)["onnx__Add_1"].kind == "additive"


def test_a_position_bias_added_to_logits_and_a_multiplicative_mask_stay_as_they_were():
    """A learned/position bias is no mask (N(0, 1) as before), nor are two inputs added into a Softmax (no op computes
    scores); ``(1 - m) * -10000`` takes a 0/1 mask (ones)."""
    assert "position_bias" not in input_kinds(_attention("position_bias", name="position_bias"))
    summed = model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)],
                   [vi("a", F32, [2, 4]), vi("b", F32, [2, 4])], [vi("y", F32, [2, 4])])
    assert input_kinds(summed) == {}
    nodes = [helper.make_node("Sub", ["one", "attention_mask"], ["inv"]),
             helper.make_node("Mul", ["inv", "big"], ["m"])]
    assert input_kinds(_attention("m", nodes)) == {"attention_mask": InputKind("value", (1.0, 1.0), "mask of ones")}


def test_a_converted_model_keeps_a_left_padded_causal_finfo_min_mask_finite_and_states_its_error():
    """Probed as ones, the mask was cast to FP16 (-3.4e38 -> -inf) and the fully masked pad rows came out NaN,
    all 32 output values (sweep S: stated 0.13%); now the probe feeds such rows, and under exact emulation real
    masks give no NaN and the error stated is the one real masks see."""
    m = _attention()
    result = convert(m, runner=InProcessRunner())
    em = emulate(result.model)
    rng = np.random.default_rng(1)
    for pad in (1, 2):
        feeds = {"x": rng.standard_normal((1, 4, 8)).astype(np.float32),
                 "attention_mask": _causal_left_padded(4, pad, FMIN)}
        (ref,), (got,) = _run(m, feeds), _run(em, feeds)
        assert np.isfinite(ref).all() and np.isfinite(got).all()
        error = np.abs(got - ref).max() / (ref.max() - ref.min())
        assert error < 0.01 and error < 10 * max(a.error_of_range for a in result.accuracy)
    assert "attention_mask: additive mask" in result.probe_inputs


def test_a_four_dimensional_additive_mask_of_one_head_is_a_mask_not_an_image():
    """HF's extended mask ``[batch, 1, queries, keys]`` has the layout of a 1-channel image: it was drawn as an image
    in 0..1, its Add went FP16, and real masks' padding rows came out NaN (sweep X D6: 192/512 values, stated
    0.23%)."""
    seq = 8
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "xt"], ["s"]),
             helper.make_node("Add", ["s", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"])]
    m = model(nodes, [vi("x", F32, [1, 1, seq, 8]), vi("mask", F32, [1, 1, seq, seq])], [vi("y", F32, [1, 1, seq, 8])],
              [tensor("w", weights((8, 8), scale=0.33))])
    assert input_kinds(m)["mask"].kind == "additive"
    result = convert(m, runner=InProcessRunner())
    keep = np.arange(seq) < 5  # padding queries see no key
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 1, seq, 8)).astype(np.float32),
             "mask": np.where(keep[:, None] & keep[None, :], 0.0, FMIN).astype(np.float32)[None, None]}
    (ref,), (got,) = _run(m, feeds), _run(emulate(result.model), feeds)
    assert np.isfinite(ref).all() and np.isfinite(got).all()
    assert np.abs(got - ref).max() / (ref.max() - ref.min()) < 0.01


def _sigma_model():
    """log(sigma) added to x -> MatMul with activations ~1e5 -> Relu -> MatMul (sweep S's sigma_min)."""
    nodes = [helper.make_node("Log", ["sigma"], ["c"]), helper.make_node("Add", ["x", "c"], ["xc"]),
             helper.make_node("MatMul", ["xc", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    rng = np.random.default_rng(0)
    return model(nodes, [vi("x", F32, [1, 16]), vi("sigma", F32, [1, 1])], [vi("y", F32, [1, 4])],
                 [tensor("w1", (rng.standard_normal((16, 16)) * 5e3).astype(np.float32)),
                  tensor("w2", (rng.standard_normal((16, 4)) / 2e4).astype(np.float32))])


@pytest.mark.parametrize("op, extra", [("Log", ()), ("Sqrt", ()), ("Reciprocal", ()), ("Pow", ("half",))])
def test_a_float_read_by_an_op_needing_positive_values_is_drawn_positive_over_decades(op, extra):
    nodes = [helper.make_node("Unsqueeze", ["v", "axes"], ["u"]), helper.make_node("Mul", ["u", "two"], ["s"]),
             helper.make_node(op, ["s", *extra], ["y"])]
    m = model(nodes, [vi("v", F32, [64])], [vi("y", F32, [1, 64])],
              [tensor("axes", np.array([0], np.int64)), tensor("two", np.array(2.0, np.float32)),
               tensor("half", np.array(0.5, np.float32))])
    kind = input_kinds(m)["v"]
    assert (kind.kind, kind.bounds) == ("positive", POSITIVE) and op in kind.why
    v = random_samples(m, informed=True)[0]["v"]
    assert v.min() == pytest.approx(POSITIVE[0]) and v.max() == pytest.approx(POSITIVE[1])


def test_a_square_or_an_integer_power_takes_any_sign():
    nodes = [helper.make_node("Pow", ["v", "two"], ["sq"]), helper.make_node("Add", ["sq", "two"], ["s"]),
             helper.make_node("Sqrt", ["s"], ["y"])]
    m = model(nodes, [vi("v", F32, [8])], [vi("y", F32, [8])], [tensor("two", np.array(2.0, np.float32))])
    assert "v" not in input_kinds(m)


def test_a_sigma_under_log_is_probed_finite_and_its_stated_error_is_measured():
    """Before: sigma N(0, 1), FP32 outputs 100% NaN, stated 0.00%, real sigmas 90.6% error with 4/4 outputs Inf."""
    m = _sigma_model()
    result = convert(m, runner=InProcessRunner())
    em = emulate(result.model)
    rng = np.random.default_rng(1)
    for s in (0.002, 1.0, 80.0):
        feeds = {"x": rng.standard_normal((1, 16)).astype(np.float32), "sigma": np.array([[s]], np.float32)}
        (ref,), (got,) = _run(m, feeds), _run(em, feeds)
        assert np.isfinite(got).all() and np.abs(got - ref).max() / (ref.max() - ref.min()) < 0.01
    assert "sigma: positive 0.002..80" in result.probe_inputs and "NaN" not in result.probe_inputs


def _key_padding(negated: bool = False):
    """MultiheadAttention's key padding: Where(mask, -inf, 0) (True = padding, PyTorch's convention; ``negated``:
    True takes part) -> Add to the scores of x [2, 6, 8] -> Softmax -> @ x."""
    cond = "kpm"
    nodes = []
    if negated:
        nodes.append(helper.make_node("Not", ["kpm"], ["off"]))
        cond = "off"
    nodes += [helper.make_node("Where", [cond, "ninf", "zero"], ["b"]),
              helper.make_node("Unsqueeze", ["b", "axes"], ["b3"]),
              helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["x", "xt"], ["s"]), helper.make_node("Add", ["s", "b3"], ["sm"]),
              helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "x"], ["y"])]
    return model(nodes, [vi("x", F32, [2, 6, 8]), vi("kpm", BOOL, [2, 6])], [vi("y", F32, [2, 6, 8])],
                 [tensor("ninf", np.array(-np.inf, np.float32)), tensor("zero", np.array(0.0, np.float32)),
                  tensor("axes", np.array([1], np.int64))])


@pytest.mark.parametrize("negated", [False, True], ids=["true-is-padding", "true-takes-part"])
def test_a_bool_mask_holds_both_values_so_either_convention_keeps_keys_in_every_row(negated):
    """Before: all True, every key masked, FP32 outputs 100% NaN and the probe blind (stated 0.00%)."""
    m = _key_padding(negated)
    kind = input_kinds(m)["kpm"]
    assert kind.kind == "padded" and "padded tail" in kind.why
    found = range_probe.probe_samples(m, InProcessRunner())
    mask = found.samples[0]["kpm"]
    assert mask.any(axis=-1).all() and not mask.all(axis=-1).any()
    assert all(np.isfinite(o).all() for o in found.outputs[0]) and "NaN" not in found.inputs


def test_a_bool_mask_whose_draw_leaves_outputs_mostly_nan_is_negated_once():
    """sqrt(mask - 0.5): NaN where False, 3/4 of the padded tail's draw; negated, 1/4."""
    nodes = [helper.make_node("Cast", ["attn_mask"], ["f"], to=F32), helper.make_node("Sub", ["f", "half"], ["d"]),
             helper.make_node("Sqrt", ["d"], ["y"])]
    m = model(nodes, [vi("attn_mask", BOOL, [1, 8])], [vi("y", F32, [1, 8])],
              [tensor("half", np.array(0.5, np.float32))])
    found = range_probe.probe_samples(m, InProcessRunner())
    assert found.samples[0]["attn_mask"].tolist() == [[True] * 6 + [False] * 2]
    assert found.runs == 2 and "attn_mask: " in found.inputs and "negated" in found.inputs


def test_value_patterns():
    mask = additive_mask((2, 1, 4, 4), -1.0, np.dtype(np.float32))
    assert (mask[0, 0] == np.triu(np.full((4, 4), -1.0), 1)).all()  # causal only
    assert (mask[1, 0, :, 0] == -1).all() and (mask[1, 0, 0] == -1).all()  # left-padded: row 0 fully masked
    assert (additive_mask((2, 6), -1.0, np.dtype(np.float32)) == [[0] * 6, [-1] + [0] * 5]).all()  # key padding
    assert padded_tail((2, 8)).tolist() == [[False] * 6 + [True] * 2] * 2
    values = log_spaced((0.002, 80.0), (5,), np.random.default_rng(0))
    assert sorted(values.tolist()) == pytest.approx([0.002, 0.002 * 40000 ** 0.25, 0.4, 80 / 40000 ** 0.25, 80.0])
    assert log_spaced((0.002, 80.0), (1, 1), np.random.default_rng(0)).tolist() == [[80.0]]


def _embedding(table: np.ndarray) -> object:
    """ids [batch, sequence] -> Gather on ``table`` -> y."""
    return model([helper.make_node("Gather", ["table", "ids"], ["y"])], [vi("ids", TensorProto.INT64, ["b", "s"])],
                 [vi("y", F32, ["b", "s", table.shape[1]])], [tensor("table", table.astype(np.float32))])


def test_generated_token_ids_hold_the_first_ids_and_the_rows_of_largest_norm():
    """Massive activations sit on a few tokens (a start, a delimiter): 128 random ids of 2048 missed a token
    whose FFN overflowed FP16 (every logit NaN, 0.05% stated). Every row of generated ids holds the vocabulary's
    first ids and its table's rows of largest norm, at its end; the rest is drawn."""
    table = np.random.default_rng(0).standard_normal((2048, 16))
    table[[871, 1500]] *= 5.0  # rows training made stand out
    (sample,) = random_samples(_embedding(table), {"ids": (3, 128)}, informed=True)
    ids = sample["ids"]
    assert ids.shape == (3, 128) and ids.min() >= 0 and ids.max() < 2048
    notable = list(range(8)) + [871, 1500]
    for row in ids:
        assert list(row[-16:-8]) == list(range(8)) and set(notable) <= set(row[-16:].tolist())
    assert len(set(ids[:, :-16].ravel().tolist())) > 200  # the rest as drawn


def test_a_short_sequence_holds_as_many_notable_ids_as_half_of_it():
    table = np.random.default_rng(0).standard_normal((100, 4))
    (sample,) = random_samples(_embedding(table), {"ids": (1, 6)}, informed=True)
    assert list(sample["ids"][0, 3:]) == [0, 1, 2]


def test_a_token_that_overflows_alone_is_seen_by_the_probe():
    """The catalog's token-trigger-overflow: its trigger's FFN unit reaches 1e6; text holding it was all NaN."""
    from models.tail_patterns import _text_with_trigger, build_token_trigger_overflow

    m = build_token_trigger_overflow()
    result = convert(m, runner=InProcessRunner())
    feeds = _text_with_trigger(np.random.default_rng(5))
    (ref,), (got,) = _run(m, feeds), _run(emulate(result.model), feeds)
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() / np.ptp(ref) < 0.01
    low = {d.node for d in result.decisions if d.op_type == "MatMul" and d.precision == "fp16"}
    assert low == {"ffn_in", "ffn_out", "lm_head"}


@pytest.mark.parametrize("stored", ["raw float32", "raw float16", "float_data"])
def test_row_norms_read_every_storage_of_a_table(stored):
    from onnx import numpy_helper

    from amp_compiler.runtime.input_uses import _row_norms

    values = np.random.default_rng(1).standard_normal((5000, 6)).astype(np.float32)  # more rows than a block
    if stored == "raw float16":
        values = values.astype(np.float16)
        table = numpy_helper.from_array(values, "t")
    elif stored == "float_data":
        table = helper.make_tensor("t", TensorProto.FLOAT, values.shape, values.ravel().tolist())
    else:
        table = numpy_helper.from_array(values, "t")
    assert table.HasField("raw_data") == (stored != "float_data")
    np.testing.assert_allclose(_row_norms(table), (values.astype(np.float64) ** 2).sum(axis=1), rtol=1e-12)
