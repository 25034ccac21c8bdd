"""Classify: give every vertex its painting role from the policy table and the user's overrides.

Guarantees (checked by ``ensures``): every vertex gets exactly one role and a rule id with a reason.
Fixed vertices (dtype cannot change), and only they, are FIXED; user-blocked ops and nodes are DENY;
user-allowed ops and nodes are ALLOW (rule ``user.allow``, its reason saying it was forced and what
the policy would have decided); HIGH ops are DENY, except ``arithmetic`` HIGH ops whose kernel on
the target provider computes in FP32 inside, which are INFER (they take low-precision inputs and
outputs when their neighbours do);
LOW ops are ALLOW, except recurrent ones (LSTM, GRU, RNN) for BF16, which are DENY: a recurrence
carries its state through every step and BF16's 8-bit significand compounds over them (a 3-layer
LSTM speaker encoder over 160 frames, with trained-like long memory: embedding cosine 0.9988 in
BF16, 0.99999 in FP16; its state alone in FP32 still gives 0.9993, BF16 weights change the
dynamics, and ONNX's LSTM keeps weights, inputs and state in one type anyway); FOLLOW is INFER;
PASS is CLEAR.

Precedence, highest first: fixed by the schema or the model > user ``block_nodes`` > user
``allow_nodes`` > user ``block_ops`` > user ``allow_ops`` > the policy table. Node names beat op
types (the narrower choice wins); between two node patterns, or an op both blocked and allowed
(refused by :func:`amp_compiler.options.check_allow_ops`), FP32 wins. Nodes pinned by
``--tolerance`` are FIXED later, by :mod:`amp_compiler.passes.analysis.pins`, where the policy made
them free (never a user-allowed one).

A user-allowed vertex overrides judgements, not facts. Later passes leave it low where they judge
accuracy (signal paths, quantized islands, ``--tolerance``; painting and placement never move an
ALLOW vertex), and keep it FP32 where low precision cannot run or cannot hold the values: no kernel
on the provider, a pattern onnxruntime crashes on, a constant beyond the target's range, ranges
stated or observed beyond it. :func:`user_allowed` is what those passes ask.
Ops no table knows keep their types (``policy.unknown-op``), or take the one the user declared for
them (``custom_op_precision``: FIXED at it, rule ``user.custom-op-precision``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Container, Iterable
from typing import NamedTuple

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.errors import OptionError
from amp_compiler.passes.analysis.base import AnalysisPass, ensure, ensure_all, require
from amp_compiler.policy import Category, Sensitivity
from amp_compiler.policy.kernels import runs_on
from amp_compiler.targets import Provider, Target

__all__ = ["PINNABLE", "ClassifyPass", "UserChoices", "compile_patterns", "ensure_pinned", "pinnable", "user_allowed"]

_USER_RULES = frozenset({Rule.USER_BLOCK_NODE, Rule.USER_BLOCK_OP, Rule.USER_ALLOW})


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


class UserChoice(NamedTuple):
    """What one of the user's options decides for a node: its role and rule, the option as typed
    (``--allow-op Softmax``), and whether it matched the node's name (else its op type)."""

    role: Role
    rule: Rule
    option: str
    by_name: bool


@dataclasses.dataclass(frozen=True)
class UserChoices:
    """The user's overrides of the policy: ops and node-name patterns blocked (FP32) or allowed (low
    precision), and which one decides a node (the module doc's precedence)."""

    block_ops: frozenset[str] = frozenset()
    block_nodes: tuple[re.Pattern, ...] = ()
    allow_ops: frozenset[str] = frozenset()
    allow_nodes: tuple[re.Pattern, ...] = ()

    def choice(self, op_type: str, name: str) -> UserChoice | None:
        """The option that decides a node (``name`` searched by the patterns), or None."""
        for pattern in self.block_nodes:
            if pattern.search(name):
                return UserChoice(Role.DENY, Rule.USER_BLOCK_NODE, f"--block-node {pattern.pattern!r}", True)
        for pattern in self.allow_nodes:
            if pattern.search(name):
                return UserChoice(Role.ALLOW, Rule.USER_ALLOW, f"--allow-node {pattern.pattern!r}", True)
        if op_type in self.block_ops:
            return UserChoice(Role.DENY, Rule.USER_BLOCK_OP, f"--block-op {op_type}", False)
        if op_type in self.allow_ops:
            return UserChoice(Role.ALLOW, Rule.USER_ALLOW, f"--allow-op {op_type}", False)
        return None

    def allows(self, op_type: str, name: str) -> bool:
        """Whether the user's choices force the node low (an allow option decides it)."""
        found = self.choice(op_type, name)
        return found is not None and found.rule is Rule.USER_ALLOW


def user_allowed(plan: PrecisionPlan, vid: int) -> bool:
    """Whether vertex ``vid`` is ALLOW by the user's ``--allow-op``/``--allow-node`` (passes that
    judge accuracy leave it low)."""
    return plan.roles.get(vid) is Role.ALLOW and plan.role_rules[vid][0] is Rule.USER_ALLOW


