"""The models the GPU benchmark measures, their FP32 files, and their inputs at each batch size.

Full run: the published architectures (random weights, ``models/architectures.py``), the fused
BERT/GPT-2 of the deployment catalog and its onnxruntime-genai FP32 decoder. ``--quick``: the same
entries' reduced ``-small`` versions. Inputs are the catalog entry's own (``make_inputs``: valid ids,
masks, images); a batch size is made by repeating or dropping rows along a symbolic batch dimension.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

__all__ = ["FULL", "FX_FULL", "FX_QUICK", "QUICK", "Case", "at_batch", "load_case", "seeded_inputs"]

FULL = ("bert-base", "gpt2", "vit-base", "resnet50", "whisper-tiny-encoder", "t5-small-encoder",
        "t5-small-decoder", "bert-fused", "gpt2-fused", "llama-genai-fp32")
QUICK = tuple(f"{name}-small" for name in FULL)
#: The FX part's models (``models.architectures.ARCHS`` names).
FX_FULL = ("resnet50", "bert-base")
FX_QUICK = ("resnet50-small", "bert-base-small")
#: Calibration samples for target fp8 (seeds apart from the measured inputs' seed 0).
CALIBRATION_SEEDS = (100, 101, 102, 103)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kind: str  # the catalog kind: architecture | deployment | ...
    path: Path  # the FP32 model, saved in the run's work folder
    feeds: dict[str, np.ndarray]  # the entry's inputs (seed 0): accuracy is measured on them


def seeded_inputs(name: str, seed: int) -> dict[str, np.ndarray]:
    from models import catalog

    return catalog.get(name).make_inputs(np.random.default_rng(seed))


def load_case(name: str, folder: Path) -> Case:
    """Build (or take from the catalog's cache) the FP32 model of catalog entry ``name``, saved as
    ``folder/fp32.onnx`` (kept there for the other variants of the same run)."""
    from models import catalog

    entry = catalog.get(name)
    path = folder / "fp32.onnx"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        model = catalog.load(entry)
        tmp = path.with_suffix(".tmp")
        onnx.save(model, str(tmp))
        tmp.replace(path)
    return Case(name, entry.kind, path, entry.make_inputs(np.random.default_rng(0)))


def at_batch(feeds: dict[str, np.ndarray], batch: int, input_shapes: dict[str, list]) -> dict[str, np.ndarray] | str:
    """``feeds`` with ``batch`` rows, repeating or dropping rows along each input's first dimension
    where the model declares it symbolic (``input_shapes``: onnxruntime's ``get_inputs()`` shapes);
    a string saying why not when an input's first dimension is fixed to another size."""
    out = {}
    for name, array in feeds.items():
        dims = input_shapes.get(name)
        if not dims or array.ndim == 0:
            out[name] = array
            continue
        lead = dims[0]
        if isinstance(lead, int) and lead > 0:
            if lead != batch:
                return f"input {name!r} has a fixed batch of {lead}"
            out[name] = array
            continue
        out[name] = array[np.arange(batch) % array.shape[0]]
    return out
