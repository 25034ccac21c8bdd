"""What flows through an FX graph's integer ops: positions counted into a float (``PrecisionGraph.counted``), a
selection's indices into an index input (``PrecisionGraph.index_readers``).

The precision graph holds float tensors only; this walk follows the integer tensors between the ATen nodes,
as :mod:`amp_compiler.onnx.graph.integer_flow` does for ONNX, for the position-bias pass
(passes/analysis/position_bias.py): the float computed from integers that a count (the table's ``positions``:
``arange``, ``cumsum`` of a mask) produced, or from an integer placeholder that holds positions
(:func:`~amp_compiler.core.positions.is_position_input`: named like ``position_ids``/``pos``, or subtracted from
itself, ``p_i - p_j``, never named like a mask). ``pos.float()`` is an ``aten.to``/``_to_copy`` whose output
vertex has no float predecessor, and ``slopes * pos`` a mixed-type ``mul``: without this the walk from the
softmax (or the attention's ``attn_mask``) found no position behind them, and painting put the bias in FP16
next to the attention products, rounding positions past 2048 to multiples of 2 and 4.

A use carries its values into the reader's result unless the reader's table entry lists that tensor argument
(numbered as :func:`~amp_compiler.fx.graph.arguments.tensor_arguments` numbers them) in ``index_inputs`` (a
gather's or an ``index``'s indices) or ``shape_inputs``; sizes are no tensors in an FX graph (``sym_size``
gives a SymInt), so a shape read of positions is no use at all.

A selection (the table's ``selects``: ``topk``, ``sort``, ``argmax``, ``max.dim``) whose indices reach an
``index_inputs`` argument (``gather``, ``index``, ``one_hot``, ``eq``) through ops on integers or bools routes: the
walk is the ONNX wing's (:func:`~amp_compiler.core.graph.index_readers`), over every use of an op's integer or bool
results, a tuple result's (``topk``'s ``.indices``) read through its ``getitem`` nodes. Without it the routing-score
pass (passes/analysis/routing.py) found nothing on FX: a DGCNN EdgeConv's Gram product and a mixture-of-experts
router ran FP16, and their top-k picked other neighbours and experts.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet

import torch
import torch.fx as fx

from amp_compiler.core.graph import count_readers, index_readers
from amp_compiler.core.positions import is_position_input
from amp_compiler.fx.graph.arguments import tensor_arguments
from amp_compiler.fx.graph.policy import AtenPolicy, policy_name
from amp_compiler.fx.graph.views import FLOAT_DTYPES, FxOp
from amp_compiler.policy import OpPolicy

__all__ = ["counted_ops", "index_readers_of", "position_placeholders"]

#: The ATen ops whose result is a relative distance when both operands carry one input's values.
_DIFFERENCES = frozenset({"sub", "rsub"})


def _dtype(node: fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _integer(node: fx.Node) -> bool:
    dtype = _dtype(node)
    return dtype is not None and dtype not in FLOAT_DTYPES and dtype != torch.bool and not dtype.is_complex


def _floats(node: fx.Node) -> bool:
    return _dtype(node) in FLOAT_DTYPES


def _indices(node: fx.Node) -> bool:
    """Integers or bools: what an index input reads (a selection's indices, a mask built from them)."""
    dtype = _dtype(node)
    return dtype is not None and dtype not in FLOAT_DTYPES and not dtype.is_complex


def _tensors(node: fx.Node) -> list[fx.Node]:
    """The tensors ``node`` gives: itself, or for a tuple result (``topk``, ``max.dim``) its ``getitem`` users."""
    if isinstance(node.meta.get("val"), (tuple, list)):
        return [u for u in node.users if u.op == "call_function" and u.target is operator.getitem]
    return [node]


class _Flow:
    """The walk's view of one graph: its ATen ops (:class:`FxOp`, as the precision graph holds them) and their
    table entries."""

    def __init__(self, policy: AtenPolicy, ops: Mapping[fx.Node, FxOp]):
        self.policy, self.ops = policy, ops

    def entry(self, op: FxOp) -> OpPolicy | None:
        return self.policy.get(policy_name(op.op_type))

    def uses(self, integers_only: bool) -> Callable[[fx.Node | FxOp], Iterator[tuple[FxOp, int]]]:
        """(reader, tensor argument index) per use of a placeholder's or an op's tensor that carries its values
        (integers only, or floats too; bools never: a comparison of positions is a mask)."""
        def uses(x: fx.Node | FxOp) -> Iterator[tuple[FxOp, int]]:
            node = x.fx if isinstance(x, FxOp) else x
            if not (_integer(node) or (not integers_only and _floats(node))):
                return
            for user in node.users:
                op = self.ops.get(user)
                entry = self.entry(op) if op is not None else None
                if op is None or entry is None:
                    continue  # not an ATen op the table knows: it keeps its dtypes
                for index, (_, arg) in enumerate(tensor_arguments(user)):
                    if arg is node and index not in entry.index_inputs and index not in entry.shape_inputs:
                        yield op, index
        return uses

    def index_uses(self, op: FxOp) -> Iterator[tuple[FxOp, int]]:
        """(reader, tensor argument index) per use of one of ``op``'s integer or bool results, every argument."""
        for tensor in _tensors(op.fx):
            if not _indices(tensor):
                continue
            for user in tensor.users:
                reader = self.ops.get(user)
                if reader is not None:
                    yield from ((reader, k) for k, (_, arg) in enumerate(tensor_arguments(user)) if arg is tensor)


def index_readers_of(policy: AtenPolicy, ops: Mapping[fx.Node, FxOp]) -> dict[FxOp, tuple[FxOp, int]]:
    """The selections (the table's ``selects``) whose indices an index input (``index_inputs``) reads, each with
    that (reader, tensor argument index); ``ops``: the graph's ATen ops by node."""
    flow = _Flow(policy, ops)
    selections = [op for op in ops.values() if (p := flow.entry(op)) is not None and p.selects]
    return index_readers(selections, flow.index_uses, flow.entry) if selections else {}


def position_placeholders(gm: fx.GraphModule, policy: AtenPolicy, ops: Mapping[fx.Node, FxOp]) -> list[fx.Node]:
    """The integer placeholders (not bools) that hold positions (:func:`~amp_compiler.core.positions.
    is_position_input`), read through integer results and float results of ops the table calls linear
    (``signal``: ``to``, ``unsqueeze``, ``mul``); ``ops``: the graph's ATen ops by node."""
    flow = _Flow(policy, ops)

    def through(op: FxOp) -> bool:
        entry = flow.entry(op)
        return _integer(op.fx) or (entry is not None and entry.signal and _floats(op.fx))

    def is_difference(op: FxOp) -> bool:
        return policy_name(op.op_type) in _DIFFERENCES

    uses = flow.uses(False)
    return [n for n in gm.graph.nodes if n.op == "placeholder" and _integer(n)
            and is_position_input(n.name, n, uses, through, is_difference)]


def counted_ops(gm: fx.GraphModule, policy: AtenPolicy, ops: Mapping[fx.Node, FxOp],
                constants: AbstractSet[fx.Node] = frozenset()) -> frozenset[FxOp]:
    """The ops computing a float from integers that a count (the table's ``positions`` with an integer result:
    ``arange``, ``cumsum``) produced, or that a placeholder holding positions (:func:`position_placeholders`)
    gave; ``ops``: the graph's ATen ops by node; ``constants``: placeholders that are parameters or buffers (a
    torch.compile graph's), never positions."""
    flow = _Flow(policy, ops)
    counts: list[fx.Node | FxOp] = [
        op for op in ops.values() if _integer(op.fx) and (p := flow.entry(op)) is not None and p.positions]
    counts.extend(n for n in position_placeholders(gm, policy, ops) if n not in constants)
    if not counts:
        return frozenset()
    return count_readers(counts, flow.uses(True), flow.entry, lambda op: _floats(op.fx))
