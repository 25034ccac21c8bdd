"""Hand-built graphs whose FP16 error sits in a few positions or inputs far beyond the rest (massive activations, ties).

- ``massive-swiglu-tail``: a token-wise stack of four Llama MLP blocks (RMS norm, SwiGLU, residual) over a
  4096-token embedding, each with one massive SwiGLU unit (gate and up rows scaled by ``sqrt(1000 * 15^layer)``,
  written into residual channels 3 and 17 with weight 1, as :func:`models.architectures.grow_residual`),
  the embedding x300 with those channels a further x20 (``benchmarks.fresh_specs.llm_ranges``). For most
  tokens FP16 rounding moves the logits by 0.02% of range; for the few whose massive gate cancels to
  near 0 while its up projection is in the thousands (or the other way round), the rounding of the
  normalized input (2^-11 of ``|x| |w|``, the row's norm in the thousands) is multiplied by the other
  factor and written into the residual stream: those tokens' logits move by up to 10% of range. The range
  probe's 128 random tokens held a mild one: stated 0.40% of range (its worst token 12x the 90th
  percentile's), while 8 held-out draws of 512 tokens are 0.6-9.7% off (exact emulation). Nothing leaves
  FP16's range, and the amplification is the model's: every layer FP32 (FP16 left to the embedding's
  storage and the head) still gives 0.5-4.3%. The conversion says so (``output_error.concentrated``).

- ``token-trigger-overflow``: a token-wise FFN block (squared activation, residual, LayerNorm, head) over a
  2048-token embedding in which one token (id 871: a delimiter's place) carries a channel no other token
  has (10 against 0), which one FFN unit reads with weight 100: on that token the unit's square is 1e6 and
  the residual stream overflows FP16; on every other token it is 0. Massive activations sit on a few
  tokens of a trained LLM (its start, its delimiters). A probe of 128 random ids of 2048 held it with
  chance 6%: the conversion stated 0.05% of range and wrote a model whose every logit is NaN on text that
  holds the token (sweep B1's T5 at </s> and Qwen2 at '\n'). The probe's ids hold the vocabulary's first
  ids and the rows of largest norm of its table (the token's: 10 in its own channel)
  (:data:`amp_compiler.runtime.samples.NOTABLE_LARGEST`): the overflow is seen and kept out of FP16.

- ``tie-softmax-classifier``: an embedding classifier (64 features, a 3-layer MLP whose last hidden layer sits at
  10 +- 1.5, a BatchNorm shift folded into its bias, a LayerNorm as an exporter writes it, a 1000-class Softmax
  over logits of spread 24): FP16 storage of the hidden features (spacing 2^-7 at 10, 0.5% of their spread)
  moves the logits' differences by about 0.04 (0.15 for 1 pair in 100), which moves a confident row's
  probabilities by a fraction of a percent and a tie's by up to tanh(0.15 / 4) = 3.7% of 0..1. The probe's rows
  (one a sample) tied nowhere: stated 0.55% of range, while 4 held-out draws of 64 rows reach 2.1-4.3% and
  inputs of one row bisected to a tie up to 4.4% of their range (5 of 16 past 2%). The conversion reads the
  logits' errors back from the probabilities and warns: a tie moves 3.3% of the range a one-row input has then
  (``output_error.moves_at_ties``).

Same conventions as :mod:`models.handbuilt` (its graph builder, fixed seeds, opsets 17-18).
"""

from __future__ import annotations

import numpy as np
import onnx

from models.entry import CatalogModel, Tolerance
from models.handbuilt import F32, _Graph, _model, _seed, _vi

__all__ = ["ENTRIES"]

ENTRIES: list[CatalogModel] = []

_VOCAB, _WIDTH, _HIDDEN, _LAYERS = 4096, 64, 128, 4
_UNIT, _CHANNELS = 5, [3, 17]
_BASE, _GROWTH = 1000.0, 15.0  # the massive unit of layer l: gate and up rows x sqrt(_BASE * _GROWTH^l)
#: Held-out sequences are 4x the probe's 128 tokens: more tokens, more of the few that amplify rounding.
_HELD_OUT_TOKENS = 512


def _rms_norm(g: _Graph, x: str, name: str) -> str:
    """``x / sqrt(mean(x^2) + eps)``, as torch.onnx writes Llama's RMSNorm (its weight 1)."""
    square = g.node("Mul", [x, x], name=f"{name}_square")
    mean = g.node("ReduceMean", [square, g.const(f"{name}_axis", np.array([-1], np.int64))], name=f"{name}_mean",
                  keepdims=1)
    eps = g.node("Add", [mean, g.const(f"{name}_eps", np.array(1e-6, np.float32))], name=f"{name}_eps")
    return g.node("Div", [x, g.node("Sqrt", [eps], name=f"{name}_sqrt")], name=name)


