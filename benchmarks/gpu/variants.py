"""The variants of a model the GPU benchmark measures, and how each one's ONNX file is made.

- ``fp32``: the catalog's FP32 model, the reference;
- ``amp-fp16``, ``amp-bf16``: ``amp_compiler.convert`` for the run's provider (``--provider``);
- ``amp-fp8``: the same with ``target="fp8"``, calibrated on four samples of the entry's inputs;
- ``onnxconverter-common``: ``float16.convert_float_to_float16(keep_io_types=True)``;
- ``ort-fp16``: onnxruntime's own FP16 tooling for the model: the transformer optimizer with
  ``--float16`` (the deployment catalog's fused graphs: their cached anchor; the architectures:
  ``optimize_model`` for their model type, where it has one), or for the genai decoder
  onnxruntime-genai's builder with ``-p fp16 -e cuda``;
- ``modelopt-autocast``: NVIDIA ModelOpt AutoCast (``convert_to_mixed_precision(..., "fp16",
  keep_io_types=True)``) where ``nvidia-modelopt`` imports.

The peers run as ``benchmarks/compare.py`` and ``models/deployment.py`` run them (the same calls).
A variant that does not apply to a model raises :class:`NotApplicable`; one whose tool is missing
raises :class:`Unavailable`: both become rows that say so.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx

from benchmarks.gpu.cases import CALIBRATION_SEEDS, Case, seeded_inputs

__all__ = ["DEFAULT", "NotApplicable", "Unavailable", "produce"]

DEFAULT = ("fp32", "amp-fp16", "amp-bf16", "amp-fp8", "onnxconverter-common", "ort-fp16", "modelopt-autocast")

#: onnxruntime's transformer optimizer model type of each architecture (none: not applicable).
_MODEL_TYPES = {"bert-base": "bert", "gpt2": "gpt2", "vit-base": "vit", "t5-small-encoder": "t5",
                "t5-small-decoder": "t5"}


class NotApplicable(Exception):
    """The variant does not apply to this model (a row with status ``skipped``)."""


class Unavailable(Exception):
    """The variant's tool is not installed or does not import here (status ``unavailable``)."""


def produce(variant: str, case: Case, provider: str, folder: Path) -> tuple[Path, float, str]:
    """Write ``variant`` of ``case`` into ``folder``: (its path, the conversion's seconds, a note)."""
    if variant == "fp32":
        return case.path, 0.0, ""
    maker = _MAKERS.get(variant)
    if maker is None:
        raise NotApplicable(f"unknown variant {variant!r}")
    out = folder / f"{variant}.onnx"
    start = time.perf_counter()
    note = maker(case, provider, out)
    return out, time.perf_counter() - start, note


def _amp(target: str) -> Callable[[Case, str, Path], str]:
    def make(case: Case, provider: str, out: Path) -> str:
        from amp_compiler import convert
        from amp_compiler.runtime.runner import InProcessRunner

        samples = [seeded_inputs(case.name, s) for s in CALIBRATION_SEEDS] if target == "fp8" else None
        # The catalog's own models: the calibration runs in this (worker) process.
        result = convert(case.path, target=target, provider=provider, samples=samples, runner=InProcessRunner())
        result.save(out)
        return f"provider {provider}" + (f", {len(samples)} calibration samples" if samples else "")

    return make


def _peer(tool: str) -> Callable[[Case, str, Path], str]:
    def make(case: Case, provider: str, out: Path) -> str:
        from benchmarks.compare import convert_once, modelopt_status

        if tool == "modelopt-autocast":
            why = modelopt_status()
            if why is not None:
                raise Unavailable(f"nvidia-modelopt does not import: {why}")
        with contextlib.redirect_stdout(io.StringIO()):
            convert_once(tool, case.path, out, external=False)
        return ""

    return make


def _ort_fp16(case: Case, provider: str, out: Path) -> str:
    from models import deployment

    if case.kind == "deployment":
        spec = deployment.spec(case.name)
        anchors = spec.anchors()
        from models import catalog

        if "ort-fp16" in anchors:
            onnx.save(anchors["ort-fp16"](catalog.CACHE_DIR), str(out))
            return "onnxruntime.transformers.optimizer --float16 (the deployment catalog's anchor)"
        if "genai-cuda" in anchors:
            try:
                import onnxruntime_genai  # noqa: F401
            except ImportError as exc:
                raise Unavailable(f"onnxruntime-genai does not import: {exc}") from None
            onnx.save(anchors["genai-cuda"](catalog.CACHE_DIR), str(out))
            return "onnxruntime-genai builder -p fp16 -e cuda"
        raise NotApplicable("no onnxruntime FP16 graph for this deployment model")
    base = case.name.removesuffix("-small")
    model_type = _MODEL_TYPES.get(base)
    if model_type is None:
        raise NotApplicable("onnxruntime's transformer optimizer has no model type for it")
    from onnxruntime.transformers.optimizer import optimize_model

    from models.architectures import ARCHS

    heads, hidden = deployment.heads_hidden(next(a for a in ARCHS if a.name == case.name))
    with contextlib.redirect_stdout(io.StringIO()), tempfile.TemporaryDirectory() as tmp:
        # optimize_model writes its temporary files beside the input: work on a copy.
        src = Path(tmp) / "model.onnx"
        src.write_bytes(case.path.read_bytes())
        optimized = optimize_model(str(src), model_type=model_type, num_heads=heads, hidden_size=hidden)
        optimized.convert_float_to_float16(keep_io_types=True)
        onnx.save(optimized.model, str(out))
    return f"onnxruntime.transformers.optimizer --model_type {model_type} --float16"


_MAKERS: dict[str, Callable[[Case, str, Path], str]] = {
    "amp-fp16": _amp("fp16"),
    "amp-bf16": _amp("bf16"),
    "amp-fp8": _amp("fp8"),
    "onnxconverter-common": _peer("onnxconverter-common"),
    "modelopt-autocast": _peer("modelopt-autocast"),
    "ort-fp16": _ort_fp16,
}
