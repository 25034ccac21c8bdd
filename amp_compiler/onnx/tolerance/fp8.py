"""FP8 for ``--tolerance``: a switch per FP8 candidate on the probe, feeding its GEMM FP8 values.

With ``--target fp8 --tolerance T`` the refinement (:mod:`amp_compiler.onnx.tolerance.refine`) chooses per unit
among FP32, the fallback (FP16 or BF16) and FP8. The probe (:mod:`amp_compiler.onnx.tolerance.probe`) is
made of the fallback conversion; a unit whose Tensor Core op is an FP8 candidate (its local
statistics allow FP8 inputs: :func:`amp_compiler.onnx.fp8.steps.local_choice`) gets one more switch here: when
it is on, the GEMM reads each data input through exactly the converted model's Q/DQ arithmetic
(:func:`amp_compiler.onnx.fp8.stats.fp8_view`: an activation's value in the fallback type quantized with
its calibration scale, a weight quantized from its FP32 values per output channel), instead of what
it read before.

Guarantees: the probe is changed only at the tagged candidate GEMMs' data inputs (a ``Where`` on the
switch, a bool graph input), and with every FP8 switch off it computes what it computed before; the candidates' FP32
weights are read once (the copy the probe's rounding switches keep, or one added here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import onnx
import onnx.helper as oh

from amp_compiler.onnx.fp8.stats import fp8_view
from amp_compiler.onnx.tolerance.probe import TAG, exact_name, switch_name
from amp_compiler.passes.onnx.qdq import Fp8Candidate


def add_fp8_switches(
    probe: onnx.ModelProto, candidates: Mapping[int, Fp8Candidate], switches: Mapping[int, int]
) -> onnx.ModelProto:
    """A copy of ``probe`` where each node tagged with a position in ``candidates`` reads its data
    inputs through a ``Where`` on switch ``switches[position]`` between their FP8 view and what it
    read (see module doc)."""
    out = onnx.ModelProto()
    out.CopyFrom(probe)
    graph = out.graph
    initializers = {t.name for t in graph.initializer}
    nodes = []
    for node in graph.node:
        tags = [e for e in node.metadata_props if e.key == TAG]
        position = int(tags[0].value) if tags else None
        for entry in tags:
            node.metadata_props.remove(entry)
        if position is None or position not in candidates:
            nodes.append(node)
            continue
        for inp in candidates[position].inputs:
            source = inp
            if inp.weight is not None:  # quantized from the FP32 weight, not the probe's rounded one
                source = dataclasses.replace(inp, name=exact_name(inp.name))
                if source.name not in initializers:
                    graph.initializer.append(onnx.numpy_helper.from_array(inp.weight, source.name))
                    initializers.add(source.name)
            view = fp8_view(source, f"tolfp8_{position}_{inp.index}_")
            nodes += view.nodes
            graph.initializer.extend(view.initializers)
            chosen = f"tolfp8_{position}_{inp.index}_in"
            nodes.append(oh.make_node("Where", [switch_name(switches[position]), view.fp8, node.input[inp.index]],
                                      [chosen]))
            node.input[inp.index] = chosen
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    declared = {i.name for i in graph.input}
    graph.input.extend(oh.make_tensor_value_info(switch_name(k), onnx.TensorProto.BOOL, [])
                       for k in sorted(set(switches.values())) if switch_name(k) not in declared)
    return out
