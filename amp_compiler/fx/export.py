"""The ONNX export of a converted GraphModule, at an opset whose schemas accept its low-precision types.

``torch.onnx.export`` writes what the graph computes at the opset it is asked for, valid or not: a
BF16 convolution at opset 18 is a model the checker and onnxruntime refuse (ONNX's Conv, LSTM, GRU,
RNN and a few others take bf16 only from opset 22). :func:`export_onnx` exports, reads every node's
input types against its schema, and either exports again at the first opset where all of them are
accepted (when no opset was asked for) or refuses an explicit opset that is too low with one error
naming the ops. The result passes onnx's full checker.

onnxruntime's CPU provider has almost no BF16 kernels (no BF16 Conv at any opset): run a BF16 export
on the CUDA provider, or on a CPU through :func:`amp_compiler.onnx.measure.emulate.emulate_bf16`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Any

import onnx
import onnx.shape_inference
import onnx_ir as ir
import torch.fx as fx

from amp_compiler.dtypes import schema_type
from amp_compiler.errors import OptionError
from amp_compiler.policy import schemas

__all__ = ["export_onnx"]

DEFAULT_OPSET = 18
LATEST_OPSET = onnx.defs.onnx_opset_version()


def export_onnx(
    gm: fx.GraphModule, example_inputs: tuple, *, opset: int | None = None, **kwargs: Any
) -> onnx.ModelProto:
    """``gm`` (e.g. from :func:`amp_compiler.fx.convert`) exported with ``torch.onnx.export(dynamo=True)``
    at ``opset`` (default: 18, or the first opset that accepts the graph's types); ``kwargs`` go to
    ``torch.onnx.export``. Raises :class:`OptionError` (``option="opset"``) for an opset too low for
    the graph's types."""
    report = getattr(gm, "meta", {}).get("amp_compiler")
    if report is not None and report.target == "fp8":
        raise OptionError(
            "an FP8 GraphModule does not export to ONNX (its FP8 GEMMs are Python calls); export the FP32 "
            "model and convert it with amp-compiler convert --target fp8", option="target",
        )
    first = opset or DEFAULT_OPSET
    proto = _export(gm, example_inputs, first, kwargs)
    needs = _too_old(proto, first)
    if needs:
        needed = max(needs.values())
        ops = ", ".join(f"{op} (opset {v})" for op, v in sorted(needs.items()))
        if opset is not None:
            raise OptionError(
                f"opset {opset} has no schema for the low-precision types of {ops}: export at opset {needed} "
                "or later", option="opset",
            )
        proto = _export(gm, example_inputs, needed, kwargs)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _export(gm: fx.GraphModule, example_inputs: tuple, opset: int, kwargs: dict) -> onnx.ModelProto:
    import torch

    quiet = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(gm, example_inputs, dynamo=True, opset_version=opset, **kwargs)
    finally:
        quiet.setLevel(level)
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    return program.model_proto


def _too_old(model: onnx.ModelProto, opset: int) -> dict[str, int]:
    """Per default-domain op type whose schema at ``opset`` refuses an input type the model gives it,
    the first opset whose schema accepts them all (ops no opset accepts are left to the checker)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.value_info, *g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    needs: dict[str, int] = {}
    for node in g.node:
        if not schemas.is_onnx_domain(node.domain):
            continue
        given = [(i, schema_type(ir.DataType(types[x]))) for i, x in enumerate(node.input) if types.get(x)]
        for version in range(opset, LATEST_OPSET + 1):
            sig = schemas.lookup("", node.op_type, version)
            if sig is None or all(_accepts(sig, i, t) for i, t in given):
                if version > opset:
                    needs[node.op_type] = max(needs.get(node.op_type, 0), version)
                break
    return needs


def _accepts(sig: schemas.OpSignature, index: int, type_str: str) -> bool:
    allowed = sig.allowed_types(True, index)
    return not allowed or type_str in allowed
