"""Lower the chosen FP8 GEMMs into an FX graph that the fallback (FP16) pipeline has converted.

Guarantees, for every chosen candidate whose node computes in FP16 after that pipeline:
- the node calls :func:`~amp_compiler.fx.fp8.numerics.fp8_gemm` (its name, users and output dtype
  kept): FP8 operands, their FP32 scales, the bias as the FP16 graph holds it;
- an activation operand is read through one new :func:`~amp_compiler.fx.fp8.numerics.quantize` node
  (E4M3, its calibration scale, a buffer of the module);
- a weight operand is an E4M3 buffer of the module (the second operand stored [N, K]) with its FP32
  scale buffer; the weight it replaces, and casts of it, leave the graph and the module when nothing
  else reads them (tied weights read elsewhere stay);
- nothing else changes; a candidate whose node is not FP16 there is left as it is (``skipped``).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from amp_compiler.fx.fp8.candidates import FALLBACK, Candidate, Operand
from amp_compiler.fx.fp8.numerics import fp8_gemm, quantize
from amp_compiler.fx.graph.arguments import schema_argument
from amp_compiler.fx.graph.lower import CAST
from amp_compiler.fx.graph.views import tensor_dtype

__all__ = ["Fp8Lowering", "lower_fp8"]


@dataclasses.dataclass
class Fp8Lowering:
    """What :func:`lower_fp8` made: nodes it rewrote or added, and what it removed."""

    gemms: dict[fx.Node, Candidate] = dataclasses.field(default_factory=dict)
    quantizers: dict[fx.Node, tuple[Candidate, Operand]] = dataclasses.field(default_factory=dict)
    weights: dict[fx.Node, tuple[Candidate, Operand]] = dataclasses.field(default_factory=dict)
    scales: dict[fx.Node, tuple[Candidate, Operand]] = dataclasses.field(default_factory=dict)
    removed_attrs: list[str] = dataclasses.field(default_factory=list)
    skipped: list[Candidate] = dataclasses.field(default_factory=list)


def _buffer(gm: fx.GraphModule, name: str, value: torch.Tensor, before: fx.Node) -> fx.Node:
    gm.register_buffer(name, value)
    with gm.graph.inserting_before(before):
        return gm.graph.get_attr(name)


def _attr_names(gm: fx.GraphModule, tensor: torch.Tensor) -> set[str]:
    named = list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False))
    return {name for name, t in named if t is tensor}


def _delete_attr(gm: fx.GraphModule, name: str) -> None:
    *path, leaf = name.split(".")
    module = gm.get_submodule(".".join(path)) if path else gm
    delattr(module, leaf)


def _remove_unused(gm: fx.GraphModule, nodes: list[fx.Node], lowering: Fp8Lowering) -> None:
    """Erase the nodes among ``nodes`` (and the casts and weights they read) that nothing reads now;
    delete a module attribute that no ``get_attr`` node reads any more under any of its names."""
    graph = gm.graph
    todo = list(nodes)
    gone: list[str] = []
    while todo:
        node = todo.pop()
        if node.graph is not graph or node.users:
            continue
        if node.op == "get_attr":
            gone.append(str(node.target))
            graph.erase_node(node)
        elif node.op == "call_function" and node.target is CAST:
            todo.extend(a for a in node.args if isinstance(a, fx.Node))
            graph.erase_node(node)
    read = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    for target in gone:
        try:
            tensor = gm.get_parameter(target) if target in dict(gm.named_parameters()) else gm.get_buffer(target)
        except AttributeError:
            continue
        names = _attr_names(gm, tensor) | {target}
        if not names & read:
            for name in sorted(names):
                _delete_attr(gm, name)
                lowering.removed_attrs.append(name)


def lower_fp8(gm: fx.GraphModule, chosen: list[Candidate]) -> Fp8Lowering:
    """Rewrite the chosen candidates' nodes of ``gm`` (see module doc)."""
    graph = gm.graph
    lowering = Fp8Lowering()
    for cand in chosen:
        node = cand.node
        if node.graph is not graph or tensor_dtype(node) != FALLBACK:
            lowering.skipped.append(cand)
            continue
        old = [schema_argument(node, op.arg)[1] for op in cand.operands]
        bias = schema_argument(node, cand.bias_arg)[1] if cand.bias_arg else None
        ins: list[fx.Node] = []
        for op, current in zip(cand.operands, old, strict=True):
            tag = f"fp8_{node.name}_{op.arg}"
            scale = _buffer(gm, f"{tag}_scale", op.scale.detach().clone(), node)
            lowering.scales[scale] = (cand, op)
            if op.quantized is not None:  # a weight
                q = _buffer(gm, tag, op.quantized, node)
                lowering.weights[q] = (cand, op)
            else:
                with graph.inserting_before(node):
                    q = graph.create_node("call_function", quantize, (current, scale), name=f"{tag}_quantize")
                lowering.quantizers[q] = (cand, op)
            ins += [q, scale]
        b_transposed = cand.operands[1].is_weight or cand.transposed
        node.target = fp8_gemm
        node.args = (*ins, bias)
        node.kwargs = {"b_transposed": b_transposed, "out_dtype": FALLBACK}
        lowering.gemms[node] = cand
        _remove_unused(gm, [n for n in old if isinstance(n, fx.Node)], lowering)
    graph.lint()
    gm.recompile()
    return lowering
