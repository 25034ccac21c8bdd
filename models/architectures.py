"""Public architectures built from transformers configs with random weights.

Each architecture is registered twice: ``<name>-small`` (a reduced config with the same ops: few layers,
narrow channels, small images / short sequences; what CI runs) and ``<name>`` (the published config,
for benchmarks and ``slow`` tests).

Weights are random but deterministic (fixed seeds) and made *realistic* before export so that
activations and outputs have the ranges a trained model would show rather than the degenerate ones some
random inits give (zero-init heads, zero BN gammas, ConvNeXt layer scales of 1e-6):

- norm layers (BatchNorm, LayerNorm, T5's RMS norm, ...) get gammas in [0.5, 1.5] and small biases;
- all-zero weights and biases of Linear / Conv layers are re-initialised with small normal values;
- layer-scale parameters are set to [0.1, 0.4];
- BatchNorm running statistics are re-estimated on a few random batches (cumulative average).

Inputs have a dynamic batch axis, and text models dynamic sequence axes too (so masks, positions and
T5's relative-position buckets are computed in the graph, as in deployed exports); ``make_inputs``
gives concrete shapes. Attention uses transformers' eager implementation (MatMul / Softmax, with
masks filled with float32's lowest value, an FP16 overflow hazard as in real exports).

Models are exported with ``torch.onnx.export(..., dynamo=True)`` at opset 18 (that exporter only: a
failed export is an error, not a silent TorchScript export of another graph under the same cache key),
checked with ``onnx.checker`` (full_check) and compared
against PyTorch in onnxruntime CPU, then cached as ``<cache>/<name>.<key>.onnx`` where the key hashes
the builder version, the config, the input shapes and the torch/transformers versions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from models.entry import Tolerance, entries_from_specs

# Bump when a builder, the realistic init or the export recipe changes: every cached export rebuilds.
BUILDER_VERSION = "2"
OPSET = 18
SEED = 0


@dataclasses.dataclass(frozen=True)
class In:
    """One model input: its shape in make_inputs, what it holds, and its dynamic axes."""

    shape: tuple[int, ...]
    kind: str  # image | mel | hidden | ids | segments | mask
    axes: tuple[tuple[int, str], ...] = ((0, "batch"),)  # (axis, symbolic name) pairs


InputSpec = dict[str, In]


# --------------------------------------------------------------------------------------------------
# Shared export helper
# --------------------------------------------------------------------------------------------------


def realistic_init(model, seed: int = SEED) -> None:
    """Re-initialise degenerate parameters deterministically (see module docstring)."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def uniform_(t, lo: float, hi: float) -> None:
        t.copy_(torch.rand(t.shape, generator=gen, dtype=torch.float32).to(t.dtype) * (hi - lo) + lo)

    def normal_(t, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype) * std)

    with torch.no_grad():
        for _name, module in model.named_modules():
            cls = type(module).__name__
            weight = getattr(module, "weight", None)
            bias = getattr(module, "bias", None)
            is_norm = "Norm" in cls or isinstance(
                module, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
            )
            if is_norm:
                if isinstance(weight, torch.nn.Parameter):
                    uniform_(weight, 0.5, 1.5)
                if isinstance(bias, torch.nn.Parameter):
                    normal_(bias, 0.05)
            elif isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)):
                if isinstance(weight, torch.nn.Parameter) and not weight.any():
                    fan_in = weight[0].numel()
                    normal_(weight, fan_in**-0.5)
                if isinstance(bias, torch.nn.Parameter) and not bias.any():
                    normal_(bias, 0.02)
            for pname, p in module.named_parameters(recurse=False):
                if "layer_scale" in pname or pname in ("gamma", "lambda1", "lambda2"):
                    if p.dim() <= 1:
                        uniform_(p, 0.1, 0.4)


