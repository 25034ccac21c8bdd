"""Hand-built graphs of accuracy failures found on real trained models (issue 12), one per pattern.

Each reproduces the structure that made a trained model lose accuracy in FP16/BF16, with synthetic
but realistic weights and inputs, so the rule that fixes it is tested without the model itself:

- ``cqt-log``: a constant-Q front end (complex filters as convolutions over raw audio, a low-pass
  convolution per octave, magnitude, Log in dB) before a small CNN (a music-transcription model);
- ``gated-softmax-output``: probabilities that are both a graph output and weights of a later layer
  (a wake-word detector's Sigmoid probability of 1e-6 lost 8% of its value among FP16's subnormals;
  onnxruntime's CPU Sigmoid itself is only accurate to 6e-8, so the pattern uses a Softmax);
- ``decomposed-activations``: conv blocks whose BatchNorm and HardSwish an exporter wrote as
  elementwise ops (five roundings after each convolution), where ``--tolerance`` should pin the cheap
  chains, not the convolutions;
- ``stft-power-mel``: an STFT as a convolution over audio at int16 scale, power, a mel MatMul and a
  power-law compression (overflow that depends on the input's scale);
- ``llama-rope-long``: Hugging Face Llama's rotary embedding (``inv_freq`` expanded, a K = 1 MatMul
  with the float-cast position ids, Transpose, Concat, Cos, Sin) in an attention block, run at
  positions up to 32k (a long-context decode window), where an FP16 angle is off by up to 8 rad;
- ``handwritten-layernorm``: a LayerNorm written as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div,
  Mul, Add (BERT/TF code, torch.onnx's TorchScript export of ``nn.LayerNorm`` below opset 17) right
  after a MatMul, which onnxruntime's LayerNormFusion fuses across the conversion's Casts;

Same conventions as :mod:`models.handbuilt` (its graph builder, fixed seeds, opsets 17-21, IR 8-10).
"""

from __future__ import annotations

import numpy as np
import onnx

from models.entry import CatalogModel, Tolerance
from models.handbuilt import F32, _Graph, _model, _seed, _vi

ENTRIES: list[CatalogModel] = []


def _register(name: str, build, make_inputs, description: str, tolerance: Tolerance | None = None,
              calibrate: bool = False) -> None:
    ENTRIES.append(CatalogModel(
        name=name, kind="rule", size="small", build=lambda _cache, _b=build: _b(), make_inputs=make_inputs,
        tolerance=tolerance or Tolerance(), description=description, calibrate=calibrate,
    ))


def _tones(rng: np.random.Generator, n: int, sr: float, levels: tuple[float, ...]) -> np.ndarray:
    """A sum of tones at the given peak levels (random frequencies between 60 Hz and sr/3), plus a
    faint noise floor: a signal whose spectrum spans a wide dynamic range, as music does."""
    t = np.arange(n) / sr
    x = np.zeros(n)
    for level in levels:
        f = 60.0 * 2 ** rng.uniform(0, np.log2(sr / 3 / 60.0))
        x += level * np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi))
    return x + rng.normal(0.0, 1e-5, n)


# --------------------------------------------------------------------------------------------------
# cqt-log
# --------------------------------------------------------------------------------------------------

_CQT_SR, _CQT_N, _CQT_BINS, _CQT_K, _CQT_HOP = 8000.0, 4096, 12, 128, 64


def _cqt_kernels(octave: int) -> np.ndarray:
    """Real and imaginary Hann-windowed complex exponentials, one pair per bin (12 bins per octave,
    the top octave ending at a quarter of the sample rate), as Conv weights (2 * bins, 1, K)."""
    sr = _CQT_SR / 2**octave
    k = np.arange(_CQT_K) - _CQT_K / 2
    window = np.hanning(_CQT_K)
    rows = []
    for b in range(_CQT_BINS):
        f = sr / 4 * 2 ** (-(b + 1) / _CQT_BINS)
        phase = 2 * np.pi * f * k / sr
        rows += [window * np.cos(phase), window * np.sin(phase)]
    w = np.stack(rows) / window.sum()
    return w[:, None, :].astype(np.float32)


