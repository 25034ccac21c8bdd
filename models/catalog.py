"""Registry of test models.

Every entry knows how to build its FP32 ONNX model, how to make inputs for it, and which tolerances a
converted model must meet. Builders are pure functions of a cache directory, so CI can build everything
from nothing; large exports are cached under ``models/.cache`` (git-ignored) between local runs.

Sizes:
- ``small``: reduced-size configs (same ops, fewer layers and channels): what CI runs.
- ``full``: the real architectures at their published sizes: benchmarks and ``slow`` tests.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

CACHE_DIR = Path(os.environ.get("AMP_MODELS_CACHE", Path(__file__).parent / ".cache"))


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Accuracy a converted model must reach against the FP32 model, per float output."""

    min_cosine: float = 0.999
    max_error_of_range: float = 0.02  # max |error| as a share of the FP32 output's (max - min)


@dataclasses.dataclass(frozen=True)
class CatalogModel:
    name: str
    kind: str  # "rule" (hand-built), "architecture" (transformers config), "wheel" (trained, from PyPI)
    size: str  # "small" or "full"
    build: Callable[[Path], onnx.ModelProto]  # cache dir -> FP32 model
    make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    tolerance: Tolerance = Tolerance()
    weight_dominated: bool = False  # file size is mostly float weights (shrinks ~2x in FP16)
    description: str = ""


_REGISTRY: dict[str, CatalogModel] = {}


def register(entry: CatalogModel) -> CatalogModel:
    if entry.name in _REGISTRY:
        raise ValueError(f"duplicate catalog entry {entry.name!r}")
    _REGISTRY[entry.name] = entry
    return entry


def register_specs(kind: str, specs: Iterable[Any], describe: Callable[[Any], str] | None = None) -> None:
    """Register one entry of this kind per spec, in order, from the spec's fields of the same names."""
    for spec in specs:
        register(
            CatalogModel(
                name=spec.name,
                kind=kind,
                size=spec.size,
                description=describe(spec) if describe else spec.description,
                build=spec.build,
                make_inputs=spec.make_inputs,
                tolerance=spec.tolerance,
                weight_dominated=spec.weight_dominated,
            )
        )


def _load_all() -> None:
    # Importing the builder modules registers their entries.
    from models import architectures, handbuilt, wheels  # noqa: F401


def entries(size: str | None = "small", kind: str | None = None) -> list[CatalogModel]:
    """Catalog entries, optionally filtered by size and kind, in a stable order."""
    _load_all()
    out = [
        e
        for e in _REGISTRY.values()
        if (size is None or e.size == size) and (kind is None or e.kind == kind)
    ]
    return sorted(out, key=lambda e: (e.kind, e.name))


def get(name: str) -> CatalogModel:
    _load_all()
    return _REGISTRY[name]


def load(entry: CatalogModel | str, cache_dir: Path | None = None) -> onnx.ModelProto:
    """Build (or fetch from cache) the FP32 model of an entry."""
    if isinstance(entry, str):
        entry = get(entry)
    cache = Path(cache_dir or CACHE_DIR)
    cache.mkdir(parents=True, exist_ok=True)
    return entry.build(cache)
