"""Checks a converted model must pass: validity, and accuracy against the FP32 model.

Used by the tests after every conversion, and by benchmarks. :func:`run_onnxruntime` runs in this
process by default (the test suite's and benchmarks' own models); pass it a
:class:`~amp_compiler.runtime.runner.ChildRunner` for a model you do not trust.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx.shape_inference

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.tensor_error import accuracy
from amp_compiler.onnx.load.foreign_ops import check_against_onnxruntime, for_onnx_checker, foreign_ops
from amp_compiler.runtime.runner import InProcessRunner, Runner

__all__ = ["compare", "run_onnxruntime", "validate"]


def validate(model: onnx.ModelProto, *, converted_from: onnx.ModelProto | None = None) -> None:
    """Raise if the model fails onnx's full checker or strict shape inference, or an op onnx does not
    define breaks onnxruntime's schema of it. onnx checks what it knows: the ops onnxruntime
    registers in onnx's domains are moved out of them for onnx's part
    (:mod:`amp_compiler.onnx.load.foreign_ops`). ``converted_from``: the model ``model`` was converted
    from; a fault it has too, with the same message (a wrong value_info it described), is its own
    and passes."""
    try:
        _validate(model)
    except Exception as exc:
        if converted_from is None:
            raise
        try:
            _validate(converted_from)
        except Exception as original:
            if str(original) == str(exc):
                return
        raise


def _validate(model: onnx.ModelProto) -> None:
    found = foreign_ops(model)
    check_against_onnxruntime(found, "model")
    checked = for_onnx_checker(model, found)
    onnx.checker.check_model(checked, full_check=True)
    onnx.shape_inference.infer_shapes(checked, check_type=True, strict_mode=True, data_prop=True)


def run_onnxruntime(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, runner: Runner | None = None,
    disabled: Sequence[str] = (),
) -> list[np.ndarray]:
    """Outputs of ``model`` on onnxruntime's CPU provider, in graph-output order. ``runner``: where
    it runs (default: in this process, without limits: for trusted models only); ``disabled``:
    onnxruntime optimizers turned off (a conversion's ``load_check_skips``: what only the CPU
    provider, standing in for the one the model is for, would crash on)."""
    session = (runner or InProcessRunner()).load(model, disabled=disabled)
    try:
        return session.run(feeds)
    finally:
        session.close()


def compare(name: str, reference: np.ndarray, got: np.ndarray) -> OutputAccuracy:
    """Accuracy of one float output against its FP32 reference
    (:func:`amp_compiler.core.tensor_error.accuracy`)."""
    return accuracy(name, [reference], [got])