def reestimate_batchnorm(model, batches: list[dict]) -> None:
    """Recompute BatchNorm running statistics as the cumulative average over ``batches``
    (``model(*batch.values())`` is run on each)."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative moving average
    model.train()
    with torch.no_grad():
        for batch in batches:
            model(*batch.values())
    model.eval()


def to_torch(arrays: dict[str, np.ndarray]) -> dict:
    """numpy arrays as torch tensors (same names, same order)."""
    import torch

    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


def check_onnx_model(
    model: onnx.ModelProto,
    inputs: dict[str, np.ndarray],
    reference: list[np.ndarray] | None = None,
    *,
    min_std: float = 1e-2,
) -> list[np.ndarray]:
    """Check ``model``: onnx.checker (full_check), runs in onnxruntime CPU on ``inputs``, float
    outputs finite with std > ``min_std``, and (if given) cosine >= 0.9999 against ``reference``.
    Returns the onnxruntime outputs."""
    import onnxruntime as ort

    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, inputs)
    names = [o.name for o in sess.get_outputs()]
    for name, out in zip(names, outs, strict=True):
        if not np.issubdtype(out.dtype, np.floating):
            continue
        if not np.isfinite(out).all():
            raise ValueError(f"output {name!r} has non-finite values")
        if out.size > 1 and float(out.std()) <= min_std:
            raise ValueError(f"output {name!r} is nearly constant (std {out.std():.3g})")
    for name, out, ref in zip(names, outs, reference or [], strict=False):
        if out.shape != ref.shape:
            raise ValueError(f"output {name!r} has shape {out.shape}, PyTorch gives {ref.shape}")
        if (cos := _cosine(out, ref)) < 0.9999:
            raise ValueError(f"output {name!r} differs from PyTorch (cosine {cos:.6f})")
    return outs


def export_to_onnx(
    module,
    inputs: dict[str, np.ndarray],
    output_names: list[str],
    *,
    example: dict[str, np.ndarray] | None = None,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
    calibration: list[dict[str, np.ndarray]] = (),
    opset: int = OPSET,
) -> onnx.ModelProto:
    """Export ``module`` (called as ``module(**inputs)``) to an FP32 ONNX model and check it.

    - ``calibration``: batches on which BatchNorm running statistics are re-estimated first;
    - ``example``: the inputs to trace with (default ``inputs``); with ``dynamic_axes`` their
      dynamic dimensions should be >= 2 (torch.export specialises dimensions of size 1);
    - ``dynamic_axes``: input name -> {axis: symbolic name}; equal names share one dimension.

    The result is checked with :func:`check_onnx_model` on ``inputs`` against PyTorch. The dynamo
    exporter only (recorded in the model's metadata, ``amp_catalog.exporter``): the TorchScript one
    writes another graph (ResNet-50: 1,054 nodes against 100), which the catalog's tests and recorded
    figures do not describe, and a fallback cached under the same key kept that graph for good after
    one failed export (a CI run started beside a killed one); a failure raises instead.
    """
    import torch

    module = positional_module(module.eval(), list(inputs))
    if calibration:
        reestimate_batchnorm(module, [to_torch(b) for b in calibration])
    with torch.no_grad():
        ref = module(*to_torch(inputs).values())
    ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    ref = [r.detach().numpy() for r in ref]
    if len(ref) != len(output_names):
        raise ValueError(f"module returns {len(ref)} outputs, {len(output_names)} names given")

    args = to_torch(example if example is not None else inputs)
    try:
        proto = export_once(module, args, output_names, dynamic_axes or {}, opset, dynamo=True)
        check_onnx_model(proto, inputs, ref)
    except Exception as exc:  # noqa: BLE001 - any exporter or check failure: one error naming it
        raise RuntimeError(f"ONNX export (dynamo exporter) failed: {type(exc).__name__}: {exc}") from exc
    onnx.helper.set_model_props(proto, {"amp_catalog.exporter": "dynamo", "amp_catalog.torch": torch.__version__})
    return proto


def export_once(module, args: dict, output_names, dynamic_axes, opset: int, dynamo: bool) -> onnx.ModelProto:
    """One ``torch.onnx.export`` of ``module`` called positionally on ``args`` (name -> tensor), with
    the dynamo exporter or the TorchScript one, quietly; unchecked (see :func:`export_to_onnx`)."""
    import torch

    names = list(args)
    values = tuple(args.values())
    # Quieten the exporter: progress lines on stdout, "torchvision is not installed" warnings.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if dynamo:
            dims = {}
            shapes = tuple(
                {axis: dims.setdefault(d, torch.export.Dim(d)) for axis, d in dynamic_axes.get(n, {}).items()}
                or None
                for n in names
            )
            prog = torch.onnx.export(
                module,
                values,
                dynamo=True,
                opset_version=opset,
                input_names=names,
                output_names=list(output_names),
                dynamic_shapes=(shapes,) if dynamic_axes else None,  # one entry: the *args tuple
                optimize=True,
                verbose=False,
            )
            return prog.model_proto
        buf = io.BytesIO()
        torch.onnx.export(
            module,
            values,
            buf,
            dynamo=False,
            opset_version=opset,
            input_names=names,
            output_names=list(output_names),
            dynamic_axes=dynamic_axes or None,
            do_constant_folding=True,
        )
        return onnx.load_from_string(buf.getvalue())


def positional_module(inner, names: list[str]):
    """Wrap a module called with keyword inputs into one with positional inputs ``names``
    (both exporters trace positional inputs)."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(names, args, strict=False)))

    return Positional()


def cached(path: Path, build: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    """Load ``path`` if present, else build, save atomically and return."""
    if path.exists():
        return onnx.load(str(path))
    proto = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    onnx.save(proto, str(tmp))
    os.replace(tmp, path)
    return proto


# --------------------------------------------------------------------------------------------------
# Architectures
# --------------------------------------------------------------------------------------------------


def grow_residual(model, channels: list[int], base: float, growth: float, unit: int = 0) -> None:
    """Massive activations, made by activations, not weights: in layer ``l`` the gate and up rows of
    MLP unit ``unit`` are scaled by ``sqrt(base * growth**l)`` each (their SwiGLU product by
    ``base * growth**l``) and the down projection writes that unit into the residual stream's
    ``channels`` only, with weight 1. Those channels grow layer by layer (trained LLMs show a few
    channels thousands of times the others), past FP16's 65504 in the last layers, while every weight
    stays within FP16's range."""
    import torch

    with torch.no_grad():
        for layer, block in enumerate(model.model.layers):
            scale = (base * growth**layer) ** 0.5
            block.mlp.gate_proj.weight[unit, :] *= scale
            block.mlp.up_proj.weight[unit, :] *= scale
            block.mlp.down_proj.weight[:, unit] = 0.0
            block.mlp.down_proj.weight[channels, unit] = 1.0


def _wrap(forward: Callable, model):
    """An nn.Module holding ``model`` whose forward is ``forward(model, **inputs)``."""
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, **kwargs):
            return forward(self.model, **kwargs)

    return Wrapper()


@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    size: str
    model_class: str  # transformers class name
    config_class: str
    config: dict  # config overrides
    inputs: InputSpec
    output_names: tuple[str, ...]
    forward: Callable  # forward(model, **inputs) -> tensor or tuple of tensors
    description: str
    vocab: int = 0  # for token-id inputs
    weight_dominated: bool = True
    tolerance: Tolerance = Tolerance()
    # Massive activations (a decoder's residual stream growing layer by layer, as in trained LLMs):
    # the rows ``channels`` of every layer's MLP down projection scaled by ``base * growth**layer``
    # (:func:`grow_residual`); None: the weights as initialised.
    residual_growth: dict | None = None
    calibrate: bool = False  # its activations leave FP16 on its own inputs (models.entry.CatalogModel)

    def key(self) -> str:
        """Cache key: changes with the builder version, config, inputs and library versions."""
        import torch
        import transformers

        blob = json.dumps(
            [BUILDER_VERSION, self.model_class, self.config_class, self.config,
             [(n, dataclasses.astuple(i)) for n, i in self.inputs.items()], self.output_names,
             self.vocab, torch.__version__, transformers.__version__, OPSET, SEED]
            + ([self.residual_growth] if self.residual_growth else []),
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    # -- inputs ------------------------------------------------------------------------------------

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return self._inputs(rng, {n: i.shape for n, i in self.inputs.items()})

    def _inputs(self, rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]):
        out = {}
        for name, spec in self.inputs.items():
            shape = shapes[name]
            if spec.kind == "image":  # normalised pixels
                out[name] = rng.standard_normal(shape, dtype=np.float32)
            elif spec.kind == "mel":  # whisper log-mel features, scaled to about [-1, 1]
                out[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
            elif spec.kind == "hidden":  # encoder output states (after the final RMS norm)
                out[name] = rng.standard_normal(shape, dtype=np.float32)
            elif spec.kind == "ids":  # token ids within the vocabulary
                out[name] = rng.integers(0, self.vocab, size=shape, dtype=np.int64)
            elif spec.kind == "segments":  # token type ids: first half 0, second half 1
                ids = np.zeros(shape, dtype=np.int64)
                ids[..., shape[-1] // 2 :] = 1
                out[name] = ids
            elif spec.kind == "mask":  # ones, with padding zeros at the end of the later rows
                batch, length = shape
                mask = np.ones(shape, dtype=np.int64)
                for b in range(batch):
                    pad = length // 8 if batch == 1 else b * length // (2 * batch)
                    mask[b, length - pad :] = 0
                out[name] = mask
            else:
                raise ValueError(f"unknown input kind {spec.kind!r}")
        return out

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {n: dict(i.axes) for n, i in self.inputs.items() if i.axes}

    def _example(self) -> dict[str, np.ndarray]:
        """Inputs to trace with: make_inputs' shapes with every dynamic axis one longer, so the
        export check on make_inputs also checks that those axes really are dynamic (and no axis
        has size 1, which torch.export would specialise)."""
        shapes = {}
        for n, spec in self.inputs.items():
            dyn = dict(spec.axes)
            shapes[n] = tuple(d + 1 if a in dyn else d for a, d in enumerate(spec.shape))
        return self._inputs(np.random.default_rng(999), shapes)

    # -- build -------------------------------------------------------------------------------------

    def torch_module(self):
        """The transformers model (random, realistic weights) wrapped as ``module(**inputs)``."""
        import torch
        import transformers

        torch.manual_seed(SEED)
        config = getattr(transformers, self.config_class)(**self.config)
        config._attn_implementation = "eager"  # the classic MatMul/Softmax attention pattern
        model = getattr(transformers, self.model_class)(config)
        realistic_init(model, SEED)
        if self.residual_growth:
            grow_residual(model, **self.residual_growth)
        return _wrap(self.forward, model.eval())

    def torch_example(self) -> tuple:
        """(the eval-mode module taking positional inputs, example inputs as a tuple, its FP32 outputs
        as a tuple), BatchNorm statistics re-estimated on the calibration batches as the ONNX build
        does: what the FX path's tests and benchmarks convert."""
        import torch

        module = positional_module(self.torch_module(), list(self.inputs))
        batches = [to_torch(self.make_inputs(np.random.default_rng(1000 + i))) for i in range(4)]
        reestimate_batchnorm(module, batches)
        inputs = tuple(to_torch(self.make_inputs(np.random.default_rng(0))).values())
        with torch.no_grad():
            ref = module(*inputs)
        return module.eval(), inputs, ref if isinstance(ref, tuple) else (ref,)

    def build(self, cache: Path) -> onnx.ModelProto:
        path = Path(cache) / f"{self.name}.{self.key()}.onnx"
        return cached(path, self._export)

    def _export(self) -> onnx.ModelProto:
        proto = export_to_onnx(
            self.torch_module(),
            self.make_inputs(np.random.default_rng(0)),
            list(self.output_names),
            example=self._example(),
            dynamic_axes=self.dynamic_axes(),
            calibration=[self.make_inputs(np.random.default_rng(1000 + i)) for i in range(4)],
        )
        proto.doc_string = self.description
        return proto


def _logits(model, **kw):
    return model(**kw, return_dict=False)[0]


def _bert(model, input_ids, attention_mask, token_type_ids):
    out = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                return_dict=False)
    return out[0], out[1]


def _gpt2(model, input_ids):
    return model(input_ids=input_ids, use_cache=False, return_dict=False)[0]


def _t5_encoder(model, input_ids, attention_mask):
    return model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def _t5_decoder(model, decoder_input_ids, encoder_hidden_states):
    # Passing encoder_outputs skips the encoder: the graph holds the decoder stack and the LM head.
    return model(
        encoder_outputs=(encoder_hidden_states,),
        decoder_input_ids=decoder_input_ids,
        use_cache=False,
        return_dict=False,
    )[0]


def _whisper_encoder(model, input_features):
    # Only the encoder of the WhisperModel is traced (the decoder's weights stay out of the graph).
    return model.encoder(input_features=input_features, return_dict=False)[0]


def _image(batch: int, res: int) -> InputSpec:
    return {"pixel_values": In((batch, 3, res, res), "image")}


def _text(batch: int, seq: int, *names_kinds: tuple[str, str]) -> InputSpec:
    return {n: In((batch, seq), k, ((0, "batch"), (1, "sequence"))) for n, k in names_kinds}


_BERT_INPUTS = (("input_ids", "ids"), ("attention_mask", "mask"), ("token_type_ids", "segments"))
_T5_INPUTS = (("input_ids", "ids"), ("attention_mask", "mask"))


def _t5_decoder_inputs(batch: int, target: int, source: int, d_model: int) -> InputSpec:
    return {
        "decoder_input_ids": In((batch, target), "ids", ((0, "batch"), (1, "target_sequence"))),
        "encoder_hidden_states": In(
            (batch, source, d_model), "hidden", ((0, "batch"), (1, "source_sequence"))
        ),
    }


_TEXT_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)

ARCHS: list[Arch] = [
    # ---- ResNet-50 -------------------------------------------------------------------------------
    Arch("resnet50-small", "small", "ResNetForImageClassification", "ResNetConfig",
         dict(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
              layer_type="bottleneck", num_labels=100),
         _image(2, 64), ("logits",), _logits,
         "ResNet-50 topology (bottleneck blocks) reduced to 1 block per stage, widths /8, 64x64 input"),
    Arch("resnet50", "full", "ResNetForImageClassification", "ResNetConfig",
         dict(num_labels=1000), _image(1, 224), ("logits",), _logits,
         "ResNet-50 (published config), 224x224, 1000 classes"),
    # ---- MobileNetV2 -----------------------------------------------------------------------------
    Arch("mobilenetv2-small", "small", "MobileNetV2ForImageClassification", "MobileNetV2Config",
         dict(depth_multiplier=0.35, image_size=64, num_labels=100),
         _image(2, 64), ("logits",), _logits,
         "MobileNetV2 with depth multiplier 0.35, 64x64 input"),
    Arch("mobilenetv2", "full", "MobileNetV2ForImageClassification", "MobileNetV2Config",
         dict(depth_multiplier=1.0, image_size=224, num_labels=1001),
         _image(1, 224), ("logits",), _logits,
         "MobileNetV2 1.0 (published config), 224x224"),
    # ---- EfficientNet-B0 -------------------------------------------------------------------------
    Arch("efficientnet-b0-small", "small", "EfficientNetForImageClassification", "EfficientNetConfig",
         dict(width_coefficient=0.25, depth_coefficient=0.3, image_size=64, hidden_dim=320,
              num_labels=100),
         _image(2, 64), ("logits",), _logits,
         "EfficientNet-B0 topology (MBConv + squeeze-excite, SiLU) narrowed /4 and one block per "
         "stage, 64x64 input"),
    Arch("efficientnet-b0", "full", "EfficientNetForImageClassification", "EfficientNetConfig",
         dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
              dropout_rate=0.2, num_labels=1000),
         _image(1, 224), ("logits",), _logits,
         "EfficientNet-B0 (published config), 224x224"),
    # ---- ViT-base --------------------------------------------------------------------------------
    Arch("vit-base-small", "small", "ViTForImageClassification", "ViTConfig",
         dict(_TEXT_SMALL, image_size=32, patch_size=8, num_labels=100),
         _image(2, 32), ("logits",), _logits,
         "ViT with 2 layers, hidden 64, 32x32 input, patch 8"),
    Arch("vit-base", "full", "ViTForImageClassification", "ViTConfig",
         dict(num_labels=1000), _image(1, 224), ("logits",), _logits,
         "ViT-B/16 (published config), 224x224"),
    # ---- ConvNeXt-tiny ---------------------------------------------------------------------------
    Arch("convnext-tiny-small", "small", "ConvNextForImageClassification", "ConvNextConfig",
         dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], image_size=64, num_labels=100),
         _image(2, 64), ("logits",), _logits,
         "ConvNeXt with 5 blocks, widths /6, 64x64 input"),
    Arch("convnext-tiny", "full", "ConvNextForImageClassification", "ConvNextConfig",
         dict(num_labels=1000), _image(1, 224), ("logits",), _logits,
         "ConvNeXt-T (published config), 224x224"),
    # ---- BERT-base -------------------------------------------------------------------------------
    Arch("bert-base-small", "small", "BertModel", "BertConfig",
         dict(_TEXT_SMALL, vocab_size=1024, max_position_embeddings=64),
         _text(2, 16, *_BERT_INPUTS),
         ("last_hidden_state", "pooler_output"), _bert,
         "BERT encoder with 2 layers, hidden 64, vocab 1024, sequence 16 with padding",
         vocab=1024),
    Arch("bert-base", "full", "BertModel", "BertConfig", {},
         _text(1, 128, *_BERT_INPUTS),
         ("last_hidden_state", "pooler_output"), _bert,
         "BERT-base uncased config, sequence 128 with padding", vocab=30522),
    # ---- GPT-2 -----------------------------------------------------------------------------------
    Arch("gpt2-small", "small", "GPT2LMHeadModel", "GPT2Config",
         dict(n_embd=64, n_layer=2, n_head=2, n_positions=64, vocab_size=1024, bos_token_id=1023,
              eos_token_id=1023, use_cache=False),
         _text(2, 16, ("input_ids", "ids")), ("logits",), _gpt2,
         "GPT-2 LM (causal mask, tied head) with 2 layers, hidden 64, vocab 1024, sequence 16",
         vocab=1024),
    Arch("gpt2", "full", "GPT2LMHeadModel", "GPT2Config", dict(use_cache=False),
         _text(1, 128, ("input_ids", "ids")), ("logits",), _gpt2,
         "GPT-2 124M LM (published config), sequence 128, no KV cache", vocab=50257),
    # ---- A Llama decoder with massive activations ------------------------------------------------
    Arch("llama-massive-activations-small", "small", "LlamaForCausalLM", "LlamaConfig",
         dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
              intermediate_size=128, vocab_size=1024, max_position_embeddings=64, use_cache=False,
              tie_word_embeddings=False),
         _text(2, 16, ("input_ids", "ids")), ("logits",), _logits,
         "Llama decoder (RMS norm, SwiGLU, rotary) with 4 layers, hidden 64, vocab 1024, sequence 16, "
         "whose residual stream grows layer by layer in two channels, as trained LLMs' massive "
         "activations (one SwiGLU unit per layer scaled by 9000 * 15^layer, written into those "
         "channels: down projection outputs of about 7e3, 5e4 and 1.5e6 in layers 1 to 3, every weight "
         "within FP16); every other channel fits FP16",
         vocab=1024, residual_growth={"channels": [3, 17], "base": 9000.0, "growth": 15.0, "unit": 5},
         calibrate=True),
    Arch("llama-massive-activations", "full", "LlamaForCausalLM", "LlamaConfig",
         dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
              intermediate_size=1408, vocab_size=32000, max_position_embeddings=256, use_cache=False,
              tie_word_embeddings=False),
         _text(1, 128, ("input_ids", "ids")), ("logits",), _logits,
         "Llama decoder with 8 layers, hidden 512, vocab 32000, sequence 128, grouped-query attention, "
         "whose residual stream grows layer by layer in two channels (one SwiGLU unit per layer scaled "
         "by 9000 * 4^layer) past FP16's range in the last layers",
         vocab=32000, residual_growth={"channels": [3, 17], "base": 9000.0, "growth": 4.0, "unit": 5},
         calibrate=True),
    # ---- T5-small encoder ------------------------------------------------------------------------
    Arch("t5-small-encoder-small", "small", "T5EncoderModel", "T5Config",
         dict(d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2, vocab_size=1024),
         _text(2, 16, *_T5_INPUTS),
         ("last_hidden_state",), _t5_encoder,
         "T5 encoder (relative position buckets, RMS norm) with 2 layers, d_model 64, sequence 16",
         vocab=1024),
    Arch("t5-small-encoder", "full", "T5EncoderModel", "T5Config", {},
         _text(1, 128, *_T5_INPUTS),
         ("last_hidden_state",), _t5_encoder, "T5-small encoder (published config), sequence 128",
         vocab=32128),
    # ---- T5-small decoder ------------------------------------------------------------------------
    Arch("t5-small-decoder-small", "small", "T5ForConditionalGeneration", "T5Config",
         dict(d_model=64, d_kv=32, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=2,
              vocab_size=1024, use_cache=False),
         _t5_decoder_inputs(2, 8, 16, 64),
         ("logits",), _t5_decoder,
         "T5 decoder + LM head (causal self-attention, cross-attention to encoder states) with 2 "
         "layers, d_model 64, 8 target / 16 source tokens", vocab=1024),
    Arch("t5-small-decoder", "full", "T5ForConditionalGeneration", "T5Config", dict(use_cache=False),
         _t5_decoder_inputs(1, 32, 128, 512),
         ("logits",), _t5_decoder,
         "T5-small decoder + LM head (published config), 32 target / 128 source tokens", vocab=32128),
    # ---- Whisper-tiny encoder --------------------------------------------------------------------
    Arch("whisper-tiny-encoder-small", "small", "WhisperModel", "WhisperConfig",
         dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
              decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=128, num_mel_bins=80,
              max_source_positions=50, max_target_positions=64, vocab_size=1024, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, decoder_start_token_id=3, suppress_tokens=[],
              begin_suppress_tokens=[]),
         {"input_features": In((2, 80, 100), "mel")}, ("last_hidden_state",), _whisper_encoder,
         "Whisper encoder (conv stem, GELU, pre-LN) with 2 layers, d_model 64, 100 mel frames"),
    Arch("whisper-tiny-encoder", "full", "WhisperModel", "WhisperConfig", {},
         {"input_features": In((1, 80, 3000), "mel")}, ("last_hidden_state",), _whisper_encoder,
         "Whisper-tiny encoder (published config), 30 s of 80-bin log-mel features"),
]


ENTRIES = entries_from_specs("architecture", ARCHS)
