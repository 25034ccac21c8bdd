"""The decision per node, as both frontends return it: its precision, the rule that decided it, and why.

The ONNX conversion builds them from the plan and the lowered model
(:func:`amp_compiler.onnx.write.decisions.node_decisions`), the FX path from the plan and the
converted graph (:mod:`amp_compiler.fx.graph.report`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence

from amp_compiler.core.plan import INSERTED_RULES, RANGE_ONLY_RULES, Rule

__all__ = [
    "NodeDecision", "allow_message", "count_by_precision", "count_by_rule", "unconverted_message", "untyped_message",
    "untyped_nodes",
]


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


def count_by_rule(decisions: Iterable[NodeDecision]) -> dict[str, int]:
    """How many nodes each rule decided, in the order the rules first decide one."""
    return dict(Counter(d.rule for d in decisions))


def count_by_precision(decisions: Iterable[NodeDecision]) -> dict[str, int]:
    """How many nodes each precision was decided for, in the order the precisions first appear."""
    return dict(Counter(d.precision for d in decisions))


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


def allow_message(decisions: Iterable[NodeDecision], allowed: Iterable[int], low: str) -> str | None:
    """One line about the nodes ``--allow-op``/``--allow-node`` force into ``low`` precision (``allowed``:
    their positions): how many went low whatever the policy says, those run low only on power-of-two
    scaled operands (a range rule decided them: their values do not fit ``low``), and those that stayed
    out of it all the same (low precision cannot run them or hold their values), with their rule ids;
    None when there are none.
    Nodes without float data are left out: nothing to force."""
    picked = set(allowed)
    mine = [d for d in decisions if d.index is not None and d.index in picked and d.precision != "none"]
    if not mine:
        return None
    forced = [d for d in mine if d.rule == Rule.USER_ALLOW.value]
    # decided by a range rule yet low: run in ``low`` on power-of-two scaled operands (the range fallback)
    ranged = {rule.value for rule in RANGE_ONLY_RULES}
    scaled = [d for d in mine if d.rule in ranged and d.precision == low]
    kept = [d for d in mine if d.rule != Rule.USER_ALLOW.value and d not in scaled]

    def shown(ds: Sequence[NodeDecision], rules: bool) -> str:
        names = [_short(d.node or d.op_type) + (f": {d.rule}" if rules else "") for d in ds[:3]]
        return ", ".join(names) + (", ..." if len(ds) > 3 else "")

    text = f"--allow-op/--allow-node forced {len(forced)} node(s) into {low} whatever the policy says"
    text += f" ({shown(forced, False)})" if forced else ""
    if scaled:
        text += f"; {len(scaled)} in {low} on power-of-two scaled operands, their range beyond it "
        text += f"({shown(scaled, True)})"
    if kept:
        text += f"; {len(kept)} kept out of {low} all the same ({shown(kept, True)})"
    return text


def unconverted_message(decisions: Iterable[NodeDecision], low: str) -> str | None:
    """One line when the conversion left every node of the input as it was (none in a low-precision
    type): that it did, and the rules that kept the most nodes FP32, with their counts (an int8 model's
    ``quantized.requantize``, an audio front end's signal path), and the float64 nodes left in double
    precision; None when some node went low."""
    inserted = {rule.value for rule in INSERTED_RULES}
    own = [d for d in decisions if d.rule not in inserted and d.index is not None]
    if not own or any(d.precision in _LOW_PRECISIONS for d in own):
        return None
    kept = Counter(d.rule for d in own if d.precision == "fp32")
    causes = Counter({rule: n for rule, n in kept.items() if rule not in _CONSEQUENCES}) or kept
    rules = ", ".join(f"{rule} {n}" for rule, n in causes.most_common(3))
    # float64 nodes are left in double precision (rule fixed: "it is already double"), not kept fp32
    doubles = sum(1 for d in own if d.precision == "fp64")
    parts = ([f"nodes kept fp32 by {rules}"] if rules else []) + (
        [f"{doubles} node(s) in fp64, which the conversion leaves as they are"] if doubles else [])
    why = "; ".join(parts) or "no float computation"
    return f"no node was converted to {low}: the output computes as the input does ({why})"


#: Rules that follow from other nodes' precision (constants for their readers, painting, dtypes fixed by the
#: model): no cause of an FP32 model, left out of :func:`unconverted_message`'s rules where others are.
_CONSEQUENCES = frozenset({
    Rule.CONSTANT.value, Rule.FIXED.value, Rule.PAINT_DENY.value, Rule.PAINT_BETWEEN_LOW.value, Rule.PAINT_PASS.value,
    Rule.PAINT_DEFAULT.value, Rule.POLICY_FOLLOW.value, Rule.POLICY_PASS.value,
})
#: The precisions that count as converted ("mixed": a node with low and FP32 tensors).
_LOW_PRECISIONS = frozenset({"fp16", "bf16", "fp8", "mixed"})


def _short(name: str, limit: int = 40) -> str:
    """A node name for a one-line message: quoted, control characters escaped, long ones shortened."""
    text = repr(name)
    return text if len(text) <= limit else f"{text[: limit - 4]}...{text[-1]}"
