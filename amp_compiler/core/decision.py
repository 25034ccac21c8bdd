"""The decision per node, as both frontends return it: its precision, the rule that decided it, and why.

The ONNX conversion builds them from the plan and the lowered model
(:func:`amp_compiler.onnx.write.decisions.node_decisions`), the FX path from the plan and the
converted graph (:mod:`amp_compiler.fx.graph.report`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from amp_compiler.core.plan import Rule

__all__ = ["NodeDecision", "untyped_message", "untyped_nodes"]


@dataclasses.dataclass(slots=True)  # no __dict__: a conversion makes one per node
class NodeDecision:
    """The precision decided for one node, and why."""

    graph: str  # "main" or the path of the subgraph ("If_0/then_branch")
    node: str
    op_type: str
    domain: str
    precision: str  # "fp16", "bf16", "fp32", "mixed", or "none" for nodes without float data
    rule: str  # stable rule id, e.g. "policy.low"
    reason: str
    input_dtypes: list[str]
    output_dtypes: list[str]
    index: int | None = None  # position in the input model's node order; None for inserted Casts


_UNTYPED_RULES = frozenset({Rule.UNKNOWN_TYPE.value, Rule.UNKNOWN_OP.value})


def untyped_nodes(decisions: Iterable[NodeDecision]) -> tuple[str, ...]:
    """The nodes left as they are because an element type of theirs is still unknown after shape
    inference and the schemas (a tensor of a custom op onnxruntime does not know either, and what
    follows it): ``"name (op_type)"`` for each, in order."""
    return tuple(
        f"{d.node or '?'} ({d.op_type})" for d in decisions
        if d.rule in _UNTYPED_RULES and ("?" in d.input_dtypes or "?" in d.output_dtypes)
    )


def untyped_message(untyped: Sequence[str]) -> str:
    """One line about the nodes of :func:`untyped_nodes`."""
    shown = ", ".join(untyped[:3]) + (", ..." if len(untyped) > 3 else "")
    return (
        f"{len(untyped)} node(s) left as they are because the element type of a tensor of theirs is "
        f"unknown (neither shape inference nor an op schema gives it): {shown}"
    )
