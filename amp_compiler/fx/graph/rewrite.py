"""FP32 graph rewrites that run before the precision analysis (each keeps the FP32 results).

- :func:`functionalize_inplace`: ``aten.op_(x, ...)`` becomes ``aten.op(x, ...)`` where that cannot
  change what anything reads, so casts can be placed around it freely;
- :func:`fold_batchnorm` (inference only): an eval-mode batch norm that is a convolution's only user
  is folded into the convolution's weight and bias, in FP32. ``torch.onnx.export`` does the same, so
  the ONNX path sees the folded graph; folding also avoids rounding the convolution's output to low
  precision before the normalisation subtracts its mean (a cancellation that costs BF16 accuracy);
- :func:`own_written_state` (inference only): the parameters and buffers the graph writes (an EMA,
  a call counter, a cache) become the GraphModule's own copies, so running it leaves the model as it was.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
import torch.fx as fx

from amp_compiler.fx.graph.policy import op_name

__all__ = ["Folded", "fold_batchnorm", "functionalize_inplace", "own_written_state", "written_state"]

aten = torch.ops.aten
_CONVS = {aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.convolution.default}


def _aliases_input(node: fx.Node) -> bool:
    """True when the tensor ``node`` produces may share memory with another tensor (a view)."""
    if node.op != "call_function":
        return True
    if node.target is operator.getitem:
        source = node.args[0]
        return _aliases_input(source) if isinstance(source, fx.Node) else True
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return True
    return any(r.alias_info is not None for r in target._schema.returns)


def functionalize_inplace(gm: fx.GraphModule) -> int:
    """Replace ``aten.op_(x, ...)`` by ``aten.op(x, ...)`` where ``x`` is a fresh intermediate tensor
    (not a view, input, parameter or buffer) that nothing reads after the op. Returns the count."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    count = 0
    for node in nodes:
        name = op_name(node.target) if node.op == "call_function" else None
        if name is None or not name.endswith("_") or name.endswith("__"):
            continue
        schema = node.target._schema
        written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if len(written) != 1 or written[0].name != "self" or not node.args:
            continue
        packet = getattr(aten, name[:-1], None)
        functional = getattr(packet, node.target._overloadname, None) if packet is not None else None
        if functional is None:
            continue
        if [a.name for a in functional._schema.arguments] != [a.name for a in schema.arguments]:
            continue
        x = node.args[0]
        if not isinstance(x, fx.Node) or _aliases_input(x):
            continue
        if any(order[u] > order[node] for u in x.users if u is not node):
            continue
        node.target = functional
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


@dataclasses.dataclass
class Folded:
    conv: str  # the convolution node that absorbed the batch norm
    batch_norm: str


def _attr(gm: fx.GraphModule, node) -> torch.Tensor | None:
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    obj: Any = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.Tensor) and obj.dtype == torch.float32 else None


