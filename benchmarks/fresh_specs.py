"""The architectures of ``benchmarks.fresh_architectures``: public transformers models the catalog
(``models.catalog``) does not hold, so nobody tuned the compiler for them, built small (2-4 layers
or stages, widths 16-128) with random, realistic weights by the project's recipe
(:class:`models.architectures.Arch`: ``realistic_init``, BatchNorm statistics re-estimated, exported
with the dynamo exporter at opset 18, checked against PyTorch, cached by config).

Where the recipe leaves an architecture degenerate, a fix (:attr:`FreshArch.fix`) runs after
``realistic_init``; each says why. ``-big`` text variants give the residual stream the ranges of a
trained LLM: the token embedding scaled by 300, channels 3 and 17 by a further 20 (streams in the
hundreds, two outlier channels in the thousands; a tied LM head grows with it), and for the
Llama-style MLPs (gemma, mistral, qwen2) :func:`models.architectures.grow_residual`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import numpy as np

from models.architectures import ARCHS, SEED, Arch, In, _image, _text

RECIPE_VERSION = "1"  # bump when a fix or a custom input kind changes: their cached exports rebuild
SAMPLE_RATE = 16000
VOCAB = 1024


@dataclasses.dataclass(frozen=True)
class FreshArch(Arch):
    """An :class:`Arch` with a modality, a recipe fix and the axis its argmax is read on."""

    family: str = "text"  # text | vision | audio
    fix: Callable | None = None  # fix(model): run after realistic_init (and grow_residual)
    argmax_axis: int | None = -1  # the class axis of the first output (None: not a classifier)

    def key(self) -> str:
        tag = f"{super().key()}|{RECIPE_VERSION}|{self.fix.__name__ if self.fix else ''}"
        return hashlib.sha256(tag.encode()).hexdigest()[:10]

    def torch_module(self):
        wrapper = super().torch_module()
        if self.fix is not None:
            self.fix(wrapper.model)
        return wrapper

    def _inputs(self, rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        """Arch's input kinds, plus ``wave`` (16 kHz audio), ``fbank`` (AST's log-mel filter bank of
        such audio) and ``log-mel`` (Whisper's features of it)."""
        custom = {n: s for n, s in self.inputs.items() if s.kind in _CUSTOM_KINDS}
        plain = dataclasses.replace(self, inputs={n: s for n, s in self.inputs.items() if n not in custom})
        out = Arch._inputs(plain, rng, shapes) if plain.inputs else {}
        for name, spec in custom.items():
            out[name] = _CUSTOM_KINDS[spec.kind](rng, shapes[name])
        return {n: out[n] for n in self.inputs}


def waveform(rng: np.random.Generator, samples: int) -> np.ndarray:
    """A sum of four sines (80-3000 Hz) plus noise, peak 0.5."""
    t = np.arange(samples) / SAMPLE_RATE
    x = 0.1 * rng.standard_normal(samples)
    for _ in range(4):
        x += rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * rng.uniform(80, 3000) * t + rng.uniform(0, 2 * np.pi))
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def _waves(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.stack([waveform(rng, shape[1]) for _ in range(shape[0])])


def _fbank(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    from transformers import ASTFeatureExtractor

    batch, frames, bins = shape
    extractor = ASTFeatureExtractor(num_mel_bins=bins, max_length=frames)
    waves = [waveform(rng, SAMPLE_RATE) for _ in range(batch)]
    return extractor(waves, sampling_rate=SAMPLE_RATE, return_tensors="np")["input_values"].astype(np.float32)


def _log_mel(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    from transformers import WhisperFeatureExtractor

    batch, bins, frames = shape
    extractor = WhisperFeatureExtractor(feature_size=bins)
    waves = [waveform(rng, SAMPLE_RATE) for _ in range(batch)]
    features = extractor(waves, sampling_rate=SAMPLE_RATE, return_tensors="np")["input_features"]
    return np.ascontiguousarray(features[:, :, :frames], dtype=np.float32)


_CUSTOM_KINDS: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "wave": _waves, "fbank": _fbank, "log-mel": _log_mel,
}


# --------------------------------------------------------------------------------------------------
# Recipe fixes
# --------------------------------------------------------------------------------------------------


def _generator():
    import torch

    return torch.Generator().manual_seed(SEED + 1)


def grn_init(model) -> None:
    """ConvNeXt-V2's GRN gamma and beta are zero-initialised (GRN is then the identity, and
    realistic_init does not know them): N(0, 0.2)."""
    import torch

    gen = _generator()
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("GRN"):
                for p in (module.weight, module.bias):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def beit_layer_scales(model) -> None:
    """BEiT's layer scales are named lambda_1 / lambda_2 (realistic_init matches lambda1, gamma):
    U(0.1, 0.4) as realistic_init gives the others."""
    import torch

    gen = _generator()
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if name in ("lambda_1", "lambda_2"):
                    p.copy_(torch.rand(p.shape, generator=gen) * 0.3 + 0.1)


def dpt_head_init(model) -> None:
    """DPT's neck and head convs are N(0, 0.02): activations shrink to ~1e-2 and the depth map (after
    the head's final ReLU) to 0 everywhere (the export check refuses it as constant). He-normal, as a
    trained network's stay O(1), and the last conv's bias 1 so the depth map varies."""
    import torch

    gen = _generator()
    with torch.no_grad():
        for module in [*model.neck.modules(), *model.head.modules()]:
            if isinstance(module, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
                w = module.weight
                fan_in = w[0].numel() if isinstance(module, torch.nn.Conv2d) else w[:, 0].numel()
                w.copy_(torch.randn(w.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
        last = [m for m in model.head.modules() if isinstance(m, torch.nn.Conv2d)][-1]
        assert last.bias is not None, "DPT's last head conv has a bias"
        last.bias.fill_(1.0)


def llm_ranges(model) -> None:
    """The ``-big`` variants: token embedding x300, channels 3 and 17 a further x20."""
    import torch

    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb *= 300.0
        emb[:, [3, 17]] *= 20.0


# --------------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------------


def _lm(model, **kw):
    return model(**kw, use_cache=False, return_dict=False)[0]


def _first(model, **kw):
    return model(**kw, return_dict=False)[0]


_DEC = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            vocab_size=VOCAB, max_position_embeddings=128, use_cache=False)
_ENC = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            vocab_size=VOCAB, max_position_embeddings=128)
_IDS_MASK = _text(2, 32, ("input_ids", "ids"), ("attention_mask", "mask"))
_VIT = dict(image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2)
_W2V = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            conv_dim=(32, 32, 32, 32), conv_stride=(5, 4, 4, 4), conv_kernel=(10, 8, 4, 4),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32)
_WAVE = {"input_values": In((2, SAMPLE_RATE), "wave")}


def _txt(name: str, model: str, config: str, overrides: dict, forward: Callable = _lm,
         inputs: dict | None = None) -> FreshArch:
    return FreshArch(name, "small", model, config, overrides, inputs or _IDS_MASK, ("logits",), forward,
                     f"{model}: 2 layers, hidden 64, vocab {VOCAB}, batch 2 x 32 tokens, padded mask",
                     vocab=VOCAB)


def _vis(name: str, model: str, config: str, overrides: dict, res: int = 64, *, fix: Callable | None = None,
         output: str = "logits", argmax_axis: int | None = -1) -> FreshArch:
    return FreshArch(name, "small", model, config, overrides, _image(2, res), (output,), _first,
                     f"{model}: reduced config, {res}x{res} images", family="vision", fix=fix,
                     argmax_axis=argmax_axis)


TEXT: list[FreshArch] = [
    _txt("gemma", "GemmaForCausalLM", "GemmaConfig", dict(_DEC, num_key_value_heads=1, head_dim=32)),
    _txt("gemma2", "Gemma2ForCausalLM", "Gemma2Config",
         dict(_DEC, num_key_value_heads=1, head_dim=32, sliding_window=16)),
    _txt("mistral", "MistralForCausalLM", "MistralConfig",
         dict(_DEC, num_key_value_heads=1, sliding_window=None, tie_word_embeddings=False)),
    _txt("qwen2", "Qwen2ForCausalLM", "Qwen2Config", dict(_DEC, num_key_value_heads=1)),
    _txt("phi3", "Phi3ForCausalLM", "Phi3Config",
         dict(_DEC, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    _txt("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", dict(_DEC, rotary_pct=0.25)),
    _txt("bloom", "BloomForCausalLM", "BloomConfig",
         dict(hidden_size=64, n_layer=2, n_head=2, vocab_size=VOCAB, use_cache=False)),
    _txt("opt", "OPTForCausalLM", "OPTConfig",
         dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, ffn_dim=128, vocab_size=VOCAB,
              max_position_embeddings=128, word_embed_proj_dim=64, use_cache=False)),
    _txt("falcon", "FalconForCausalLM", "FalconConfig",
         dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=VOCAB, use_cache=False)),
    _txt("distilbert", "DistilBertForMaskedLM", "DistilBertConfig",
         dict(dim=64, n_layers=2, n_heads=2, hidden_dim=128, vocab_size=VOCAB, max_position_embeddings=128),
         _first),
    _txt("roberta", "RobertaForMaskedLM", "RobertaConfig", dict(_ENC), _first),
    _txt("albert", "AlbertForMaskedLM", "AlbertConfig", dict(_ENC, embedding_size=32), _first),
    _txt("deberta-v2", "DebertaV2ForMaskedLM", "DebertaV2Config",
         dict(_ENC, relative_attention=True, position_buckets=32, max_relative_positions=-1,
              pos_att_type=["p2c", "c2p"]), _first),
    # ElectraForPreTraining's discriminator logits come out nearly constant with random weights (std
    # 0.008: the export check refuses them); the MLM head is the same encoder with a vocabulary output.
    _txt("electra", "ElectraForMaskedLM", "ElectraConfig", dict(_ENC, embedding_size=32), _first),
    _txt("bart", "BartForConditionalGeneration", "BartConfig",
         dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
              encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB, max_position_embeddings=128,
              use_cache=False),
         _lm, {**_IDS_MASK, "decoder_input_ids": In((2, 16), "ids", ((0, "batch"), (1, "target")))}),
]

_GROWN = {"gemma", "mistral", "qwen2"}  # Llama-style MLPs (gate/up/down projections)
BIG: list[FreshArch] = [
    dataclasses.replace(
        a, name=f"{a.name}-big", fix=llm_ranges,
        description=a.description + "; embedding x300, channels 3 and 17 x6000"
        + ("; residual stream grown per layer (grow_residual base 2000, growth 15)" if a.name in _GROWN else ""),
        residual_growth={"channels": [3, 17], "base": 2000.0, "growth": 15.0, "unit": 5} if a.name in _GROWN else None,
    )
    for a in TEXT
]

VISION: list[FreshArch] = [
    _vis("swin", "SwinForImageClassification", "SwinConfig",
         dict(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
              num_labels=100)),
    _vis("deit", "DeiTForImageClassification", "DeiTConfig", dict(_VIT, intermediate_size=128, num_labels=100)),
    _vis("beit", "BeitForImageClassification", "BeitConfig",
         dict(_VIT, intermediate_size=128, num_labels=100, use_relative_position_bias=True, use_mean_pooling=True),
         fix=beit_layer_scales),
    _vis("segformer", "SegformerForSemanticSegmentation", "SegformerConfig",
         dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[4, 2], hidden_sizes=[16, 32], patch_sizes=[7, 3],
              strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32,
              num_labels=10),
         argmax_axis=1),
    _vis("mobilevit", "MobileViTForImageClassification", "MobileViTConfig",
         dict(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 128],
              num_labels=100)),
    _vis("convnextv2", "ConvNextV2ForImageClassification", "ConvNextV2Config",
         dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=64, num_labels=100), fix=grn_init),
    _vis("regnet", "RegNetForImageClassification", "RegNetConfig",
         dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], groups_width=8,
              layer_type="y", num_labels=100)),
    _vis("resnet", "ResNetForImageClassification", "ResNetConfig",
         dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic",
              num_labels=100)),
    _vis("dinov2", "Dinov2ForImageClassification", "Dinov2Config", dict(_VIT, mlp_ratio=2, num_labels=100)),
    _vis("levit", "LevitForImageClassification", "LevitConfig",
         dict(image_size=128, hidden_sizes=[32, 64, 96], num_attention_heads=[2, 4, 6], depths=[1, 1, 1],
              key_dim=[16, 16, 16], num_labels=100), res=128),
    _vis("poolformer", "PoolFormerForImageClassification", "PoolFormerConfig",
         dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=100)),
    _vis("dpt", "DPTForDepthEstimation", "DPTConfig",
         dict(_VIT, num_hidden_layers=4, intermediate_size=128, backbone_out_indices=[0, 1, 2, 3],
              neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32),
         fix=dpt_head_init, output="predicted_depth", argmax_axis=None),
]