def build_massive_swiglu_tail() -> onnx.ModelProto:
    """input_ids [batch, sequence] -> embedding -> 4 x (RMS norm -> SwiGLU MLP -> residual) -> RMS norm -> logits."""
    g = _Graph(_seed("massive-swiglu-tail"))
    table = g.rng.standard_normal((_VOCAB, _WIDTH)) * 0.02 * 300.0
    table[:, _CHANNELS] *= 20.0
    x = g.node("Gather", [g.const("embed", table.astype(np.float32)), "input_ids"], name="embed_lookup")
    for layer in range(_LAYERS):
        n = _rms_norm(g, x, f"l{layer}_norm")
        scale = np.sqrt(_BASE * _GROWTH**layer)
        gate, up, down = (g.rng.standard_normal(shape) * 0.02 for shape in
                          ((_WIDTH, _HIDDEN), (_WIDTH, _HIDDEN), (_HIDDEN, _WIDTH)))
        gate[:, _UNIT] *= scale
        up[:, _UNIT] *= scale
        down[_UNIT, :] = 0.0
        down[_UNIT, _CHANNELS] = 1.0
        gated = g.node("MatMul", [n, g.const(f"l{layer}_gate_w", gate.astype(np.float32))], name=f"l{layer}_gate")
        upped = g.node("MatMul", [n, g.const(f"l{layer}_up_w", up.astype(np.float32))], name=f"l{layer}_up")
        silu = g.node("Mul", [gated, g.node("Sigmoid", [gated], name=f"l{layer}_sigmoid")], name=f"l{layer}_silu")
        product = g.node("Mul", [silu, upped], name=f"l{layer}_swiglu")
        written = g.node("MatMul", [product, g.const(f"l{layer}_down_w", down.astype(np.float32))],
                         name=f"l{layer}_down")
        x = g.node("Add", [x, written], name=f"l{layer}_residual")
    head = (g.rng.standard_normal((_WIDTH, _VOCAB)) * 0.02).astype(np.float32)
    g.node("MatMul", [_rms_norm(g, x, "final_norm"), g.const("lm_head", head)], name="lm_head", outputs=["logits"])
    return _model(g, "massive_swiglu_tail", [_vi("input_ids", onnx.TensorProto.INT64, ["batch", "sequence"])],
                  [_vi("logits", F32, ["batch", "sequence", _VOCAB])], 18)


ENTRIES.append(CatalogModel(
    name="massive-swiglu-tail", kind="rule", size="small", build=lambda _cache: build_massive_swiglu_tail(),
    make_inputs=lambda rng: {"input_ids": rng.integers(0, _VOCAB, (1, _HELD_OUT_TOKENS))},
    tolerance=Tolerance(),
    description="A token-wise stack of 4 Llama MLP blocks with one massive SwiGLU unit each (gate and up rows "
                "x sqrt(2000 * 15^layer), written into 2 residual channels): the few tokens whose massive gate "
                "cancels near 0 while its up projection is in the thousands carry FP16 rounding x1000 into the "
                "residual stream (up to 10% of range on them, 0.02% elsewhere); the conversion warns that the "
                "error is concentrated (output_error.concentrated).",
    blind_fails="FP16 rounding amplified by the model on a few tokens: 1.35% of range on 512 held-out tokens "
                "(0.6-9.7% on 8 draws), warned of, nothing to fix in FP16's range",
))


_TRIGGER_VOCAB, _TRIGGER_WIDTH, _TRIGGER_HIDDEN, _TRIGGER = 2048, 32, 64, 871


def build_token_trigger_overflow() -> onnx.ModelProto:
    """input_ids [batch, sequence] -> embedding -> FFN (MatMul, square, MatMul) + residual -> LayerNorm -> logits."""
    g = _Graph(_seed("token-trigger-overflow"))
    table = g.rng.standard_normal((_TRIGGER_VOCAB, _TRIGGER_WIDTH))
    table[:, 7], table[_TRIGGER, 7] = 0.0, 10.0  # channel 7 is the trigger token's alone
    w_in = g.rng.standard_normal((_TRIGGER_WIDTH, _TRIGGER_HIDDEN)) / np.sqrt(_TRIGGER_WIDTH)
    w_in[:, 0], w_in[7, 0] = 0.0, 100.0  # unit 0 reads channel 7: 1000 at the trigger, 0 elsewhere
    w_out = g.rng.standard_normal((_TRIGGER_HIDDEN, _TRIGGER_WIDTH)) / np.sqrt(_TRIGGER_HIDDEN)
    w_out[0, :], w_out[0, 3] = 0.0, 1.0  # and writes its square into residual channel 3
    x = g.node("Gather", [g.const("embed", table.astype(np.float32)), "input_ids"], name="embed_lookup")
    a = g.node("MatMul", [x, g.const("ffn_in_w", w_in.astype(np.float32))], name="ffn_in")
    f = g.node("MatMul", [g.node("Mul", [a, a], name="square"), g.const("ffn_out_w", w_out.astype(np.float32))],
               name="ffn_out")
    r = g.node("Add", [x, f], name="residual")
    n = g.node("LayerNormalization", [r, g.const("ln_g", np.ones(_TRIGGER_WIDTH, np.float32)),
                                      g.const("ln_b", np.zeros(_TRIGGER_WIDTH, np.float32))], name="norm", axis=-1)
    head = (g.rng.standard_normal((_TRIGGER_WIDTH, _TRIGGER_VOCAB)) / np.sqrt(_TRIGGER_WIDTH)).astype(np.float32)
    g.node("MatMul", [n, g.const("lm_head", head)], name="lm_head", outputs=["logits"])
    return _model(g, "token_trigger_overflow", [_vi("input_ids", onnx.TensorProto.INT64, ["batch", "sequence"])],
                  [_vi("logits", F32, ["batch", "sequence", _TRIGGER_VOCAB])], 18)


