"""Public architectures written in plain PyTorch: torchvision's ViT, and ``nn.TransformerEncoder`` stacks.

torchvision's ViT-B/16 (``torchvision.models.vit_b_16``) and every model built on
``nn.MultiheadAttention(..., batch_first=True)`` export their attention differently from transformers'
eager attention: the module transposes its batch-first input to sequence-first (``Transpose`` with
perm ``[1, 0, 2]``) and projects Q, K and V with one 2-D weight (``MatMul``), the pattern onnxruntime's
``MatmulTransposeFusion`` crashes on once a Cast sits between them
(:mod:`amp_compiler.passes.analysis.hazards`). torchvision is not a dependency here, so its ViT is
written out layer for layer (patch convolution, class token, position embedding, pre-norm encoder
blocks of ``nn.MultiheadAttention`` and a GELU MLP, final LayerNorm, linear head), with its published
ViT-B/16 config: 224x224 images, patch 16, 12 layers, hidden 768, 12 heads, MLP 3072, 1,000 classes.

``encoder_stack`` is a stack of ``nn.TransformerEncoderLayer(batch_first=True, norm_first=True)``
over a sequence of embeddings, for the benchmark of many layers (``benchmarks/hazard_share.py``);
it is not a catalog entry.

Weights: PyTorch's default initialisation, made realistic as the transformers architectures' are
(:func:`models.architectures.realistic_init`); exported and checked as they are
(:func:`models.architectures.export_to_onnx`), cached under a key of the config and library versions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import onnx

from models.architectures import OPSET, SEED, cached, export_to_onnx, realistic_init
from models.entry import CatalogModel, Tolerance

BUILDER_VERSION = "1"


def _vit_module(image: int, patch: int, layers: int, hidden: int, heads: int, mlp: int, classes: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden, eps=1e-6)
            self.self_attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
            self.ln_2 = nn.LayerNorm(hidden, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(hidden, mlp), nn.GELU(), nn.Linear(mlp, hidden))

        def forward(self, x):
            y = self.ln_1(x)
            y, _ = self.self_attention(y, y, y, need_weights=False)
            x = x + y
            return x + self.mlp(self.ln_2(x))

    class VisionTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_proj = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
            self.class_token = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
            self.pos_embedding = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, hidden) * 0.02)
            self.layers = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(hidden, eps=1e-6)
            self.head = nn.Linear(hidden, classes)

        def forward(self, pixel_values):
            x = self.conv_proj(pixel_values).flatten(2).transpose(1, 2)
            token = self.class_token.expand(x.shape[0], -1, -1)
            x = torch.cat([token, x], dim=1) + self.pos_embedding
            x = self.ln(self.layers(x))
            return self.head(x[:, 0])

    return VisionTransformer()


def _encoder_module(layers: int, hidden: int, heads: int, mlp: int, classes: int):
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(hidden, heads, mlp, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(hidden, classes)

        def forward(self, embeddings):
            return self.head(self.encoder(embeddings))

    return Encoder()


@dataclasses.dataclass(frozen=True)
class TorchNet:
    """One plain-PyTorch model: how to make it, its input and its cache key."""

    name: str
    size: str
    kind: str  # "vit" | "encoder"
    config: dict
    input_shape: tuple[int, ...]
    description: str
    tolerance: Tolerance = Tolerance()
    weight_dominated: bool = True

    @property
    def input_name(self) -> str:
        return "pixel_values" if self.kind == "vit" else "embeddings"

    def key(self) -> str:
        import torch

        blob = json.dumps([BUILDER_VERSION, self.kind, self.config, self.input_shape, torch.__version__, OPSET, SEED],
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {self.input_name: rng.standard_normal(self.input_shape, dtype=np.float32)}

    def module(self):
        import torch

        torch.manual_seed(SEED)
        model = (_vit_module if self.kind == "vit" else _encoder_module)(**self.config)
        realistic_init(model, SEED)
        return model.eval()

    def build(self, cache: Path) -> onnx.ModelProto:
        return cached(Path(cache) / f"{self.name}.{self.key()}.onnx", self._export)

    def _export(self) -> onnx.ModelProto:
        inner = self.module()
        name = self.input_name

        import torch

        class Named(torch.nn.Module):  # export_to_onnx calls module(**inputs)
            def __init__(self):
                super().__init__()
                self.inner = inner

            def forward(self, **kwargs):
                return self.inner(kwargs[name])

        example = self.make_inputs(np.random.default_rng(999))
        example[name] = np.concatenate([example[name], example[name][:1]])  # batch one longer: dynamic
        proto = export_to_onnx(
            Named(), self.make_inputs(np.random.default_rng(0)), ["logits"], example=example,
            dynamic_axes={name: {0: "batch"}},
        )
        proto.doc_string = self.description
        return proto


_VIT_B16 = dict(image=224, patch=16, layers=12, hidden=768, heads=12, mlp=3072, classes=1000)
SPECS = [
    TorchNet("vit-mha-small", "small", "vit", dict(image=32, patch=8, layers=2, hidden=64, heads=4, mlp=128,
                                                     classes=100),
             (2, 3, 32, 32), "torchvision's ViT layout (nn.MultiheadAttention, batch_first) with 2 layers, "
             "hidden 64, 32x32 input, patch 8"),
    TorchNet("vit-mha", "full", "vit", _VIT_B16, (1, 3, 224, 224),
             "torchvision's ViT-B/16 (published config, nn.MultiheadAttention with batch_first), 224x224"),
]


def encoder_stack(layers: int = 48, hidden: int = 512, heads: int = 8, sequence: int = 128) -> TorchNet:
    """A stack of ``layers`` pre-norm ``nn.TransformerEncoderLayer(batch_first=True)`` over
    ``sequence`` embeddings of width ``hidden`` (MLP 4x), with a linear head: not in the catalog."""
    return TorchNet(
        f"encoder{layers}-mha", "full", "encoder",
        dict(layers=layers, hidden=hidden, heads=heads, mlp=4 * hidden, classes=hidden),
        (1, sequence, hidden), f"{layers} nn.TransformerEncoderLayer (batch_first, norm_first), width {hidden}",
    )


ENTRIES = [
    CatalogModel(name=s.name, kind="architecture", size=s.size, build=s.build, make_inputs=s.make_inputs,
                 tolerance=s.tolerance, weight_dominated=s.weight_dominated, description=s.description)
    for s in SPECS
]
