"""Deployment graphs: transformers fused by onnxruntime's optimizer, and LLM decoders with a KV cache.

These are the graphs people hand to onnxruntime's CUDA and TensorRT providers, each with the FP16
graph its own tool ships (the *anchor* a conversion is measured against):

- **Fused encoders** (BERT, BERT with MultiHeadAttention, GPT-2, ViT, CLIP vision, T5 encoder):
  a transformers model with random, realistic weights (``models.architectures.Arch``, eager
  attention), exported with the TorchScript exporter (``dynamo=False``, opset 17: the optimizer does
  not fuse the dynamo exporter's graphs, and crashes on GPT-2's) and fused by
  ``onnxruntime.transformers.optimizer.optimize_model`` (its FP32 output). Anchors: the same
  optimizer's ``convert_float_to_float16(keep_io_types=True)`` and its command line's ``--float16``.
- **Llama-style decoders** (grouped-query attention, KV cache ``past_key_values.{i}.key/value`` in,
  ``present.{i}.key/value`` out): a random ``LlamaForCausalLM`` saved with ``save_pretrained`` next
  to a local word-level tokenizer, then (a) written by onnxruntime-genai's model builder
  (``-p fp32 -e cpu``: GroupQueryAttention with rotary inside, SkipSimplifiedLayerNormalization;
  ``-p int4 -e cpu``: MatMulNBits), or (b) exported by ``torch.onnx.export`` (TorchScript, opset
  17) with the cache as explicit inputs and outputs (optimum's names, plus ``position_ids``).
  Anchors: the builder's ``-p fp16 -e cuda`` and ``-p int4 -e cuda`` graphs (written without a
  GPU), and for the torch export onnxruntime's ``convert_float_to_float16(keep_io_types=True)``.

Every builder is a plain function of a cache directory returning an ``onnx.ModelProto`` (weights
inline) and caches its result as ``<cache>/<name>.<key>.onnx``; the key hashes the recipe, the
config and the versions of torch, transformers, onnxruntime and onnxruntime-genai. Each FP32 model
is checked to run on onnxruntime's CPU provider; fused encoders and the torch export also match
PyTorch (cosine >= 0.9999). The decoders' ``make_inputs`` is a decode step with a non-empty cache
(past length 7, one new token per row); ``prompt_inputs`` is a prompt with an empty cache.

Needs ``onnxruntime-genai`` (the test extra brings it) for the builder entries (its builder
imports torch and transformers). ``ENTRIES`` registers them in the catalog as kind "deployment";
``SPECS`` keeps what the catalog entry does not carry (``anchors()``, ``prompt_inputs``).
``python -m models.deployment OUT`` builds every small entry and its anchors into ``OUT`` and prints
one line per model.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from models.architectures import ARCHS, Arch, In, cached, export_once, positional_module, to_torch
from models.entry import Tolerance, entries_from_specs

RECIPE_VERSION = "1"
# Op types the optimizer fuses into (com.microsoft, and SimplifiedLayerNormalization in the default domain).
_FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization",
              "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "BiasGelu", "FastGelu", "Gelu",
              "QuickGelu", "GemmFastGelu", "RotaryEmbedding", "GroupQueryAttention")
EXPORT_OPSET = 17  # the optimizer's fusions match the TorchScript exporter's opset-17 graphs
SEED = 0


def _versions() -> list[str]:
    import onnxruntime
    import torch
    import transformers

    try:
        import onnxruntime_genai

        genai = onnxruntime_genai.__version__
    except ImportError:
        genai = None
    return [torch.__version__, transformers.__version__, onnxruntime.__version__, str(genai)]


def _key(*parts: object) -> str:
    blob = json.dumps([RECIPE_VERSION, EXPORT_OPSET, SEED, *parts, _versions()], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


def run_cpu(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``model`` on onnxruntime's CPU provider; outputs by name."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, inputs)))


def feeds_for(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``inputs`` with float arrays cast to the element types of ``model``'s graph inputs (the FP16
    anchors of the decoders take an FP16 KV cache)."""
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    return {k: v.astype(onnx.helper.tensor_dtype_to_np_dtype(types[k]))
            if k in types and np.issubdtype(v.dtype, np.floating) else v for k, v in inputs.items()}


