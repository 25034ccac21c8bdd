"""Accuracy of a variant: on the device against FP32 on the same device, and as amp-compiler's CPU
emulator predicts it (``amp_compiler.onnx.measure.emulate``: every FP16/BF16 tensor rounded as the
device stores it, against FP32 on onnxruntime's CPU provider), and how far the two runs are apart.

Each figure is the worst float output: the lowest cosine and the largest max error as a share of the
reference output's range (``amp_compiler.onnx.measure.checks.compare``); ``nonfinite`` when an output
has a NaN or Inf where the reference is finite. Outputs are matched by position (every variant keeps
the FP32 model's outputs and their order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from benchmarks.gpu.rows import Accuracy

__all__ = ["emulated_outputs", "worst"]


def worst(reference: list[np.ndarray], got: list[np.ndarray]) -> Accuracy:
    """The worst float output of ``got`` against ``reference`` (upcast to FP32 first)."""
    from amp_compiler.onnx.measure.checks import compare

    if len(reference) != len(got):
        raise ValueError(f"{len(got)} outputs where the reference has {len(reference)}")
    accs = [compare(str(i), np.asarray(r, np.float32), np.asarray(g, np.float32))
            for i, (r, g) in enumerate(zip(reference, got)) if np.asarray(r).dtype.kind == "f"]
    finite = [a for a in accs if a.finite]
    nonfinite = len(finite) < len(accs)
    return Accuracy(
        cosine=None if nonfinite or not finite else min(a.cosine for a in finite),
        error_of_range=None if nonfinite or not finite else max(a.error_of_range for a in finite),
        nonfinite=nonfinite,
        outputs=len(accs),
    )


def emulated_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of the model at ``path`` with its low-precision storage emulated exactly, on
    onnxruntime's CPU provider at its basic optimisation level (what ``emulate`` asks for FP8 Q/DQ
    graphs; the same for every graph, so the figures compare)."""
    from amp_compiler.onnx.measure.emulate import emulate
    from amp_compiler.runtime.runner import InProcessRunner

    model = emulate(onnx.load(str(path)))
    session = InProcessRunner().load(model, basic=True)
    try:
        return session.run({k: _as_float32(v) for k, v in feeds.items()})
    finally:
        session.close()


def _as_float32(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32) if array.dtype.kind == "f" else array