def _batch_norm_args(node: fx.Node):
    """(input, weight, bias, mean, var, eps, output node) of an eval-mode batch norm, else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.batch_norm.default:
        x, w, b, mean, var, training, _momentum, eps = node.args[:8]
        return None if training else (x, w, b, mean, var, eps, node)
    if node.target is aten._native_batch_norm_legit_no_training.default:
        x, w, b, mean, var, _momentum, eps = node.args[:7]
        users = list(node.users)
        if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
            return (x, w, b, mean, var, eps, users[0])
    return None


def fold_batchnorm(gm: fx.GraphModule) -> list[Folded]:
    """Fold eval-mode batch norms into the convolutions that feed only them (FP32 arithmetic)."""
    folded: list[Folded] = []
    replaced: set[str] = set()  # attributes the folded nodes read
    graph = gm.graph
    for node in list(graph.nodes):
        found = _batch_norm_args(node)
        if found is None:
            continue
        x, w, b, mean, var, eps, out = found
        if not isinstance(x, fx.Node) or x.op != "call_function" or x.target not in _CONVS:
            continue
        if len(x.users) != 1 or x.kwargs:
            continue
        if x.target is aten.convolution.default and x.args[6]:
            continue  # transposed: the output channels are the weight's second axis
        conv_w, conv_b = _attr(gm, x.args[1]), _attr(gm, x.args[2] if len(x.args) > 2 else None)
        mean_t, var_t = _attr(gm, mean), _attr(gm, var)
        gamma = _attr(gm, w) if w is not None else None
        beta = _attr(gm, b) if b is not None else None
        if conv_w is None or mean_t is None or var_t is None:
            continue
        if (w is not None and gamma is None) or (b is not None and beta is None):
            continue
        if len(x.args) > 2 and x.args[2] is not None and conv_b is None:
            continue
        with torch.no_grad():
            scale = torch.rsqrt(var_t.double() + eps)
            if gamma is not None:
                scale = scale * gamma.double()
            conv_bias = conv_b.double() if conv_b is not None else torch.zeros_like(mean_t, dtype=torch.float64)
            bias = conv_bias - mean_t.double()
            bias = bias * scale + (beta.double() if beta is not None else 0.0)
            new_w = (conv_w.double() * scale.reshape(-1, *([1] * (conv_w.dim() - 1)))).float()
            new_b = bias.float()
        base = f"_amp_folded_{x.name}"
        gm.register_buffer(f"{base}_weight", new_w)
        gm.register_buffer(f"{base}_bias", new_b)
        with graph.inserting_before(x):
            w_node = graph.get_attr(f"{base}_weight")
            b_node = graph.get_attr(f"{base}_bias")
        w_node.meta["val"], b_node.meta["val"] = new_w, new_b  # refreshed by the fake-tensor check
        replaced.update(str(n.target) for n in (x.args[1], x.args[2] if len(x.args) > 2 else None, w, b, mean, var)
                        if isinstance(n, fx.Node))
        args = list(x.args)
        while len(args) < 3:
            args.append(None)
        args[1], args[2] = w_node, b_node
        x.args = tuple(args)
        out.replace_all_uses_with(x)
        for dead in (out, node):
            if dead in graph.nodes and not dead.users:
                graph.erase_node(dead)
        folded.append(Folded(x.name, node.name))
    if folded:
        _drop_unused_attributes(gm, replaced)
        graph.lint()
        gm.recompile()
    return folded


def _drop_unused_attributes(gm: fx.GraphModule, names: set[str]) -> None:
    """Remove the attributes ``names`` (and their get_attr nodes) where nothing reads them any more."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "get_attr" and str(node.target) in names and not node.users:
            graph.erase_node(node)
    used = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    named = list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False))
    used_tensors = {id(t) for name, t in named if name in used}
    for name, t in named:
        if name not in names or name in used or id(t) in used_tensors:
            continue
        *path, leaf = name.split(".")
        module = gm.get_submodule(".".join(path)) if path else gm
        module._parameters.pop(leaf, None)
        module._buffers.pop(leaf, None)


def _root_attribute(node: object) -> str | None:
    """The parameter or buffer ``node``'s tensor is (or is a view of), following views and in-place
    ops back to their ``self``; None for anything else (an input, a fresh tensor)."""
    while isinstance(node, fx.Node):
        if node.op == "get_attr":
            return str(node.target)
        if node.op != "call_function" or not node.args:
            return None
        if node.target is not operator.getitem and not (
            isinstance(node.target, torch._ops.OpOverload)
            and any(r.alias_info is not None for r in node.target._schema.returns)
        ):
            return None  # a fresh tensor
        node = node.args[0]
    return None


def written_state(gm: fx.GraphModule) -> set[str]:
    """The names of the parameters and buffers an op of ``gm`` writes (a schema argument marked
    ``Tensor(a!)``: ``add_``, ``copy_``, ``index_put_`` ...), directly or through a view of them."""
    written: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for i, arg in enumerate(node.target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            for item in value if isinstance(value, (list, tuple)) else (value,):
                root = _root_attribute(item)
                if root is not None:
                    written.add(root)
    return written


def own_written_state(gm: fx.GraphModule) -> list[str]:
    """Give ``gm`` its own copy of every parameter and buffer it writes (:func:`written_state`), shared
    by all the names that held the same tensor; the rest stays shared with the captured model, which
    nothing in the graph writes. Returns the names copied.

    ``ExportedProgram.module()`` aliases the model's tensors: a ``calls`` buffer incremented in
    ``forward`` read 5 in the caller's model after 5 calls of the converted module."""
    names = written_state(gm)
    if not names:
        return []
    named = list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False))
    written_ids = {id(t) for name, t in named if name in names}
    copies: dict[int, torch.Tensor] = {}
    copied = []
    for name, t in named:
        if id(t) not in written_ids:
            continue
        if id(t) not in copies:
            clone = t.detach().clone()
            copies[id(t)] = torch.nn.Parameter(clone, t.requires_grad) if isinstance(t, torch.nn.Parameter) else clone
        *path, leaf = name.split(".")
        module = gm.get_submodule(".".join(path)) if path else gm
        copy = copies[id(t)]
        if isinstance(copy, torch.nn.Parameter):
            module._parameters[leaf] = copy
        else:
            module._buffers[leaf] = copy
        copied.append(name)
    return sorted(copied)
