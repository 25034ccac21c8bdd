"""Classify: give every vertex its painting role from the policy table and the user's overrides.

Guarantees (checked by ``ensures``): every vertex gets exactly one role and a rule id with a reason.
Fixed vertices (dtype cannot change), and only they, are FIXED; user-blocked ops and nodes are DENY;
HIGH ops are DENY, except ``arithmetic`` HIGH ops whose kernel on the target provider computes in
FP32 inside, which are INFER (they take low-precision inputs and outputs when their neighbours do);
LOW ops are ALLOW, except recurrent ones (LSTM, GRU, RNN) for BF16, which are DENY: a recurrence
carries its state through every step and BF16's 8-bit significand compounds over them (a 3-layer
LSTM speaker encoder over 160 frames, with trained-like long memory: embedding cosine 0.9988 in
BF16, 0.99999 in FP16; its state alone in FP32 still gives 0.9993, BF16 weights change the
dynamics, and ONNX's LSTM keeps weights, inputs and state in one type anyway); FOLLOW is INFER;
PASS is CLEAR.

Precedence, highest first: fixed by the schema or the model > user ``block_nodes`` > user
``block_ops`` > the policy table (nodes pinned by ``--tolerance`` are FIXED later, by
:mod:`amp_compiler.passes.analysis.pins`, where the policy made them free).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.errors import OptionError
from amp_compiler.passes.analysis.base import AnalysisPass, ensure, ensure_all, require
from amp_compiler.policy import Category, Sensitivity
from amp_compiler.targets import Provider, Target


def compile_patterns(patterns: Iterable[str], option: str = "block_nodes") -> tuple[re.Pattern, ...]:
    """The regular expressions of a node-name option (``option``: its API keyword); an invalid one is
    an :class:`OptionError`."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise OptionError(f"invalid regular expression {p!r}: {exc}", option=option) from None
    return tuple(out)


@dataclasses.dataclass
class ClassifyPass(AnalysisPass):
    provider: Provider = Provider.CUDA
    block_ops: frozenset[str] = frozenset()
    block_nodes: tuple[re.Pattern, ...] = ()

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        unknown = set(graph.unknown_ops)
        for vertex in graph.vertices:
            role, rule, reason = self._classify(vertex, vertex.node in unknown, graph.target)
            plan.set_role(vertex.id, role, rule, reason)

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require(not plan.roles, self, "the plan has roles already: classification runs first")

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure(set(plan.roles) == {v.id for v in graph.vertices}, self, "not every vertex (only) has a role")
        ensure_all(
            self, graph.vertices,
            lambda v: isinstance(plan.roles[v.id], Role) and isinstance(plan.role_rules[v.id][0], Rule)
            and bool(plan.role_rules[v.id][1]),
            "has no role, rule id or reason",
        )
        ensure_all(
            self, graph.vertices, lambda v: (plan.roles[v.id] is Role.FIXED) == (not v.free),
            "is FIXED while its dtype is free, or not FIXED while it is fixed",
        )

    def _classify(self, vertex: Vertex, unknown_op: bool, target: Target) -> tuple[Role, Rule, str]:
        node = vertex.node
        if not vertex.free:
            rule = Rule.UNKNOWN_OP if unknown_op else Rule.UNKNOWN_TYPE if vertex.untyped else Rule.FIXED
            return Role.FIXED, rule, f"keeps its dtype: {vertex.fixed_reason}"
        if node is not None:
            for pattern in self.block_nodes:
                if pattern.search(node.name or ""):
                    return Role.DENY, Rule.USER_BLOCK_NODE, f"FP32: node name matches --block-node {pattern.pattern!r}"
            if node.op_type in self.block_ops:
                return Role.DENY, Rule.USER_BLOCK_OP, f"FP32: user --block-op {node.op_type}"
        policy = vertex.policy
        category = vertex.category
        if policy is None and node is not None and category is Category.HIGH:
            return Role.DENY, Rule.UNKNOWN_OP, f"FP32: {node.op_type} is not in the policy table"
        reason = policy.reason if policy is not None else "precision neutral"
        op = node.op_type if node is not None else "graph I/O"
        if category is Category.LOW and policy is not None and policy.recurrent and target is Target.BF16:
            return (
                Role.DENY, Rule.POLICY_BF16_RECURRENCE,
                f"FP32 for BF16: {op} carries its state through every step, and BF16's 8-bit significand "
                "compounds over them (a 3-layer LSTM encoder: embedding cosine 0.9988 in BF16, 0.99999 in FP16)",
            )
        if category is Category.LOW:
            return Role.ALLOW, Rule.POLICY_LOW, f"LOW: {op}: {reason}"
        if category is Category.HIGH:
            if policy is not None and policy.sensitivity is Sensitivity.ARITHMETIC:
                if policy.accumulates_fp32_on(self.provider):
                    return (
                        Role.INFER,
                        Rule.POLICY_FP32_INSIDE,
                        f"follows its neighbours: {op}'s {self.provider.value} kernel computes in "
                        f"FP32 inside ({policy.fp32_inside[self.provider.value]})",
                    )
                return Role.DENY, Rule.POLICY_HIGH_ARITHMETIC, f"HIGH: {op}: {reason}"
            return Role.DENY, Rule.POLICY_HIGH_RANGE, f"HIGH: {op} is range-sensitive: {reason}"
        if category is Category.FOLLOW:
            return Role.INFER, Rule.POLICY_FOLLOW, f"FOLLOW: {op}: {reason}"
        return Role.CLEAR, Rule.POLICY_PASS, f"PASS: {op}: {reason}"