#: The roles a pass that keeps vertices FP32 for accuracy may pin: free, not yet denied or fixed.
PINNABLE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})


def pinnable(plan: PrecisionPlan, vid: int) -> bool:
    """Whether such a pass may pin vertex ``vid``: its role is :data:`PINNABLE` and the user did not force it low."""
    return plan.roles[vid] in PINNABLE and not user_allowed(plan, vid)


def ensure_pinned(pass_: AnalysisPass, graph: PrecisionGraph, plan: PrecisionPlan, found: Container[int],
                  what: str) -> None:
    """``pass_``'s postcondition: no vertex of ``found`` is left :func:`pinnable` (each one ``what``)."""
    ensure_all(pass_, graph.vertices, lambda v: v.id not in found or not pinnable(plan, v.id),
               f"{what} but was left free")


@dataclasses.dataclass
class ClassifyPass(AnalysisPass):
    provider: Provider = Provider.CUDA
    block_ops: frozenset[str] = frozenset()
    block_nodes: tuple[re.Pattern, ...] = ()
    allow_ops: frozenset[str] = frozenset()
    allow_nodes: tuple[re.Pattern, ...] = ()

    @property
    def user(self) -> UserChoices:
        return UserChoices(self.block_ops, self.block_nodes, self.allow_ops, self.allow_nodes)

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        unknown, declared = set(graph.unknown_ops), graph.declared_ops
        user = self.user
        for vertex in graph.vertices:
            if vertex.node in declared and vertex.dtype == declared[vertex.node]:
                plan.set_role(vertex.id, Role.FIXED, Rule.USER_CUSTOM_OP, f"{vertex.fixed_reason}")
                continue
            role, rule, reason = self._classify(vertex, vertex.node in unknown, graph.target, user)
            plan.set_role(vertex.id, role, rule, reason)
            if rule is Rule.POLICY_FP32_INSIDE and vertex.policy is not None:
                runs = self._runs_on(vertex)
                plan.fp32_inside[vertex.id] = vertex.policy.fp32_inside[runs.value] + self._elsewhere(runs)

    def _elsewhere(self, runs: Provider) -> str:
        """What a reason adds when the op's kernel is not the target provider's own."""
        if runs is self.provider:
            return ""
        return f"; TensorRT does not import it: onnxruntime's {runs.value} provider runs it"

    def _runs_on(self, vertex: Vertex) -> Provider:
        """The provider whose kernel runs the vertex's op: TensorRT does not import onnxruntime's
        contrib ops, which its onnxruntime provider runs on CUDA."""
        node = vertex.node
        return runs_on(self.provider, node.domain, node.op_type) if node is not None else self.provider

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
        user = self.user

        def as_the_user_chose(v: Vertex) -> bool:
            found = user.choice(v.node.op_type, v.node.name or "") if v.free and v.node is not None else None
            return (found is None and plan.role_rules[v.id][0] not in _USER_RULES) or (
                found is not None and (plan.roles[v.id], plan.role_rules[v.id][0]) == (found.role, found.rule))

        ensure_all(self, graph.vertices, as_the_user_chose, "does not have the role the user's options give it")

    def _classify(self, vertex: Vertex, unknown_op: bool, target: Target, user: UserChoices) -> tuple[Role, Rule, str]:
        node = vertex.node
        if not vertex.free:
            rule = Rule.UNKNOWN_OP if unknown_op else Rule.UNKNOWN_TYPE if vertex.untyped else Rule.FIXED
            return Role.FIXED, rule, f"keeps its dtype: {vertex.fixed_reason}"
        found = user.choice(node.op_type, node.name or "") if node is not None else None
        if found is None:
            return self._policy(vertex, target)
        how = f"node name matches {found.option}" if found.by_name else f"user {found.option}"
        if found.role is Role.DENY:
            return found.role, found.rule, f"FP32: {how}"
        without = self._policy(vertex, target)[2]
        return found.role, found.rule, f"{target.value.upper()}: forced low, {how} (without it: {without})"

    def _policy(self, vertex: Vertex, target: Target) -> tuple[Role, Rule, str]:
        """What the policy table decides for a free vertex."""
        node = vertex.node
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
                runs = self._runs_on(vertex)
                if policy.accumulates_fp32_on(runs):
                    return (
                        Role.INFER,
                        Rule.POLICY_FP32_INSIDE,
                        f"follows its neighbours: {op}'s {runs.value} kernel computes in "
                        f"FP32 inside ({policy.fp32_inside[runs.value]}{self._elsewhere(runs)})",
                    )
                return Role.DENY, Rule.POLICY_HIGH_ARITHMETIC, f"HIGH: {op}: {reason}"
            return Role.DENY, Rule.POLICY_HIGH_RANGE, f"HIGH: {op} is range-sensitive: {reason}"
        if category is Category.FOLLOW:
            return Role.INFER, Rule.POLICY_FOLLOW, f"FOLLOW: {op}: {reason}"
        return Role.CLEAR, Rule.POLICY_PASS, f"PASS: {op}: {reason}"