AUDIO: list[FreshArch] = [
    FreshArch("wav2vec2", "small", "Wav2Vec2ForCTC", "Wav2Vec2Config", _W2V, _WAVE, ("logits",), _first,
              "Wav2Vec2 CTC: 2 layers, hidden 64, 1 s of 16 kHz audio", family="audio"),
    FreshArch("hubert", "small", "HubertForCTC", "HubertConfig", _W2V, _WAVE, ("logits",), _first,
              "HuBERT CTC: 2 layers, hidden 64, 1 s of 16 kHz audio", family="audio"),
    FreshArch("audio-spectrogram-transformer", "small", "ASTForAudioClassification", "ASTConfig",
              dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, patch_size=16,
                   frequency_stride=10, time_stride=10, max_length=100, num_mel_bins=64, num_labels=50),
              {"input_values": In((2, 100, 64), "fbank")}, ("logits",), _first,
              "AST: 2 layers, hidden 64, 64-bin fbank of 1 s of audio (100 frames)", family="audio"),
    FreshArch("whisper-decoder", "small", "WhisperForConditionalGeneration", "WhisperConfig",
              dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, decoder_layers=2,
                   decoder_attention_heads=2, decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=50,
                   max_target_positions=64, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                   decoder_start_token_id=3, suppress_tokens=[], begin_suppress_tokens=[], use_cache=False),
              {"input_features": In((2, 80, 100), "log-mel"), "decoder_input_ids": In((2, 8), "ids")},
              ("logits",), _lm,
              "Whisper encoder + decoder + LM head: 2 layers each, d_model 64, 100 log-mel frames, 8 tokens",
              vocab=VOCAB, family="audio"),
]

FRESH: dict[str, FreshArch] = {a.name: a for a in [*TEXT, *BIG, *VISION, *AUDIO]}
# None of them is in the catalog (models.architectures), which the compiler's rules were tuned on.
assert not {a.name.removesuffix("-small") for a in ARCHS} & set(FRESH), "a fresh architecture is in the catalog"
