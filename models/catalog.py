"""The test-model catalog: the entries of the builder modules, looked up by size, kind and name.

Every entry knows how to build its FP32 ONNX model, how to make inputs for it, and which tolerances a
converted model must meet. Builders are pure functions of a cache directory, so CI can build everything
from nothing; large exports are cached under ``models/.cache`` (git-ignored) between local runs.

Sizes:
- ``small``: reduced-size configs (same ops, fewer layers and channels): what CI runs.
- ``full``: the real architectures at their published sizes: benchmarks and ``slow`` tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from models import architectures, deployment, fresh_patterns, handbuilt, patterns, tail_patterns, torch_nets, wheels
from models.entry import CatalogModel, Tolerance

__all__ = ["CACHE_DIR", "CatalogModel", "Tolerance", "entries", "get", "load"]

CACHE_DIR = Path(os.environ.get("AMP_MODELS_CACHE", Path(__file__).parent / ".cache"))


def _by_name(*groups: list[CatalogModel]) -> dict[str, CatalogModel]:
    """The entries of every builder module, by name (a name used twice is a bug in the catalog)."""
    out: dict[str, CatalogModel] = {}
    for group in groups:
        for entry in group:
            if entry.name in out:
                raise ValueError(f"duplicate catalog entry {entry.name!r}")
            out[entry.name] = entry
    return out


_ENTRIES = _by_name(
    architectures.ENTRIES, deployment.ENTRIES, handbuilt.ENTRIES, patterns.ENTRIES, fresh_patterns.ENTRIES,
    tail_patterns.ENTRIES, torch_nets.ENTRIES, wheels.ENTRIES,
)


def entries(size: str | None = "small", kind: str | None = None) -> list[CatalogModel]:
    """Catalog entries, optionally filtered by size and kind, in a stable order."""
    out = [
        e
        for e in _ENTRIES.values()
        if (size is None or e.size == size) and (kind is None or e.kind == kind)
    ]
    return sorted(out, key=lambda e: (e.kind, e.name))


def get(name: str) -> CatalogModel:
    return _ENTRIES[name]


def load(entry: CatalogModel | str, cache_dir: Path | None = None) -> onnx.ModelProto:
    """Build (or fetch from cache) the FP32 model of an entry."""
    if isinstance(entry, str):
        entry = get(entry)
    cache = Path(cache_dir or CACHE_DIR)
    cache.mkdir(parents=True, exist_ok=True)
    return entry.build(cache)
