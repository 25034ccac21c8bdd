"""What a catalog entry is: the data types the builder modules fill in (no registry, no builders).

``models.catalog`` gathers the entries of ``models.handbuilt``, ``models.architectures``,
``models.deployment``, ``models.patterns``, ``models.fresh_patterns``, ``models.tail_patterns``,
``models.torch_nets`` and ``models.wheels``; those modules import only this one, so the catalog and its
builders do not import each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Accuracy a converted model must reach against the FP32 model, per float output."""

    min_cosine: float = 0.999
    max_error_of_range: float = 0.02  # max |error| as a share of the FP32 output's (max - min)


@dataclasses.dataclass(frozen=True)
class CatalogModel:
    """One catalog entry: how to build its FP32 model and its inputs, and the accuracy it must keep."""

    name: str
    # "rule" (hand-built), "architecture" (transformers config), "wheel" (trained, from PyPI),
    # "deployment" (fused by onnxruntime's optimizer, or an LLM decoder with a KV cache)
    kind: str
    size: str  # "small" or "full"
    build: Callable[[Path], onnx.ModelProto]  # cache dir -> FP32 model
    make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    tolerance: Tolerance = Tolerance()
    # What a BF16 conversion must keep, where BF16's rounding misses ``tolerance`` scaled by its roundoff
    # (tests/e2e/test_convert_catalog.py): None, that scaling.
    bf16_tolerance: Tolerance | None = None
    weight_dominated: bool = False  # file size is mostly float weights (shrinks ~2x in FP16)
    description: str = ""
    # Its values leave FP16's range on its own inputs, which only calibration sees: tests convert it
    # with calibration ranges (``calibration_ranges``), as a user would with --calibration-data.
    calibrate: bool = False

    # Why a conversion that neither observes ranges nor has data (convert() as the library runs it,
    # --no-probe) misses ``tolerance`` on this entry by design: a failure pattern that only the range
    # probe fixes, or that the conversion can only measure and warn about (models/fresh_patterns.py).
    # "" for every entry such a conversion must keep accurate.
    blind_fails: str = ""


def calibration_ranges(entry: CatalogModel, model: onnx.ModelProto) -> dict | None:
    """Calibration ranges of ``model`` on two of the entry's inputs (seeds 1000, 1001) where the entry
    needs them (``calibrate``), else None."""
    if not entry.calibrate:
        return None
    from amp_compiler.onnx.measure.calibrate import collect_ranges

    return collect_ranges(model, [entry.make_inputs(np.random.default_rng(1000 + k)) for k in range(2)])


def entries_from_specs(
    kind: str, specs: Iterable[Any], describe: Callable[[Any], str] | None = None
) -> list[CatalogModel]:
    """One entry of this kind per spec, in order, from the spec's fields of the same names."""
    return [
        CatalogModel(
            name=spec.name,
            kind=kind,
            size=spec.size,
            description=describe(spec) if describe else spec.description,
            build=spec.build,
            make_inputs=spec.make_inputs,
            tolerance=spec.tolerance,
            bf16_tolerance=getattr(spec, "bf16_tolerance", None),
            weight_dominated=spec.weight_dominated,
            calibrate=getattr(spec, "calibrate", False),
        )
        for spec in specs
    ]
