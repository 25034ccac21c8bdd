"""The FP32 model a default conversion's range probe runs (:mod:`amp_compiler.onnx.measure.range_probe`): its
weights in memory, or why the probe is skipped; and that model reduced to its outputs once the probe ran."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import onnx

from amp_compiler.errors import OptionError
from amp_compiler.onnx.fp8.steps import weights_in_memory
from amp_compiler.onnx.measure.range_probe import PROBE_MAX_NODES, PROBE_MAX_WEIGHT_BYTES
from amp_compiler.sizes import format_bytes

__all__ = ["model_to_probe", "outputs_only"]


def model_to_probe(
    proto: onnx.ModelProto, origin: str, locations: Mapping[str, Path] | None,
) -> tuple[onnx.ModelProto | None, str]:
    """The FP32 model the probe runs (weights in memory), or None and why it is skipped: onnxruntime
    missing, more than :data:`PROBE_MAX_NODES` nodes, or weights over :data:`PROBE_MAX_WEIGHT_BYTES`
    (they stay on disk for the conversion)."""
    from amp_compiler import runtime

    if not runtime.is_installed():
        return None, f"onnxruntime is not installed; {runtime.INSTALL_HINT}"
    if len(proto.graph.node) > PROBE_MAX_NODES:
        nodes = len(proto.graph.node)
        return None, (f"the graph has {nodes:,} nodes, more than the {PROBE_MAX_NODES:,} the probe runs on (past "
                      "them it takes minutes): pass --calibration-data to observe its ranges and measure its error")
    if not locations:
        return proto, ""
    size = sum(Path(f).stat().st_size for f in set(locations.values()))
    try:
        in_memory = weights_in_memory(proto, origin) if size <= PROBE_MAX_WEIGHT_BYTES else None
    except OptionError:
        in_memory = None
    if in_memory is None or in_memory.ByteSize() > PROBE_MAX_WEIGHT_BYTES:
        return None, (f"its weights take more than {format_bytes(PROBE_MAX_WEIGHT_BYTES)}: pass --calibration-data "
                      "to observe its ranges")
    return in_memory, ""


def outputs_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` reduced to its graph outputs: what the conversion's measure reads of an FP32 model whose
    outputs the probe kept. The weights' in-memory copy the probe ran (:func:`model_to_probe`) is then freed before
    the written model is emulated and loaded: on a 673 MB model (weights inside its file, read lazily)
    the process tree's peak fell from 4.0 GB to 3.4 GB (``benchmarks.probe_cost``)."""
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.graph.output.extend(model.graph.output)
    return light
