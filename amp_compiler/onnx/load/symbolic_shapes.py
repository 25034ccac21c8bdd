"""Shapes onnx's shape inference cannot give, from onnxruntime's symbolic shape inference: for estimates.

onnx's inference gives no shape to the outputs of ops it has no schema for (``com.microsoft``'s
Attention, SkipLayerNormalization, ...) nor to what follows them, and the cost model then counts
those tensors as empty. onnxruntime's symbolic shape inference knows its own ops. Its results feed
estimates only (the bytes a Cast moves in placement, a report's FLOPs and bytes) and are never
written into a converted model: some of them are wrong (GroupQueryAttention's ``present_*`` get the
past length, not the total).

It runs step by step rather than through ``SymbolicShapeInference.infer_shapes``, which writes a
model file into the current directory when it cannot infer everything; its log lines are kept off
the user's terminal. onnxruntime (and sympy) are imported only here, when it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator

import onnx

from amp_compiler import runtime

__all__ = ["TensorInfo", "symbolic_infos"]

_LOGGER = "onnxruntime.tools.symbolic_shape_infer"


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """What symbolic inference found for one tensor: its element type (0: unknown) and its dims (a
    size, a symbol's name, or None; no dims at all when it found no shape)."""

    elem_type: int
    dims: tuple[int | str | None, ...] | None

    def elements(self) -> int | None:
        """Number of elements with unknown dims counted as 1, as the cost model counts them (None
        without a shape)."""
        if self.dims is None:
            return None
        count = 1
        for d in self.dims:
            count *= d if isinstance(d, int) and d > 0 else 1
        return count


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return dim.dim_value
    return dim.dim_param or None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No log lines from the tool (its warnings would otherwise reach stderr through logging's
    last-resort handler)."""
    logger = logging.getLogger(_LOGGER)
    handler = logging.NullHandler()
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def symbolic_infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    """Per tensor name of the main graph, what onnxruntime's symbolic shape inference found (empty
    when it cannot run on this model, or sympy is missing)."""
    runtime.onnxruntime("infer the shapes of ops that onnx does not define")
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:  # sympy is missing
        return {}
    inference = SymbolicShapeInference(2**31 - 1, True, True, 0)  # int_max, auto_merge, guess_output_rank
    try:
        with _quiet():
            inference._preprocess(model)
            while inference.run_:
                inference._infer_impl()
    except Exception:  # noqa: BLE001 - a tool that cannot handle this model gives no estimates
        return {}
    out = {}
    for name, info in inference.known_vi_.items():
        if not info.type.HasField("tensor_type"):
            continue
        tensor = info.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(_dim(d) for d in tensor.shape.dim)
        out[name] = TensorInfo(tensor.elem_type, dims)
    return out