def check_runs(model: onnx.ModelProto, inputs: dict[str, np.ndarray], reference: list[np.ndarray] = ()) -> None:
    """Check that ``model`` runs on onnxruntime CPU with finite float outputs, and (if given) matches
    ``reference`` output by output with cosine >= 0.9999. (onnx's checker is not run: the point of
    these graphs is that onnxruntime accepts ops that onnx's checker does not know.)"""
    outs = list(run_cpu(model, inputs).items())
    for (name, out), ref in zip(outs, list(reference) + [None] * len(outs)):
        if np.issubdtype(out.dtype, np.floating) and not np.isfinite(out).all():
            raise ValueError(f"output {name!r} has non-finite values")
        if ref is not None:
            if out.shape != ref.shape:
                raise ValueError(f"output {name!r} has shape {out.shape}, the reference {ref.shape}")
            if (cos := _cosine(out, ref)) < 0.9999:
                raise ValueError(f"output {name!r} differs from the reference (cosine {cos:.6f})")


# --------------------------------------------------------------------------------------------------
# Fused encoders
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FusedEncoder:
    """A transformers model exported with TorchScript at opset 17, then fused by onnxruntime's
    transformer optimizer (``model_type``; ``fusion`` sets FusionOptions attributes)."""

    name: str
    arch: Arch  # the transformers model, its inputs and forward (not registered in the catalog)
    model_type: str  # optimize_model's model_type: bert | gpt2 | vit | clip | t5
    fused_ops: dict[str, int]  # com.microsoft (and SimplifiedLayerNormalization) op counts the fusion gives
    fusion: tuple[tuple[str, object], ...] = ()
    tolerance: Tolerance = Tolerance(min_cosine=0.9999)
    weight_dominated: bool = True

    @property
    def size(self) -> str:
        return self.arch.size

    @property
    def description(self) -> str:
        fused = ", ".join(f"{op} x{n}" for op, n in self.fused_ops.items())
        return f"{self.arch.description}; TorchScript opset {EXPORT_OPSET}, fused ({fused})"

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return self.arch.make_inputs(rng)

    def _heads_hidden(self) -> tuple[int, int]:
        return heads_hidden(self.arch)

    def _key(self) -> str:
        return _key(self.arch.key(), self.model_type, self.fusion)

    def build_export(self, cache: Path) -> onnx.ModelProto:
        """The unfused TorchScript export (opset 17), checked against PyTorch on onnxruntime CPU."""
        path = Path(cache) / f"{self.name}.export.{self._key()}.onnx"
        return cached(path, self._export)

    def _export(self) -> onnx.ModelProto:
        import torch

        inputs = self.arch.make_inputs(np.random.default_rng(0))
        module = positional_module(self.arch.torch_module(), list(inputs))
        with torch.no_grad():
            ref = module(*to_torch(inputs).values())
        ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        proto = export_once(
            module, to_torch(self.arch._example()), list(self.arch.output_names), self.arch.dynamic_axes(),
            EXPORT_OPSET, dynamo=False,
        )
        check_runs(proto, inputs, [r.numpy() for r in ref])
        return proto

    def optimizer(self, cache: Path):
        """onnxruntime's ``OnnxModel`` for the fused graph (``optimize_model`` on the export)."""
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        options = FusionOptions(self.model_type)
        for attr, value in self.fusion:
            setattr(options, attr, value)
        heads, hidden = self._heads_hidden()
        exported = self.build_export(cache)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "model.onnx"
            onnx.save(exported, str(src))
            return optimize_model(str(src), model_type=self.model_type, num_heads=heads, hidden_size=hidden,
                                  optimization_options=options)

    def build(self, cache: Path) -> onnx.ModelProto:
        """The optimizer's FP32 fused graph: its fused ops must be ``fused_ops`` (an onnxruntime that
        fuses differently fails here, not in a test), and it must match the export on onnxruntime CPU."""
        path = Path(cache) / f"{self.name}.{self._key()}.onnx"

        def make() -> onnx.ModelProto:
            fused = self.optimizer(cache).model
            counts = collections.Counter(n.op_type for n in fused.graph.node)
            got = {op: counts[op] for op in _FUSED_OPS if counts[op]}
            if got != {op: n for op, n in self.fused_ops.items() if n}:
                raise ValueError(f"{self.name}: the optimizer fused {got}, expected {self.fused_ops}")
            inputs = self.arch.make_inputs(np.random.default_rng(0))
            check_runs(fused, inputs, list(run_cpu(self.build_export(cache), inputs).values()))
            fused.doc_string = self.description
            return fused

        return cached(path, make)

    def anchor_fp16(self, cache: Path) -> onnx.ModelProto:
        """The optimizer's FP16 graph: ``optimize_model(...).convert_float_to_float16(keep_io_types=True)``."""
        path = Path(cache) / f"{self.name}.ort-fp16.{self._key()}.onnx"

        def make() -> onnx.ModelProto:
            opt = self.optimizer(cache)
            opt.convert_float_to_float16(keep_io_types=True)
            return opt.model

        return cached(path, make)

    def anchor_cli_fp16(self, cache: Path) -> onnx.ModelProto:
        """The optimizer command line's FP16 graph:
        ``python -m onnxruntime.transformers.optimizer --input X --output Y --model_type T
        --num_heads H --hidden_size D --float16`` (plus a flag per ``fusion`` option it has)."""
        path = Path(cache) / f"{self.name}.ort-cli-fp16.{self._key()}.onnx"
        flags = {"use_multi_head_attention": "--use_multi_head_attention"}

        def make() -> onnx.ModelProto:
            heads, hidden = self._heads_hidden()
            with tempfile.TemporaryDirectory() as tmp:
                src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
                onnx.save(self.build_export(cache), str(src))
                cmd = [sys.executable, "-m", "onnxruntime.transformers.optimizer", "--input", str(src),
                       "--output", str(dst), "--model_type", self.model_type, "--num_heads", str(heads),
                       "--hidden_size", str(hidden), "--float16"]
                cmd += [flags[attr] for attr, value in self.fusion if value is True]
                _run(cmd)
                return onnx.load(str(dst))

        return cached(path, make)

    def anchors(self) -> dict[str, Callable[[Path], onnx.ModelProto]]:
        """The anchor graphs by name (the command line's ``--float16`` writes the same bytes as
        ``anchor_fp16``, checked on every entry with onnxruntime 1.32, so it is not listed)."""
        return {"ort-fp16": self.anchor_fp16}


