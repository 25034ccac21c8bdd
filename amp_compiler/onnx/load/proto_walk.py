"""Walking a ModelProto: every graph and subgraph, every tensor that can hold data."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import onnx

from amp_compiler.onnx.load import native_checks

__all__ = ["iter_model_tensors", "iter_proto_graphs", "model_graphs", "subgraphs", "tagged_tensors"]

iter_proto_graphs = native_checks.iter_proto_graphs  # defined there: the child process uses it too


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node holds in its attributes (If branches, Loop and Scan bodies), not their subgraphs."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def model_graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """Every graph of the model: the main graph, training graphs, and their subgraphs."""
    if model.HasField("graph"):
        yield from iter_proto_graphs(model.graph)
    for info in model.training_info:
        for g in (info.initialization, info.algorithm):
            yield from iter_proto_graphs(g)


def _attribute_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            for sparse in attr.sparse_tensors:
                yield sparse.values
                yield sparse.indices


def iter_model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto that can hold data: initializers (dense and sparse) and tensor attributes,
    in every graph, subgraph and function body."""
    for tensor, _ in tagged_tensors(model):
        yield tensor


def tagged_tensors(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, bool]]:
    """:func:`iter_model_tensors` in the same order, each with True for the dense initializers of the
    main graph and its subgraphs (the tensors deferred loading may leave on disk)."""
    def graph_tensors(g: onnx.GraphProto, in_main: bool) -> Iterator[tuple[onnx.TensorProto, bool]]:
        for tensor in g.initializer:
            yield tensor, in_main
        for sparse in g.sparse_initializer:
            yield sparse.values, False
            yield sparse.indices, False
        for tensor in _attribute_tensors(g.node):
            yield tensor, False

    if model.HasField("graph"):  # the graphs of model_graphs, in its order
        for g in iter_proto_graphs(model.graph):
            yield from graph_tensors(g, True)
    for info in model.training_info:
        for top in (info.initialization, info.algorithm):
            for g in iter_proto_graphs(top):
                yield from graph_tensors(g, False)
    for fn in model.functions:
        for tensor in _attribute_tensors(fn.node):
            yield tensor, False
        for node in fn.node:
            for sub in subgraphs(node):
                for g in iter_proto_graphs(sub):
                    for tensor in g.initializer:
                        yield tensor, False
                    for tensor in _attribute_tensors(g.node):
                        yield tensor, False