def _text_with_trigger(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Two rows of 64 ids, the trigger token among them (a delimiter: every 16th position)."""
    ids = rng.integers(0, _TRIGGER_VOCAB, (2, 64))
    ids[:, 15::16] = _TRIGGER
    return {"input_ids": ids}


ENTRIES.append(CatalogModel(
    name="token-trigger-overflow", kind="rule", size="small", build=lambda _cache: build_token_trigger_overflow(),
    make_inputs=_text_with_trigger, tolerance=Tolerance(),
    description="A token-wise FFN block whose squared unit reaches 1e6 on one token only (id 871, a channel of its "
                "own in the embedding): the residual stream overflows FP16 there. The probe's ids hold the rows "
                "of largest norm of the table, the trigger's among them: the overflow is kept out of FP16.",
    blind_fails="every logit NaN on text holding the token, 0.05% of range stated (the probe's 128 random ids of "
                "2048 missed it)",
))


_TIE_FEATURES, _TIE_WIDTH, _TIE_CLASSES = 64, 256, 1000
_TIE_OFFSET, _TIE_LOGIT_SCALE = 10.0, 24.0  # the last hidden layer's shift; the logits' spread


def build_tie_softmax_classifier() -> onnx.ModelProto:
    """features [batch, 64] -> 3 x MatMul + Add (ReLU between) -> LayerNorm (ReduceMean, Sub, Mul, Sqrt, Div)
    -> MatMul -> Softmax over 1000 classes."""
    g = _Graph(_seed("tie-softmax-classifier"))
    x, width = "features", _TIE_FEATURES
    for i in range(3):
        w = g.rng.standard_normal((width, _TIE_WIDTH)) * np.sqrt(2.0 / width)
        b = np.full(_TIE_WIDTH, _TIE_OFFSET if i == 2 else 0.0)
        x = g.node("Add", [g.node("MatMul", [x, g.const(f"fc{i}_w", w.astype(np.float32))], name=f"fc{i}"),
                          g.const(f"fc{i}_b", b.astype(np.float32))], name=f"fc{i}_bias")
        x = g.node("Relu", [x], name=f"fc{i}_relu") if i < 2 else x
        width = _TIE_WIDTH
    axis = g.const("last_axis", np.array([-1], np.int64))
    centred = g.node("Sub", [x, g.node("ReduceMean", [x, axis], name="ln_mean", keepdims=1)], name="ln_sub")
    var = g.node("ReduceMean", [g.node("Mul", [centred, centred], name="ln_square"), axis], name="ln_var", keepdims=1)
    std = g.node("Sqrt", [g.node("Add", [var, g.const("ln_eps", np.array([1e-5], np.float32))], name="ln_eps_add")],
                 name="ln_sqrt")
    normed = g.node("Div", [centred, std], name="ln_div")
    head = g.rng.standard_normal((_TIE_WIDTH, _TIE_CLASSES)) * _TIE_LOGIT_SCALE / np.sqrt(_TIE_WIDTH)
    logits = g.node("MatMul", [normed, g.const("head_w", head.astype(np.float32))], name="head")
    g.node("Softmax", [logits], name="softmax", outputs=["probs"], axis=-1)
    return _model(g, "tie_softmax_classifier", [_vi("features", F32, ["batch", _TIE_FEATURES])],
                  [_vi("probs", F32, ["batch", _TIE_CLASSES])], 18)


ENTRIES.append(CatalogModel(
    name="tie-softmax-classifier", kind="rule", size="small", build=lambda _cache: build_tie_softmax_classifier(),
    make_inputs=lambda rng: {"features": rng.standard_normal((64, _TIE_FEATURES)).astype(np.float32)},
    tolerance=Tolerance(),
    description="An embedding classifier whose last hidden layer sits at 10 (a folded BatchNorm shift) before a "
                "hand-written LayerNorm and a 1000-class Softmax: FP16 storage there moves the logits' differences "
                "by about 0.04 (0.15 for 1 pair in 100), a confident row's probabilities by a fraction of a percent "
                "and a tie's by up to 3.7% of 0..1. The probe's rows tied nowhere (0.55% stated); the conversion "
                "reads the logits' errors back from the probabilities and warns (output_error.moves_at_ties).",
    blind_fails="FP16 rounding at a tie between two classes: 2.1-4.3% of range on 4 held-out draws of 64 rows, up "
                "to 4.4% at inputs bisected to a tie, 0.55% stated on the probe's rows; warned of, nothing overflows",
))