def build_cqt_log() -> onnx.ModelProto:
    g = _Graph(_seed("cqt-log"))
    taps = np.sinc(np.arange(-15, 16) / 2) * np.hamming(31) / 2  # half-band low-pass
    lowpass = g.const("lowpass", taps[None, None, :].astype(np.float32))
    octaves, audio = [], "audio"
    for octave in range(2):
        w = g.const(f"cqt_kernels_{octave}", _cqt_kernels(octave))
        hop = _CQT_HOP // 2**octave
        spec = g.node("Conv", [audio, w], name=f"cqt_{octave}", kernel_shape=[_CQT_K], strides=[hop],
                      pads=[_CQT_K // 2, _CQT_K // 2])
        octaves.append(spec)
        if octave == 0:
            audio = g.node("Conv", [audio, lowpass], name="downsample", kernel_shape=[31], strides=[2],
                           pads=[15, 15])
    spec = g.node("Concat", octaves, name="octaves", axis=1)  # (1, 2 * 2 * bins, frames)
    pairs = g.node("Reshape", [spec, g.const("pairs_shape", np.array([1, 2 * _CQT_BINS, 2, -1], np.int64))],
                   name="pairs")
    power = g.node("Mul", [pairs, pairs], name="square")
    power = g.node("ReduceSum", [power, g.const("pair_axis", np.array([2], np.int64))], name="power",
                   keepdims=0)
    power = g.node("Add", [power, g.const("eps", np.array(1e-10, np.float32))], name="add_eps")
    db = g.node("Log", [power], name="log")
    db = g.node("Mul", [db, g.const("to_db", np.array(10 / np.log(10), np.float32))], name="to_db")
    db = g.node("Div", [g.node("Add", [db, g.const("db_offset", np.array(100.0, np.float32))], name="db_offset"),
                        g.const("db_scale", np.array(100.0, np.float32))], name="db_norm")
    h = g.node("Unsqueeze", [db, g.const("channel_axis", np.array([1], np.int64))], name="image")
    h = g.node("Conv", [h, g.weight("W1", [8, 1, 3, 3], 0.5), g.weight("B1", [8], 0.1)], name="conv1",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.node("Relu", [h], name="relu1")
    h = g.node("Conv", [h, g.weight("W2", [1, 8, 3, 3], 0.4), g.const("B2", np.array([-1.0], np.float32))],
               name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g.node("Sigmoid", [h], name="notes", outputs=["notes"])
    frames = _CQT_N // _CQT_HOP + 1
    return _model(g, "cqt_log", [_vi("audio", F32, [1, 1, _CQT_N])],
                  [_vi("notes", F32, [1, 1, 2 * _CQT_BINS, frames])], 18)


def _cqt_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = _tones(rng, _CQT_N, _CQT_SR, (0.4, 0.1, 0.01, 1e-3, 1e-4))
    return {"audio": x[None, None, :].astype(np.float32)}


_register(
    "cqt-log",
    build_cqt_log,
    _cqt_inputs,
    "A constant-Q front end over raw audio (complex filters as Conv, a half-band low-pass Conv to "
    "the next octave, power, Log in dB) before a small CNN and a Sigmoid: FP16 storage of the audio "
    "adds a noise floor 68 dB down that the Log shows at full scale for quiet bins, so the signal "
    "path into the Log stays FP32 (a music-transcription model lost 3.6% of its output range).",
)


# --------------------------------------------------------------------------------------------------
# gated-softmax-output
# --------------------------------------------------------------------------------------------------


def build_gated_softmax_output() -> onnx.ModelProto:
    g = _Graph(_seed("gated-softmax-output"))
    h = g.node("Gemm", ["features", g.weight("W1", [32, 32]), g.weight("B1", [32], 0.1)], name="fc1")
    h = g.node("Relu", [h], name="relu")
    logits = g.node("Gemm", [h, g.weight("W2", [32, 64], 1.2), g.weight("B2", [64], 2.0)], name="fc2")
    g.node("Softmax", [logits], name="softmax", outputs=["probabilities"], axis=-1)
    g.node("MatMul", ["probabilities", g.weight("prototypes", [64, 16])], name="mixture", outputs=["y"])
    return _model(g, "gated_softmax_output", [_vi("features", F32, ["batch", 32])],
                  [_vi("probabilities", F32, ["batch", 64]), _vi("y", F32, ["batch", 16])], 19)


_register(
    "gated-softmax-output",
    build_gated_softmax_output,
    lambda rng: {"features": rng.standard_normal((4, 32)).astype(np.float32)},
    "Gemm -> Softmax whose class probabilities (down to 1e-8) are a graph output and also weight a "
    "later MatMul: computed in FP16 (its CUDA kernel accumulates in FP32, so it follows its "
    "neighbours) they land among FP16's subnormals, spaced 6e-8, before the output reads them; cast "
    "placement computes the output's producer in FP32 when that costs at most one Cast of it more.",
)


# --------------------------------------------------------------------------------------------------
# stft-power-mel
# --------------------------------------------------------------------------------------------------

_STFT_N, _STFT_FFT, _STFT_HOP, _STFT_MELS = 2048, 128, 64, 16


def _mel_filters(bins: int, mels: int) -> np.ndarray:
    """Triangular filters over ``bins`` linear frequency bins, spaced evenly on a mel-like scale."""
    edges = np.round(np.geomspace(1, bins - 1, mels + 2)).astype(int)
    fb = np.zeros((bins, mels), np.float32)
    for m in range(mels):
        a, c, b = edges[m], edges[m + 1], max(edges[m + 2], edges[m + 1] + 1)
        fb[a : c + 1, m] = np.linspace(0, 1, c - a + 1)
        fb[c:b, m] = np.linspace(1, 0, b - c)
    return fb


def build_stft_power_mel() -> onnx.ModelProto:
    g = _Graph(_seed("stft-power-mel"))
    bins = _STFT_FFT // 2
    n = np.arange(_STFT_FFT)
    window = np.hanning(_STFT_FFT)
    rows = [window * f(2 * np.pi * k * n / _STFT_FFT) for f in (np.cos, np.sin) for k in range(bins)]
    stft = g.node("Conv", ["audio", g.const("stft_kernels", np.stack(rows)[:, None, :].astype(np.float32))],
                  name="stft", kernel_shape=[_STFT_FFT], strides=[_STFT_HOP])  # (1, 2 * bins, frames)
    parts = g.node("Reshape", [stft, g.const("parts_shape", np.array([1, 2, bins, -1], np.int64))], name="parts")
    power = g.node("Mul", [parts, parts], name="square")
    power = g.node("ReduceSum", [power, g.const("part_axis", np.array([1], np.int64))], name="power", keepdims=0)
    frames = g.node("Transpose", [power], name="frames", perm=[0, 2, 1])  # (1, frames, bins)
    mel = g.node("MatMul", [frames, g.const("mel_filters", _mel_filters(bins, _STFT_MELS))], name="mel")
    mel = g.node("Sqrt", [mel], name="magnitude")
    peak = g.node("ReduceMax", [mel, g.const("all_axes", np.array([1, 2], np.int64))], name="peak", keepdims=1)
    peak = g.node("Add", [peak, g.const("tiny", np.array(1e-3, np.float32))], name="peak_eps")
    feats = g.node("Div", [mel, peak], name="normalize")
    h = g.node("MatMul", [feats, g.weight("W1", [_STFT_MELS, 32])], name="fc1")
    h = g.node("Relu", [h], name="relu")
    g.node("MatMul", [h, g.weight("W2", [32, 4])], name="fc2", outputs=["scores"])
    frames_n = (_STFT_N - _STFT_FFT) // _STFT_HOP + 1
    return _model(g, "stft_power_mel", [_vi("audio", F32, [1, 1, _STFT_N])],
                  [_vi("scores", F32, [1, frames_n, 4])], 18)


_register(
    "stft-power-mel",
    build_stft_power_mel,
    lambda rng: {"audio": (_tones(rng, _STFT_N, 16000.0, (0.5, 0.2, 0.05)) * 0.6)[None, None, :].astype(np.float32)},
    "An STFT as a Conv over raw audio, power (Mul, ReduceSum), a mel MatMul, a magnitude and a peak "
    "normalization before a small classifier: with audio in [-1, 1] it is fine in FP16, at int16 "
    "scale the STFT overflows (above |audio| = 800) and its power sooner (above 3.2), which a static "
    "range analysis sees coming from the input's stated range.",
)


# --------------------------------------------------------------------------------------------------
# attention-mask-padding
# --------------------------------------------------------------------------------------------------


def build_attention_mask_padding() -> onnx.ModelProto:
    g = _Graph(_seed("attention-mask-padding"))
    d = 16
    q = g.node("MatMul", ["x", g.weight("Wq", [d, d])], name="q_proj")
    k = g.node("MatMul", ["x", g.weight("Wk", [d, d])], name="k_proj")
    v = g.node("MatMul", ["x", g.weight("Wv", [d, d])], name="v_proj")
    s = g.node("MatMul", [q, g.node("Transpose", [k], name="k_transpose", perm=[0, 2, 1])], name="scores")
    s = g.node("Mul", [s, g.const("inv_sqrt_d", np.array(1 / np.sqrt(d), np.float32))], name="scale")
    # (1 - mask) * float32's lowest, as transformers' BERT export writes the extended attention mask
    m = g.node("Cast", ["attention_mask"], name="mask_float", to=F32)
    m = g.node("Unsqueeze", [m, g.const("mask_axes", np.array([1], np.int64))], name="mask_unsqueeze")
    m = g.node("Sub", [g.const("one", np.array(1.0, np.float32)), m], name="mask_invert")
    m = g.node("Mul", [m, g.const("lowest", np.array(np.finfo(np.float32).min, np.float32))], name="mask_scale")
    s = g.node("Add", [s, m], name="add_mask")
    p = g.node("Softmax", [s], name="softmax", axis=-1)
    a = g.node("MatMul", [p, v], name="attn_v")
    g.node("MatMul", [a, g.weight("Wo", [d, d])], name="o_proj", outputs=["y"])
    return _model(g, "attention_mask_padding",
                  [_vi("x", F32, ["batch", "seq", d]), _vi("attention_mask", onnx.TensorProto.INT64, ["batch", "seq"])],
                  [_vi("y", F32, ["batch", "seq", d])], 18)


def _padded_batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0  # the second sequence is padded
    return {"x": rng.standard_normal((2, 8, 16)).astype(np.float32), "attention_mask": mask}


_register(
    "attention-mask-padding",
    build_attention_mask_padding,
    _padded_batch,
    "Self-attention with an extended attention mask from an input, (1 - mask) * float32's lowest, "
    "and a padded batch: calibration sees -3.4e38 on the mask path, which comes from a constant the "
    "mask rule turns into -32768, so it must not count as an overflow.",
)


# --------------------------------------------------------------------------------------------------
# quantized-encoder
# --------------------------------------------------------------------------------------------------


def _float_encoder() -> onnx.ModelProto:
    """Two pre-LN transformer layers (d = 64, 16 tokens) and a 10-way classifier, in FP32."""
    g = _Graph(_seed("quantized-encoder"))
    d, ff = 64, 128

    def norm(x: str, name: str) -> str:
        return g.node("LayerNormalization", [x, g.const(f"{name}_g", g.rng.uniform(0.5, 1.5, d).astype(np.float32)),
                                             g.const(f"{name}_b", (0.1 * g.rng.standard_normal(d)).astype(np.float32))],
                      name=name, axis=-1)

    def dense(x: str, n_in: int, n_out: int, name: str) -> str:
        h = g.node("MatMul", [x, g.weight(f"{name}_w", [n_in, n_out])], name=name)
        return g.node("Add", [h, g.weight(f"{name}_b", [n_out], 0.1)], name=f"{name}_bias")

    h = "x"
    for layer in range(2):
        n = norm(h, f"ln1_{layer}")
        q, k, v = (dense(n, d, d, f"{p}_{layer}") for p in "qkv")
        s = g.node("MatMul", [q, g.node("Transpose", [k], name=f"kt_{layer}", perm=[0, 2, 1])], name=f"scores_{layer}")
        s = g.node("Mul", [s, g.const(f"scale_{layer}", np.array(0.125, np.float32))], name=f"scaled_{layer}")
        p = g.node("Softmax", [s], name=f"attn_{layer}", axis=-1)
        a = g.node("MatMul", [p, v], name=f"attn_v_{layer}")
        h = g.node("Add", [h, dense(a, d, d, f"o_{layer}")], name=f"res1_{layer}")
        f = g.node("Gelu", [dense(norm(h, f"ln2_{layer}"), d, ff, f"fc1_{layer}")], name=f"gelu_{layer}")
        h = g.node("Add", [h, dense(f, ff, d, f"fc2_{layer}")], name=f"res2_{layer}")
    pooled = g.node("ReduceMean", [h, g.const("tokens", np.array([1], np.int64))], name="pool", keepdims=0)
    logits = g.node("MatMul", [pooled, g.weight("cls_w", [d, 10], 0.5)], name="cls")
    g.node("Softmax", [logits], name="probs", outputs=["probs"], axis=-1)
    return _model(g, "float_encoder", [_vi("x", F32, [1, 16, d])], [_vi("probs", F32, [1, 10])], 20)


def build_quantized_encoder() -> onnx.ModelProto:
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        onnx.save(_float_encoder(), src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        model = onnx.load(dst)
    model.producer_name, model.producer_version = "amp-compiler-handbuilt", ""
    onnx.checker.check_model(model, full_check=True)
    return model


_register(
    "quantized-encoder",
    build_quantized_encoder,
    lambda rng: {"x": rng.standard_normal((1, 16, 64)).astype(np.float32)},
    "A two-layer encoder quantized by onnxruntime's quantize_dynamic: DynamicQuantizeLinear, "
    "MatMulInteger, Casts of int32 results and Muls by scales, with float islands between (LayerNorm, "
    "attention's MatMuls, Softmax, Gelu): values quantized again and the quantization scales stay "
    "FP32 (rounding to FP16 just before quantizing moves values across int8 levels).",
)


# --------------------------------------------------------------------------------------------------
# decomposed-activations
# --------------------------------------------------------------------------------------------------


def build_decomposed_activations() -> onnx.ModelProto:
    """Four conv blocks as some exporters write them (PaddlePaddle's paddle2onnx, for PP-OCR): the
    BatchNorm as Mul/Add by per-channel constants and HardSwish as Add(3) -> Clip(0, 6) -> Div(6) ->
    Mul, a residual Add from the second block on; then pooling, a classifier and a Softmax."""
    g = _Graph(_seed("decomposed-activations"))
    channels = 32

    def per_channel(name: str, mean: float, spread: float) -> str:
        return g.const(name, (mean + spread * g.rng.standard_normal((1, channels, 1, 1))).astype(np.float32))

    h = "image"
    for b in range(4):
        c_in = 3 if b == 0 else channels
        y = g.node("Conv", [h, g.weight(f"w{b}", [channels, c_in, 3, 3])], name=f"conv{b}", pads=[1, 1, 1, 1])
        y = g.node("Mul", [y, per_channel(f"bn_scale{b}", 1.0, 0.2)], name=f"bn_mul{b}")
        y = g.node("Add", [y, per_channel(f"bn_shift{b}", 0.0, 0.2)], name=f"bn_add{b}")
        gate = g.node("Add", [y, g.const(f"three{b}", np.array(3.0, np.float32))], name=f"hs_add{b}")
        gate = g.node("Clip", [gate, g.const(f"zero{b}", np.array(0.0, np.float32)),
                               g.const(f"six{b}", np.array(6.0, np.float32))], name=f"hs_clip{b}")
        gate = g.node("Div", [gate, g.const(f"six_div{b}", np.array(6.0, np.float32))], name=f"hs_div{b}")
        y = g.node("Mul", [y, gate], name=f"hs_mul{b}")
        h = y if b == 0 else g.node("Add", [h, y], name=f"residual{b}")
    pooled = g.node("GlobalAveragePool", [h], name="pool")
    flat = g.node("Flatten", [pooled], name="flatten", axis=1)
    logits = g.node("Gemm", [flat, g.weight("fc_w", [channels, 100], 0.5), g.weight("fc_b", [100], 0.1)], name="fc")
    g.node("Softmax", [logits], name="softmax", outputs=["probs"], axis=-1)
    return _model(g, "decomposed_activations", [_vi("image", F32, ["batch", 3, 32, 32])],
                  [_vi("probs", F32, ["batch", 100])], 17)


_register(
    "decomposed-activations",
    build_decomposed_activations,
    lambda rng: {"image": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)},
    "Conv blocks whose BatchNorm (Mul, Add) and HardSwish (Add, Clip, Div, Mul) an exporter wrote as "
    "elementwise ops: five FP16 roundings after each convolution's one, where most of the output error "
    "comes from; --tolerance keeps the convolutions FP16 and those cheap chains FP32 (PP-OCRv4's "
    "recogniser: 100% of its convolution FLOPs kept FP16 at half of plain FP16's error).",
)


# --------------------------------------------------------------------------------------------------
# llama-rope-long
# --------------------------------------------------------------------------------------------------

_ROPE_D, _ROPE_SEQ = 64, 16


def build_llama_rope_long() -> onnx.ModelProto:
    """One attention block with rotary q and k, the angles as transformers' LlamaRotaryEmbedding
    computes them and torch.onnx.export (dynamo=False) writes them: ``inv_freq[None, :, None]``
    expanded to the batch, MatMul with ``position_ids[:, None, :].float()``, transposed, concatenated
    with itself; then Cos and Sin, and rotate_half by Split/Neg/Concat."""
    g = _Graph(_seed("llama-rope-long"))
    d, half = _ROPE_D, _ROPE_D // 2
    inv_freq = (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32)[None, :, None]
    batch = g.node("Shape", ["position_ids"], name="batch_dim", end=1)
    shape = g.node("Concat", [batch, g.const("ones_2", np.array([1, 1], np.int64))], name="expand_shape", axis=0)
    freqs = g.node("Expand", [g.const("inv_freq", inv_freq), shape], name="inv_freq_expand")
    pos = g.node("Cast", ["position_ids"], name="position_float", to=F32)
    pos = g.node("Unsqueeze", [pos, g.const("axis_1", np.array([1], np.int64))], name="position_unsqueeze")
    angles = g.node("MatMul", [freqs, pos], name="rope_angles")  # (batch, d/2, seq), K = 1
    angles = g.node("Transpose", [angles], name="rope_transpose", perm=[0, 2, 1])
    emb = g.node("Concat", [angles, angles], name="rope_emb", axis=-1)
    cos, sin = g.node("Cos", [emb], name="rope_cos"), g.node("Sin", [emb], name="rope_sin")
    halves = g.const("halves", np.array([half, half], np.int64))

    def rotary(t: str, name: str, output: str | None = None) -> str:
        a, b = g.node("Split", [t, halves], n_out=2, name=f"{name}_split", axis=-1)
        rotated = g.node("Concat", [g.node("Neg", [b], name=f"{name}_neg"), a], name=f"{name}_rotate_half", axis=-1)
        return g.node("Add", [g.node("Mul", [t, cos], name=f"{name}_cos"), g.node("Mul", [rotated, sin], name=f"{name}_sin")],
                      name=f"{name}_rotary", outputs=[output] if output else None)

    q = rotary(g.node("MatMul", ["x", g.weight("Wq", [d, d])], name="q_proj"), "q", "q_rot")
    k = rotary(g.node("MatMul", ["x", g.weight("Wk", [d, d])], name="k_proj"), "k")
    v = g.node("MatMul", ["x", g.weight("Wv", [d, d])], name="v_proj")
    s = g.node("MatMul", [q, g.node("Transpose", [k], name="k_transpose", perm=[0, 2, 1])], name="scores")
    s = g.node("Mul", [s, g.const("inv_sqrt_d", np.array(1 / np.sqrt(d), np.float32))], name="scale")
    p = g.node("Softmax", [s], name="softmax", axis=-1)
    g.node("MatMul", [g.node("MatMul", [p, v], name="attn_v"), g.weight("Wo", [d, d])], name="o_proj", outputs=["y"])
    return _model(g, "llama_rope_long",
                  [_vi("x", F32, ["batch", "seq", d]), _vi("position_ids", onnx.TensorProto.INT64, ["batch", "seq"])],
                  [_vi("y", F32, ["batch", "seq", d]), _vi("q_rot", F32, ["batch", "seq", d])], 17)


def _long_positions(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A decode window of 16 tokens at a position up to 32k (a long context), two sequences."""
    start = rng.integers(2000, 32768 - _ROPE_SEQ, size=(2, 1))
    return {"x": rng.standard_normal((2, _ROPE_SEQ, _ROPE_D)).astype(np.float32),
            "position_ids": (start + np.arange(_ROPE_SEQ)).astype(np.int64)}


_register(
    "llama-rope-long",
    build_llama_rope_long,
    _long_positions,
    "Llama's rotary embedding (inv_freq expanded, a K = 1 angle MatMul with the float-cast position ids, "
    "Cos, Sin) in an attention block at positions 2000-32768: an FP16 angle is off by up to 8 rad there "
    "(output 13-49% of range), so the angle's path stays FP32 (policy.high.phase-argument); the range "
    "probe feeds positions 0..127 and sees nothing.",
)


# --------------------------------------------------------------------------------------------------
# handwritten-layernorm
# --------------------------------------------------------------------------------------------------


def build_handwritten_layernorm() -> onnx.ModelProto:
    g = _Graph(_seed("handwritten-layernorm"))
    h = g.node("MatMul", ["x", g.weight("W1", [64, 128])], name="proj_in")
    axes = g.const("axes", np.array([-1], np.int64))
    u = g.node("ReduceMean", [h, axes], name="ln_mean")
    d = g.node("Sub", [h, u], name="ln_sub")
    var = g.node("ReduceMean", [g.node("Pow", [d, g.const("two", np.array(2.0, np.float32))], name="ln_pow"), axes],
                 name="ln_var")
    s = g.node("Sqrt", [g.node("Add", [var, g.const("eps", np.array(1e-12, np.float32))], name="ln_eps")],
               name="ln_sqrt")
    n = g.node("Div", [d, s], name="ln_div")
    n = g.node("Mul", [n, g.const("gamma", np.linspace(0.5, 1.5, 128, dtype=np.float32))], name="ln_scale")
    n = g.node("Add", [n, g.weight("beta", [128], 0.1)], name="ln_bias")
    g.node("MatMul", [n, g.weight("W2", [128, 64])], name="proj_out", outputs=["y"])
    return _model(g, "handwritten_layernorm", [_vi("x", F32, ["batch", 16, 64])], [_vi("y", F32, ["batch", 16, 64])], 18)


_register(
    "handwritten-layernorm",
    build_handwritten_layernorm,
    lambda rng: {"x": rng.standard_normal((2, 16, 64)).astype(np.float32)},
    "MatMul -> LayerNorm written as elementwise ops (Pow(d, 2), eps 1e-12, as BERT) -> MatMul: the body stays "
    "FP32 between FP16 MatMuls; onnxruntime's LayerNormFusion fuses it with the Cast at its input into one "
    "LayerNormalization whose input and scale must share a type, so the scale and bias take the input's "
    "(runtime.ort-layernorm-fusion) and the output loads.",
)