def heads_hidden(arch: Arch) -> tuple[int, int]:
    """Attention heads and hidden size of ``arch``'s transformers config (the transformer optimizer's
    ``--num_heads`` and ``--hidden_size``)."""
    import transformers

    cfg = getattr(transformers, arch.config_class)(**arch.config)
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "num_heads", None) or cfg.n_head
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None) or cfg.n_embd
    return int(heads), int(hidden)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def _arch(name: str) -> Arch:
    return next(a for a in ARCHS if a.name == name)


def _gpt2_masked(model, input_ids, attention_mask):
    # transformers 5 needs the mask given: without it the mask code calls torch.diff (aten::diff),
    # which the TorchScript exporter cannot export.
    return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=False)[0]


def _clip_vision(model, pixel_values):
    out = model(pixel_values=pixel_values, return_dict=False)
    return out[0], out[1]


_GPT2_INPUTS = {n: In((2, 16), k, ((0, "batch"), (1, "sequence"))) for n, k in (("input_ids", "ids"), ("attention_mask", "mask"))}
_GPT2_FULL_INPUTS = {n: In((1, 128), k, ((0, "batch"), (1, "sequence"))) for n, k in (("input_ids", "ids"), ("attention_mask", "mask"))}

_GPT2_SMALL = Arch(
    "gpt2-masked-small", "small", "GPT2LMHeadModel", "GPT2Config",
    dict(n_embd=64, n_layer=2, n_head=2, n_positions=64, vocab_size=1024, bos_token_id=1023, eos_token_id=1023,
         use_cache=False),
    _GPT2_INPUTS, ("logits",), _gpt2_masked,
    "GPT-2 LM with 2 layers, hidden 64, vocab 1024, sequence 16 with padding", vocab=1024)
