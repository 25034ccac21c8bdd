"""Range fallback: hold in BF16, not FP32, what leaves FP16 only because FP16's range cannot hold it.

Runs after painting, before cast placement, in FP16 conversions of ONNX models with
``--range-fallback bf16``. BF16 has FP32's exponent range and FP16's Tensor Core speed on Ampere and
later GPUs (sm_80+), where FP32 GEMMs run at TF32's half speed or worse; so a node that only its
values keep out of FP16 runs in BF16. Which nodes, from the rule ids that pinned them (data, never
the reasons' text):

- a DENY vertex whose role rule is in :data:`~amp_compiler.core.plan.RANGE_ONLY_RULES` (constants
  beyond FP16, observed or provable overflow, flushes). Range rules only pin free vertices, so a
  vertex that also needs FP32 arithmetic (a HIGH op: DENY by the policy) never carries one: it stays
  FP32;
  A FOLLOW/PASS op pinned so that also reads what an arithmetic DENY op made (an Add of Exp's
  result) follows that op in FP32, as painting would have it;
- a vertex painting made FP32 downstream of such vertices alone (``plan.range_denied``: a FOLLOW op
  fed by the overflowing residual Add holds the same large values), not of an arithmetic DENY.

Each takes BF16 where the provider has a BF16 kernel for its node (the one kernel lookup,
:meth:`~amp_compiler.passes.analysis.coverage.KernelCoveragePass.kernel_missing`: onnxruntime's CUDA
registry snapshot, TensorRT's type table) and the provider's Cast converts FP16 and BF16 directly in
both directions at the model's opset; a pinned vertex without one stays FP32 under its range rule,
its reason naming the missing kernel (``provider.no-kernel``), a painted one stays as painted. A vertex tied to a
Transpose by the ``runtime.ort-transpose-matmul`` hazard stays FP32 too: a Cast between the two is
what onnxruntime crashes on.

Guarantees (checked by ``ensures``): only those vertices change; each BF16 one is range-pinned or
painted FP32 downstream of range-pinned vertices alone; every other decision is as painted.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import RANGE_ONLY_RULES, PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, require, require_roles
from amp_compiler.passes.analysis.coverage import KernelCoveragePass
from amp_compiler.policy import schemas
from amp_compiler.policy.kernels import SHORT_NAMES, KernelCoverage, coverage_for
from amp_compiler.policy.table import Category
from amp_compiler.targets import Provider

__all__ = ["RangeFallbackPass", "direct_cast_missing"]

_BF16 = ir.DataType.BFLOAT16


def direct_cast_missing(coverage: KernelCoverage, opset: int) -> str | None:
    """Why the provider cannot Cast FP16 <-> BF16 directly at this opset (None: it can)."""
    sig = schemas.lookup("", "Cast", opset)
    since = sig.since_version if sig is not None else opset
    for a, b in (("float16", "bfloat16"), ("bfloat16", "float16")):
        if not coverage.supports("", "Cast", since, [("T1", (a,)), ("T2", (b,))]):
            return f"the {SHORT_NAMES[coverage.provider]} provider's Cast-{since} does not convert {a} to {b}"
    return None


@dataclasses.dataclass
class RangeFallbackPass(AnalysisPass):
    """BF16 for what only FP16's range keeps out of FP16 (see the module docstring)."""

    provider: Provider = Provider.CUDA
    coverage: KernelCoverage | None = None

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(set(plan.decisions) == {v.id for v in graph.vertices}, self, "painting must decide every vertex first")
        require(graph.target.dtype is ir.DataType.FLOAT16, self, "a range fallback is for FP16 conversions")

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        def kept_or_fallback(v: Vertex) -> bool:
            now, then = plan.decisions[v.id], before.decisions[v.id]
            if now == then:
                return True
            if not _candidate(before, v.id):
                return False
            return now.dtype is _BF16 or (now.dtype is ir.DataType.FLOAT and now.rule is then.rule)

        ensure_all(self, graph.vertices, kept_or_fallback, "changed, though no range rule alone kept it out of FP16")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        coverage = self.coverage if self.coverage is not None else coverage_for(self.provider)
        candidates = [v for v in graph.vertices if _candidate(plan, v.id)]
        if coverage is None or not candidates or not isinstance(graph.model, ir.Model):
            return
        opset = graph.model.opset_imports.get("", graph.model.opset_imports.get("ai.onnx", 1))
        cast_missing = direct_cast_missing(coverage, opset)
        lookup = KernelCoveragePass(self.provider, coverage)
        tied = {v.id for v in graph.vertices if plan.role_rules[v.id][0] is Rule.RUNTIME_TRANSPOSE_MATMUL}
        for vertex in candidates:
            vid = vertex.id
            pinned = plan.roles[vid] is Role.DENY
            rule, reason = plan.role_rules[vid] if pinned else plan.role_rules[plan.range_denied[vid]]
            near = set(graph.digraph.pred[vid]) | set(graph.digraph.succ[vid])
            if vid in tied or near & tied:
                continue  # a Cast between a tied Transpose and its MatMul crashes onnxruntime
            if pinned and _follows(vertex) and any(_arithmetic_fp32(plan, p) for p in graph.digraph.pred[vid]):
                continue  # a FOLLOW/PASS op reading what FP32 arithmetic made follows it in FP32
            missing = cast_missing
            if missing is None:
                found = lookup.kernel_missing(graph, vertex, "bfloat16")
                missing = None if found is None else f"{found[0]} ({found[1]})"
            if missing is not None:
                if pinned:
                    no_kernel = Rule.PROVIDER_NO_KERNEL.value
                    plan.decide(vid, ir.DataType.FLOAT, rule, f"{reason}; not BF16 either ({no_kernel}: {missing})")
                continue
            if pinned:
                plan.decide(
                    vid, _BF16, rule,
                    f"BF16 instead of FP32 (range fallback: FP32's range, FP16's Tensor Core speed); {reason}",
                )
            else:
                source = graph.vertices[plan.range_denied[vid]]
                plan.decide(
                    vid, _BF16, Rule.PAINT_DENY,
                    f"BF16: downstream of {source.describe()}, kept out of FP16 for its range "
                    f"({rule.value}): BF16 has FP32's range",
                )


def _follows(vertex: Vertex) -> bool:
    """Its op's precision follows its neighbours' (FOLLOW, PASS)."""
    return vertex.policy is not None and vertex.policy.category in (Category.FOLLOW, Category.PASS)


def _arithmetic_fp32(plan: PrecisionPlan, vid: int) -> bool:
    """FP32 for its arithmetic: DENY by a rule other than a range rule, or painted FP32 from one."""
    if plan.roles[vid] is Role.DENY:
        return plan.role_rules[vid][0] not in RANGE_ONLY_RULES
    return plan.decisions[vid].rule is Rule.PAINT_DENY and vid not in plan.range_denied


def _candidate(plan: PrecisionPlan, vid: int) -> bool:
    """Kept FP32 by a range rule alone: pinned by one, or painted FP32 downstream of such pins only."""
    decision = plan.decisions[vid]
    if decision.dtype is not ir.DataType.FLOAT:
        return False
    if plan.roles[vid] is Role.DENY:
        return plan.role_rules[vid][0] in RANGE_ONLY_RULES
    return decision.rule is Rule.PAINT_DENY and vid in plan.range_denied
