"""Ops onnx does not define, checked against onnxruntime's schemas: the checker's work for them.

onnx's checker checks every node of onnx's own domains against onnx's schemas and refuses an op it
has no schema for ("No Op registered for SimplifiedLayerNormalization with domain_version of 22"),
while it passes over ops of other domains (``com.microsoft``) unchecked. onnxruntime registers more
ops, some of them in onnx's default domain (onnxruntime-genai's model builder and onnxruntime's
transformer optimizer put SimplifiedLayerNormalization there), and runs such models. So:

- every node whose op onnx does not define is checked here against onnxruntime's schema when
  onnxruntime registers the op, in whatever domain the model puts it: input and output counts,
  required inputs present, attributes known, required and of the declared type (what onnx's
  ``check_node`` does with a schema). onnxruntime is imported only when the model has such a node;
- onnx's checker then runs on a copy in which the nodes of onnx's domains that onnxruntime
  registers are moved to a domain of their own (:data:`MOVED_DOMAIN`), so that its structural checks
  (names, topological order, graphs, tensors) still run on the whole model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.proto_walk import model_graphs, subgraphs
from amp_compiler.onnx.load.text import node_label, quote
from amp_compiler.policy import schemas
from amp_compiler.policy.schemas import is_onnx_domain

__all__ = ["ForeignOps", "MOVED_DOMAIN", "check_against_onnxruntime", "for_onnx_checker", "foreign_ops"]

#: Where the copy for onnx's checker puts the ops of onnx's domains that only onnxruntime defines.
MOVED_DOMAIN = "amp_compiler.onnxruntime_registered"


@dataclasses.dataclass(frozen=True)
class ForeignOps:
    """The nodes of a model whose op onnx does not define: (position in :func:`_graph_nodes`'s walk,
    node, opset of its domain) for each."""

    nodes: tuple[tuple[int, onnx.NodeProto, int], ...]

    def registered_in_onnx_domains(self) -> set[int]:
        """The positions of those in onnx's own domains (which onnx's checker refuses) that
        onnxruntime registers."""
        return {
            k for k, node, opset in self.nodes
            if _domain(node.domain) in schemas.ONNX_DOMAINS
            and schemas.ort_schema(node.domain, node.op_type, opset) is not None
        }


def _domain(domain: str) -> str:
    return "" if is_onnx_domain(domain) else domain


def _graph_nodes(model: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, dict[str, int]]]:
    """Every node of the model's graphs and function bodies, with the opset imports that apply to it."""
    opsets = {_domain(o.domain): o.version for o in model.opset_import}
    for graph in model_graphs(model):
        for node in graph.node:
            yield node, opsets
    for fn in model.functions:
        fn_opsets = {**opsets, **{_domain(o.domain): o.version for o in fn.opset_import}}
        stack = list(fn.node)
        while stack:
            node = stack.pop()
            yield node, fn_opsets
            for sub in subgraphs(node):
                stack.extend(sub.node)


def foreign_ops(model: onnx.ModelProto) -> ForeignOps:
    """The nodes of ``model`` whose op onnx does not define at the model's opset (model-local
    functions excepted: a call to one is not an op)."""
    functions = {(fn.domain, fn.name) for fn in model.functions}
    known: dict[tuple[str, str, int], bool] = {}
    found = []
    for k, (node, opsets) in enumerate(_graph_nodes(model)):
        if not isinstance(node.op_type, str) or not isinstance(node.domain, str):
            continue  # not UTF-8: check_model_contents refuses the model for it
        domain = _domain(node.domain)
        if (node.domain, node.op_type) in functions:
            continue
        opset = opsets.get(domain, 1)
        key = (domain, node.op_type, opset)
        defined = known.get(key)
        if defined is None:
            defined = known[key] = schemas.onnx_knows(domain, node.op_type, opset)
        if not defined:
            found.append((k, node, opset))
    return ForeignOps(tuple(found))


def check_against_onnxruntime(found: ForeignOps, origin: str) -> None:
    """Raise :class:`ModelLoadError` for a node that breaks onnxruntime's schema of its op. Ops that
    onnxruntime does not register either are left alone (onnx's checker refuses those of onnx's
    domains; other domains' are custom ops)."""
    for k, node, opset in found.nodes:
        schema = schemas.ort_schema(node.domain, node.op_type, opset)
        if schema is not None:
            problem = _schema_problem(node, schema)
            if problem:
                op = f"{node.domain or 'ai.onnx'}::{node.op_type}"
                raise ModelLoadError(
                    f"{origin}: invalid ONNX model: {node_label(node, k)}: {problem} (onnxruntime's schema of {op})"
                )


def _schema_problem(node: onnx.NodeProto, schema) -> str | None:
    """What is wrong with ``node`` against an onnxruntime ``schema`` (None: nothing)."""
    inputs = len(node.input)
    while inputs and not node.input[inputs - 1]:
        inputs -= 1  # trailing optional inputs left out
    if not schema.min_input <= inputs <= schema.max_input:
        return f"{inputs} inputs, the op takes {_count(schema.min_input, schema.max_input)}"
    if not schema.min_output <= len(node.output) <= schema.max_output:
        return f"{len(node.output)} outputs, the op has {_count(schema.min_output, schema.max_output)}"
    single = schema.FormalParameterOption.Single
    for i, formal in enumerate(schema.inputs[:inputs]):
        if formal.option == single and not node.input[i]:
            return f"its required input {i} ({formal.name}) is missing"
    declared = schema.attributes
    for attr in node.attribute:
        spec = declared.get(attr.name)
        if spec is None:
            return f"unknown attribute {quote(attr.name)}"
        if attr.type and int(attr.type) != int(spec.type):
            kind = onnx.AttributeProto.AttributeType.Name(attr.type)
            return f"attribute {quote(attr.name)} is {kind}, not {spec.type.name}"
    given = {attr.name for attr in node.attribute}
    missing = sorted(name for name, spec in declared.items() if spec.required and name not in given)
    if missing:
        return f"required attribute {quote(missing[0])} is missing"
    return None


def _count(low: int, high: int) -> str:
    if low == high:
        return str(low)
    return f"{low} or more" if high >= 2**31 - 1 else f"{low} to {high}"


def for_onnx_checker(model: onnx.ModelProto, found: ForeignOps) -> onnx.ModelProto:
    """``model`` as onnx's checker should see it: a copy whose nodes in onnx's domains that
    onnxruntime registers are in :data:`MOVED_DOMAIN` (``model`` itself when there are none)."""
    moved = found.registered_in_onnx_domains()
    if not moved:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for k, (node, _) in enumerate(_graph_nodes(copy)):
        if k in moved:
            node.domain = MOVED_DOMAIN
    copy.opset_import.append(onnx.helper.make_opsetid(MOVED_DOMAIN, 1))
    for fn in copy.functions:
        fn.opset_import.append(onnx.helper.make_opsetid(MOVED_DOMAIN, 1))
    return copy