_GPT2_FULL = Arch(
    "gpt2-masked", "full", "GPT2LMHeadModel", "GPT2Config", dict(use_cache=False),
    _GPT2_FULL_INPUTS, ("logits",), _gpt2_masked,
    "GPT-2 124M LM (published config), sequence 128 with padding", vocab=50257)
_CLIP_SMALL = Arch(
    "clip-vision-small", "small", "CLIPVisionModel", "CLIPVisionConfig",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=32,
         patch_size=8, hidden_act="quick_gelu"),
    {"pixel_values": In((2, 3, 32, 32), "image")}, ("last_hidden_state", "pooler_output"), _clip_vision,
    "CLIP vision tower (QuickGelu, pre-LN) with 2 layers, hidden 64, 32x32 input, patch 8")
_CLIP_FULL = Arch(
    "clip-vision", "full", "CLIPVisionModel", "CLIPVisionConfig", dict(hidden_act="quick_gelu"),
    {"pixel_values": In((1, 3, 224, 224), "image")}, ("last_hidden_state", "pooler_output"), _clip_vision,
    "CLIP ViT-B/32 vision tower (published config), 224x224")

_BERT_FUSED = {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}

ENCODERS: list[FusedEncoder] = [
    FusedEncoder("bert-fused-small", _arch("bert-base-small"), "bert", _BERT_FUSED),
    FusedEncoder("bert-fused", _arch("bert-base"), "bert",
                 {"EmbedLayerNormalization": 1, "Attention": 12, "SkipLayerNormalization": 24, "BiasGelu": 12}),
    FusedEncoder("bert-mha-fused-small", _arch("bert-base-small"), "bert",
                 {**_BERT_FUSED, "Attention": 0, "MultiHeadAttention": 2}, (("use_multi_head_attention", True),)),
    # GPT-2, ViT and T5: attention does not fuse with transformers 5 (see benchmarks/notes_deployment.md).
    FusedEncoder("gpt2-fused-small", _GPT2_SMALL, "gpt2", {"SkipLayerNormalization": 4, "FastGelu": 2}),
    FusedEncoder("gpt2-fused", _GPT2_FULL, "gpt2", {"SkipLayerNormalization": 24, "FastGelu": 12}),
    FusedEncoder("vit-fused-small", _arch("vit-base-small"), "vit", {"SkipLayerNormalization": 4, "BiasGelu": 2}),
    FusedEncoder("vit-fused", _arch("vit-base"), "vit", {"SkipLayerNormalization": 24, "BiasGelu": 12}),
    FusedEncoder("clip-vision-fused-small", _CLIP_SMALL, "clip",
                 {"Attention": 2, "SkipLayerNormalization": 3, "QuickGelu": 2}),
    FusedEncoder("clip-vision-fused", _CLIP_FULL, "clip",
                 {"Attention": 12, "SkipLayerNormalization": 23, "QuickGelu": 12}),
    FusedEncoder("t5-encoder-fused-small", _arch("t5-small-encoder-small"), "t5",
                 {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 4}),
    FusedEncoder("t5-encoder-fused", _arch("t5-small-encoder"), "t5",
                 {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 12}),
]


