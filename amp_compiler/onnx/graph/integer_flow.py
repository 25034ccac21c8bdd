"""What flows through an ONNX graph's integer ops: a selection's indices into an index input, a count into a float.

The precision graph holds float values only; these walks follow the integer tensors between its ops
(:func:`~amp_compiler.core.graph.index_readers`, :func:`~amp_compiler.core.graph.count_readers`), for the
routing-score pass (TopK indices picking experts) and the position-bias pass (BLOOM's Cast of
``cumsum(mask) - 1``: positions that no float vertex leads to).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx_ir as ir

from amp_compiler.core.graph import count_readers, index_readers
from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.policy import OpPolicy

__all__ = ["counted_of", "index_readers_of"]

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


def counted_of(graphs: list[ir.Graph], policy: Policy) -> frozenset[ir.Node]:
    """The ops computing a float from integers that a count (policy ``positions``: Range, CumSum) produced."""
    counts = [n for g in graphs for n in g
              if (p := policy(n)) is not None and p.positions and any(_integer(o, False) for o in n.outputs)]
    if not counts:
        return frozenset()
    return count_readers(counts, _uses(False), policy, lambda n: any(o.dtype in FLOAT_TYPES for o in n.outputs))
