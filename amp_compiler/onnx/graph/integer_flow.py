"""What flows through an ONNX graph's integer ops: a selection's indices into an index input, a count into a float.

The precision graph holds float values only; these walks follow the integer tensors between its ops
(:func:`~amp_compiler.core.graph.index_readers`, :func:`~amp_compiler.core.graph.count_readers`), for the
routing-score pass (TopK indices picking experts) and the position-bias pass (BLOOM's Cast of
``cumsum(mask) - 1``: positions that no float vertex leads to; the Cast of an integer graph input that holds
positions, :func:`~amp_compiler.core.positions.is_position_input`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import onnx_ir as ir

from amp_compiler.core.graph import count_readers, index_readers, integer_uses_from
from amp_compiler.core.positions import is_position_input
from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.policy import OpPolicy, schemas

__all__ = ["cast_to_float", "counted_of", "index_readers_of", "position_inputs"]

Policy = Callable[[ir.Node], "OpPolicy | None"]


def _integer(value: ir.Value, bools: bool) -> bool:
    return value.dtype not in (None, *FLOAT_TYPES) and (bools or value.dtype != ir.DataType.BOOL)


def _uses(bools: bool) -> Callable[[ir.Node], Iterator[tuple[ir.Node, int]]]:
    def integer_uses(node: ir.Node) -> Iterator[tuple[ir.Node, int]]:
        return ((u.node, u.idx) for o in node.outputs if _integer(o, bools) for u in o.uses())
    return integer_uses


def index_readers_of(graphs: list[ir.Graph], policy: Policy) -> dict[ir.Node, tuple[ir.Node, int]]:
    """The selections (policy ``selects``) whose indices (integers or bools) an index input reads."""
    selections = [n for g in graphs for n in g if (p := policy(n)) is not None and p.selects]
    return index_readers(selections, _uses(True), policy) if selections else {}


def _carries(node: ir.Node, index: int, opsets: Mapping[str, int]) -> bool:
    """Whether ``node``'s input ``index`` carries its values into the output: a Cast's input, or an input of the
    schema's type parameter that the first output has (Sub's A and B, Gather's data, Unsqueeze's data; not
    Gather's indices, a Reshape's or Expand's shape, Slice's starts, what Shape or ConstantOfShape reads)."""
    if node.op_type in ("Cast", "CastLike") and schemas.is_onnx_domain(node.domain):
        return index == 0
    sig = schemas.lookup(node.domain, node.op_type, opsets.get(node.domain or "", opsets.get("ai.onnx", 1)))
    return sig is not None and bool(sig.outputs) and sig.type_key(True, index) == sig.type_key(False, 0)


def _value_uses(integers_only: bool, opsets: Mapping[str, int]) -> Callable[[ir.Node | ir.Value],
                                                                            Iterator[tuple[ir.Node, int]]]:
    """(reader, input index) per use of a graph input, or of an op's outputs, that carries its values
    (:func:`_carries`): integers only, or floats too (bools never: a comparison of positions is a mask)."""
    def uses(x: ir.Node | ir.Value) -> Iterator[tuple[ir.Node, int]]:
        outputs = [x] if isinstance(x, ir.Value) else list(x.outputs)
        return ((u.node, u.idx) for o in outputs if o.dtype != ir.DataType.BOOL
                and (_integer(o, False) or not integers_only) for u in o.uses() if _carries(u.node, u.idx, opsets))
    return uses


def cast_to_float(value: ir.Value, opsets: Mapping[str, int]) -> bool:
    """Whether an integer graph input's values reach a float: a Cast (or CastLike) to a float type reads them,
    directly or through ops carrying them (a Sub, a Gather of them, an Unsqueeze; not a Shape of them). Its range
    then decides what the float holds (positions, raw counts), as a float input's does."""
    return any(index == 0 and reader.op_type in ("Cast", "CastLike") and reader.outputs[0].dtype in FLOAT_TYPES
               for reader, index in integer_uses_from([value], _value_uses(True, opsets), lambda _: True))


def position_inputs(graph: ir.Graph, policy: Policy) -> list[ir.Value]:
    """The integer graph inputs (not bools) that hold positions
    (:func:`~amp_compiler.core.positions.is_position_input`): named like positions, or subtracted from themselves
    (``p_i - p_j``) through ops carrying their values (integer results, or float results of ops the policy calls
    linear: Cast, Unsqueeze, Mul)."""
    def through(node: ir.Node) -> bool:
        entry = policy(node)
        return (any(_integer(o, False) for o in node.outputs)
                or (entry is not None and entry.signal and any(o.dtype in FLOAT_TYPES for o in node.outputs)))

    def is_difference(node: ir.Node) -> bool:
        return node.domain in ("", "ai.onnx") and node.op_type == "Sub"

    return [v for v in graph.inputs if v.name and _integer(v, False)
            and is_position_input(v.name, v, _value_uses(False, graph.opset_imports), through, is_difference)]


def counted_of(graphs: list[ir.Graph], policy: Policy) -> frozenset[ir.Node]:
    """The ops computing a float from integers that a count (policy ``positions``: Range, CumSum) produced, or
    that an integer graph input holding positions (:func:`position_inputs`) gave."""
    counts: list[ir.Node | ir.Value] = [
        n for g in graphs for n in g
        if (p := policy(n)) is not None and p.positions and any(_integer(o, False) for o in n.outputs)]
    counts.extend(position_inputs(graphs[0], policy) if graphs else [])
    if not counts:
        return frozenset()
    return count_readers(counts, _value_uses(True, graphs[0].opset_imports), policy,
                         lambda n: any(o.dtype in FLOAT_TYPES for o in n.outputs))