# --------------------------------------------------------------------------------------------------
# Llama-style decoders with a KV cache
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decoder:
    """A random ``LlamaForCausalLM`` (grouped-query attention) and its local transformers folder."""

    name: str
    size: str
    config: dict  # LlamaConfig overrides
    description: str
    batch: int = 2
    past: int = 7  # past length of make_inputs' decode step
    prompt: int = 5  # sequence length of prompt_inputs (empty cache)

    def llama_config(self):
        import transformers

        return transformers.LlamaConfig(**self.config)

    @property
    def head_dim(self) -> int:
        cfg = self.llama_config()
        return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)

    def hf_folder(self, cache: Path) -> Path:
        """``save_pretrained`` folder: config, safetensors weights (random, realistic: norm gammas in
        [0.5, 1.5]) and a word-level tokenizer of the model's vocabulary (tokenizer.json)."""
        folder = Path(cache) / f"{self.name}.hf.{_key(self.config)}"
        if (folder / "tokenizer.json").exists():
            return folder
        import torch
        import transformers
        from tokenizers import Tokenizer, models, pre_tokenizers

        from models.architectures import realistic_init

        cfg = self.llama_config()
        specials = {"<unk>": 0, "<s>": 1, "</s>": 2}
        vocab = {**specials, **{f"w{i}": i for i in range(len(specials), cfg.vocab_size)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                    eos_token="</s>")
        torch.manual_seed(SEED)
        model = transformers.LlamaForCausalLM(cfg).eval()
        realistic_init(model, SEED)
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
        model.save_pretrained(tmp)
        fast.save_pretrained(tmp)
        os.replace(tmp, folder)
        return folder

    # -- inputs ------------------------------------------------------------------------------------

    def _inputs(self, rng: np.random.Generator, seq: int, past: int, positions: bool) -> dict[str, np.ndarray]:
        cfg = self.llama_config()
        out = {
            "input_ids": rng.integers(3, cfg.vocab_size, size=(self.batch, seq), dtype=np.int64),
            "attention_mask": np.ones((self.batch, past + seq), dtype=np.int64),
        }
        if positions:
            out["position_ids"] = np.broadcast_to(np.arange(past, past + seq, dtype=np.int64), (self.batch, seq)).copy()
        shape = (self.batch, cfg.num_key_value_heads, past, self.head_dim)
        for i in range(cfg.num_hidden_layers):
            for kv in ("key", "value"):
                out[f"past_key_values.{i}.{kv}"] = rng.standard_normal(shape, dtype=np.float32)
        return out


def _genai_build(decoder: Decoder, cache: Path, precision: str, provider: str) -> onnx.ModelProto:
    """What ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p precision -e provider`` writes
    (called in process through the same two functions its command line calls: about 0.2 s a model
    instead of 10-20 s of start-up), loaded with its external data inline."""
    try:
        from onnxruntime_genai.models.builder import create_model, parse_extra_options
    except ImportError as exc:
        raise RuntimeError(f"{decoder.name}: onnxruntime-genai builds this model and is not installed "
                           f"(the test extra brings it): {exc}") from None

    hf = str(decoder.hf_folder(cache))
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        out, work = f"{tmp}/out", f"{tmp}/cache"
        options = parse_extra_options(None, hf, out, precision, provider, work, None)
        create_model(None, hf, out, precision, provider, work, **options)
        return onnx.load(f"{out}/model.onnx")


@dataclasses.dataclass(frozen=True)
class GenaiDecoder:
    """A decoder written by onnxruntime-genai's model builder (``-p precision -e cpu``)."""

    name: str
    decoder: Decoder
    precision: str  # fp32 | int4
    tolerance: Tolerance = Tolerance(min_cosine=0.9999)
    weight_dominated: bool = True

    @property
    def size(self) -> str:
        return self.decoder.size

    @property
    def description(self) -> str:
        what = "MatMulNBits int4 weights" if self.precision == "int4" else "FP32"
        return (f"{self.decoder.description}; onnxruntime-genai builder -p {self.precision} -e cpu ({what}, "
                "GroupQueryAttention with rotary, SkipSimplifiedLayerNormalization, KV cache)")

    def _path(self, cache: Path, flavour: str) -> Path:
        return Path(cache) / f"{self.name}.{flavour}.{_key(self.decoder.config, 'genai')}.onnx"

    def build(self, cache: Path) -> onnx.ModelProto:
        def make() -> onnx.ModelProto:
            model = _genai_build(self.decoder, cache, self.precision, "cpu")
            check_runs(model, self.decoder._inputs(np.random.default_rng(0), self.decoder.prompt, 0, False))
            check_runs(model, self.make_inputs(np.random.default_rng(0)))
            model.doc_string = self.description
            return model

        return cached(self._path(cache, self.precision), make)

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A decode step: one new token per row after ``past`` cached ones."""
        return self.decoder._inputs(rng, 1, self.decoder.past, positions=False)

    def prompt_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A prompt of ``prompt`` tokens with an empty cache."""
        return self.decoder._inputs(rng, self.decoder.prompt, 0, positions=False)

    def anchor_cuda(self, cache: Path) -> onnx.ModelProto:
        """The builder's CUDA graph at the same weight precision: ``-p fp16 -e cuda`` for the FP32
        model, ``-p int4 -e cuda`` (FP16 activations, MatMulNBits) for the int4 one."""
        precision = "fp16" if self.precision == "fp32" else self.precision
        return cached(self._path(cache, f"genai-{precision}-cuda"),
                       lambda: _genai_build(self.decoder, cache, precision, "cuda"))

    def anchors(self) -> dict[str, Callable[[Path], onnx.ModelProto]]:
        return {"genai-cuda": self.anchor_cuda}


@dataclasses.dataclass(frozen=True)
class TorchDecoder:
    """The decoder exported by ``torch.onnx.export`` (TorchScript, opset 17, eager attention) with
    its KV cache as inputs ``past_key_values.{i}.key/value`` and outputs ``present.{i}.key/value``
    (optimum's names), plus ``input_ids``, ``attention_mask`` (past + new length) and
    ``position_ids``."""

    name: str
    decoder: Decoder
    tolerance: Tolerance = Tolerance(min_cosine=0.9999)
    weight_dominated: bool = True

    @property
    def size(self) -> str:
        return self.decoder.size

    @property
    def extra_casts(self) -> int:
        """Casts a conversion has beyond its anchor's (which converts everything but a short block
        list): RMSNorm is decomposed here (Pow, ReduceMean, ... after the norm's explicit
        ``Cast(to=float)``, which the TorchScript trace shares with the residual stream), so its
        norms stay FP32 and so does the residual stream: a Cast into and out of each attention and
        MLP block (4 per layer), plus the first norm's own Cast, rotary Cos/Sin kept FP32 (2 Casts
        to FP16) and the final norm's output (1)."""
        return 4 * int(self.decoder.config["num_hidden_layers"]) + 4

    @property
    def description(self) -> str:
        return f"{self.decoder.description}; torch.onnx.export (TorchScript, opset {EXPORT_OPSET}) with a KV cache"

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A decode step: one new token per row after ``past`` cached ones."""
        return self.decoder._inputs(rng, 1, self.decoder.past, positions=True)

    def prompt_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A prompt of ``prompt`` tokens with an empty cache."""
        return self.decoder._inputs(rng, self.decoder.prompt, 0, positions=True)

    def _path(self, cache: Path, flavour: str) -> Path:
        return Path(cache) / f"{self.name}.{flavour}.{_key(self.decoder.config, 'torch-kv')}.onnx"

    def build(self, cache: Path) -> onnx.ModelProto:
        return cached(self._path(cache, "fp32"), lambda: self._export(cache))

    def _export(self, cache: Path) -> onnx.ModelProto:
        import torch
        import transformers

        model = transformers.LlamaForCausalLM.from_pretrained(
            self.decoder.hf_folder(cache), attn_implementation="eager").eval()
        wrapper = _CacheAsTensors(model)
        layers = model.config.num_hidden_layers
        past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        outputs = ["logits", *(n.replace("past_key_values", "present") for n in past_names)]
        axes = {"input_ids": {0: "batch", 1: "sequence"}, "position_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "total_sequence"}, "logits": {0: "batch", 1: "sequence"}}
        axes.update({n: {0: "batch", 2: "past_sequence"} for n in past_names})
        axes.update({n: {0: "batch", 2: "total_sequence"} for n in outputs[1:]})
        # Trace with a prompt of 3 tokens after 5 cached ones (no dimension of size 1).
        trace = self.decoder._inputs(np.random.default_rng(1), 3, 5, positions=True)
        proto = export_once(wrapper, to_torch(trace), outputs, axes, EXPORT_OPSET, dynamo=False)
        for inputs in (self.make_inputs(np.random.default_rng(0)), self.prompt_inputs(np.random.default_rng(0))):
            with torch.no_grad():
                ref = [r.numpy() for r in wrapper(*to_torch(inputs).values())]
            check_runs(proto, inputs, ref)
        proto.doc_string = self.description
        return proto

    def anchor_fp16(self, cache: Path) -> onnx.ModelProto:
        """onnxruntime's FP16 conversion of the export (no fusion: the optimizer has none for it):
        ``OnnxModel(model).convert_float_to_float16(keep_io_types=True)``."""
        from onnxruntime.transformers.onnx_model import OnnxModel

        def make() -> onnx.ModelProto:
            m = OnnxModel(self.build(cache))
            m.convert_float_to_float16(keep_io_types=True)
            return m.model

        return cached(self._path(cache, "ort-fp16"), make)

    def anchors(self) -> dict[str, Callable[[Path], onnx.ModelProto]]:
        return {"ort-fp16": self.anchor_fp16}


def _CacheAsTensors(model):  # noqa: N802 - a class factory (torch is imported lazily)
    """Wrap a causal LM as ``module(input_ids, attention_mask, position_ids, *past) -> (logits,
    *present)``, the cache flattened as (key, value) per layer."""
    import torch
    from transformers import DynamicCache

    class CacheAsTensors(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=self.model.config)
            for i in range(len(past) // 2):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True, return_dict=True)
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    return CacheAsTensors()


_LLAMA_SMALL = Decoder(
    "llama-small", "small",
    dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
         tie_word_embeddings=False),
    "Llama decoder with 2 layers, hidden 64, 4 query / 2 KV heads (head 16), vocab 256")
_LLAMA_FULL = Decoder(
    "llama", "full",
    dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
         num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
         tie_word_embeddings=False),
    "Llama decoder with 4 layers, hidden 512, 8 query / 2 KV heads (head 64), vocab 8192", past=120)

# int4: the builder's own FP16 graph (-p int4 -e cuda) reaches only cosine 0.99938 (full) / 0.99994
# (small) against the -p int4 -e cpu graph on onnxruntime CPU, so these entries ask for 0.999.
# Their weights are 4-bit already (only the scales and the embedding halve): not weight dominated.
_INT4 = Tolerance(min_cosine=0.999, max_error_of_range=0.05)
DECODERS: list[GenaiDecoder | TorchDecoder] = [
    GenaiDecoder("llama-genai-fp32-small", _LLAMA_SMALL, "fp32"),
    GenaiDecoder("llama-genai-fp32", _LLAMA_FULL, "fp32"),
    GenaiDecoder("llama-genai-int4-small", _LLAMA_SMALL, "int4", _INT4, weight_dominated=False),
    GenaiDecoder("llama-genai-int4", _LLAMA_FULL, "int4", _INT4, weight_dominated=False),
    TorchDecoder("llama-torch-kv-small", _LLAMA_SMALL),
    TorchDecoder("llama-torch-kv", _LLAMA_FULL),
]

# Every deployment graph; ``anchors()`` gives each one's FP16 reference graphs by name.
SPECS: list[FusedEncoder | GenaiDecoder | TorchDecoder] = [*ENCODERS, *DECODERS]
ENTRIES = entries_from_specs("deployment", SPECS)


def spec(name: str) -> FusedEncoder | GenaiDecoder | TorchDecoder:
    """The deployment graph of this catalog name (with its anchors and prompt inputs)."""
    return next(s for s in SPECS if s.name == name)


def build_all(out: Path, size: str = "small") -> list[dict]:
    """Build every entry of ``size`` and its anchors, save them as ``OUT/<name>[.<anchor>].onnx``
    (the cache is ``OUT/.cache``) and check each runs on onnxruntime CPU. One row per model."""
    out = Path(out)
    cache = out / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in (s for s in SPECS if s.size == size):
        builders = {"fp32": spec.build, **spec.anchors()}
        for flavour, build in builders.items():
            t0 = time.perf_counter()
            row = {"name": spec.name, "flavour": flavour}
            try:
                model = build(cache)
                row["build_s"] = round(time.perf_counter() - t0, 2)
                path = out / (f"{spec.name}.onnx" if flavour == "fp32" else f"{spec.name}.{flavour}.onnx")
                onnx.save(model, str(path))
                row["mb"] = round(path.stat().st_size / 1e6, 3)
                row["nodes"] = len(model.graph.node)
                try:
                    run_cpu(model, feeds_for(model, spec.make_inputs(np.random.default_rng(0))))
                    row["runs_on_cpu"] = "yes"
                except Exception as exc:  # noqa: BLE001 - reported, not fatal: some anchors are GPU-only
                    row["runs_on_cpu"] = f"no: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                row["error"] = f"{type(exc).__name__}: {str(exc)[-500:]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python -m models.deployment OUT_DIR [small|full]")
    results = build_all(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "small")
    sys.exit(1 if any("error" in r for r in results) else 0)
