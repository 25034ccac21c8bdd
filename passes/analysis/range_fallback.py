"""Range fallback: run in BF16, not FP32, the Tensor Core ops that only FP16's range keeps out of FP16.

Runs after painting, before cast placement, in FP16 conversions of ONNX models with
``--range-fallback bf16`` (or ``scaled``, for what scaling cannot hold) and of FX graphs with
``range_fallback="bf16"`` (their default). BF16 has FP32's exponent range and FP16's Tensor Core speed on Ampere and
later GPUs (sm_80+), where FP32 GEMMs run at TF32's half speed or worse. Which vertices, from data
(never the reasons' text):

- pinned DENY by a rule in :data:`~amp_compiler.core.plan.RANGE_ONLY_RULES` (a constant beyond FP16,
  observed or provable overflow, a flush to zero). Range rules pin only free vertices, so an op that
  needs FP32 arithmetic (HIGH in the policy: sums, norms, Exp/Log) never carries one and stays FP32;
- a Tensor Core op (the policy table's ``tensor_core``: MatMul, Gemm, Conv, ...): BF16 keeps its
  FLOPs on Tensor Cores. The other range-pinned ops (elementwise, data movement) stay FP32: BF16
  buys them no Tensor Core FLOPs and costs them 16 mantissa bits against FP32 (the catalog's
  decoder with massive activations, its residual stream in BF16: worst output error 1.4e-2 against
  5.5e-3 with it FP32 and the projections BF16; benchmarks/RESULTS.md);
- in an ONNX model, the provider has a BF16 kernel for its node (the one kernel lookup,
  :meth:`~amp_compiler.passes.analysis.coverage.KernelCoveragePass.kernel_missing`: onnxruntime's CUDA
  registry snapshot, TensorRT's type table) and its Cast converts FP16 and BF16 directly in both
  directions at the model's opset, and onnx's schema of the op takes BF16 at that opset (TensorRT's
  table lists BF16 Conv, onnx's Conv takes it from opset 22). Without them it stays FP32 under its
  range rule, its reason
  naming what is missing (``provider.no-kernel``: onnxruntime's CUDA provider has no BF16 Conv); in an
  FX graph, a matrix product or convolution (:data:`_TORCH_BF16`), not a recurrent layer;
- not tied to a Transpose by ``runtime.ort-transpose-matmul``: a Cast between the two is what
  onnxruntime crashes on.

Vertices :class:`~amp_compiler.passes.analysis.range_scaling.RangeScalingPass` scaled run in FP16
already and are left as they are.

Guarantees (checked by ``ensures``): only range-pinned Tensor Core vertices change, to BF16 with their
rule, or keep FP32 and their rule with the missing kernel named; every other decision is as painted.
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
from amp_compiler.targets import Provider

__all__ = ["RangeFallbackPass", "direct_cast_missing", "range_fallback_candidate"]

_BF16 = ir.DataType.BFLOAT16
#: Why an FX graph's range-pinned matrix products and convolutions (the Tensor Core ops with a ``gemm``
#: layout in aten_ops.toml: mm, bmm, addmm, baddbmm, linear, matmul, einsum, convolution) take BF16 with no
#: kernel table consulted: PyTorch's CUDA kernels of them (cuBLAS, cuDNN) take bfloat16, on BF16 Tensor
#: Cores from sm_80 on. Recurrent layers (lstm, gru: no ``gemm`` layout) stay FP32.
_TORCH_BF16 = "range fallback: FP32's range at FP16's Tensor Core speed; PyTorch's CUDA kernels take BF16 from sm_80 on"


def direct_cast_missing(coverage: KernelCoverage, opset: int) -> str | None:
    """Why the provider cannot Cast FP16 <-> BF16 directly at this opset (None: it can)."""
    sig = schemas.lookup("", "Cast", opset)
    since = sig.since_version if sig is not None else opset
    for a, b in (("float16", "bfloat16"), ("bfloat16", "float16")):
        if not coverage.supports("", "Cast", since, [("T1", (a,)), ("T2", (b,))]):
            return f"the {SHORT_NAMES[coverage.provider]} provider's Cast-{since} does not convert {a} to {b}"
    return None


def _schema_missing(vertex: Vertex, opsets) -> str | None:
    """Why onnx's schema of the vertex's node takes no BF16 at the model's opset (Conv before opset 22:
    TensorRT's table would take it, the ONNX file could not hold it), or None."""
    node = vertex.node
    if node is None:
        return None
    domain = node.domain or ""
    if not schemas.is_onnx_domain(domain):
        return None
    opset = opsets.get("", opsets.get("ai.onnx", 1))
    sig = schemas.lookup(domain, node.op_type, opset)
    if sig is None:
        return None
    for allowed in sig.allowed.values():
        if "tensor(float)" in allowed and "tensor(bfloat16)" not in allowed:
            return f"onnx's {node.op_type}-{sig.since_version} (the model's opset {opset}) takes no bfloat16"
    return None


def range_fallback_candidate(vertex: Vertex, plan: PrecisionPlan) -> bool:
    """A Tensor Core op decided FP32 only because a range rule pinned it, and not run in FP16 on scaled
    operands already (:class:`~amp_compiler.passes.analysis.range_scaling.RangeScalingPass`)."""
    return (
        vertex.id not in plan.scalings
        and plan.roles[vertex.id] is Role.DENY and plan.role_rules[vertex.id][0] in RANGE_ONLY_RULES
        and plan.decisions[vertex.id].dtype is ir.DataType.FLOAT
        and vertex.policy is not None and vertex.policy.tensor_core
    )


@dataclasses.dataclass
class RangeFallbackPass(AnalysisPass):
    """BF16 for the Tensor Core ops only FP16's range keeps out of FP16 (see the module docstring)."""

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
            return range_fallback_candidate(v, before) and now.rule is then.rule and now.dtype in (
                _BF16, ir.DataType.FLOAT)

        ensure_all(self, graph.vertices, kept_or_fallback, "changed, though it is no range-pinned Tensor Core op")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        candidates = [v for v in graph.vertices if range_fallback_candidate(v, plan)]
        if candidates and not isinstance(graph.model, ir.Model):  # an FX graph: PyTorch's kernels
            for vertex in candidates:
                rule, reason = plan.role_rules[vertex.id]
                if vertex.policy is None or vertex.policy.gemm is None:  # a recurrent layer: no known BF16 kernel
                    continue
                plan.decide(vertex.id, _BF16, rule, f"BF16 instead of FP32 ({_TORCH_BF16}); {reason}")
            return
        coverage = self.coverage if self.coverage is not None else coverage_for(self.provider)
        if coverage is None or not candidates:
            return
        opset = graph.model.opset_imports.get("", graph.model.opset_imports.get("ai.onnx", 1))
        cast_missing = direct_cast_missing(coverage, opset)
        lookup = KernelCoveragePass(self.provider, coverage)
        tied = {v.id for v in graph.vertices if plan.role_rules[v.id][0] is Rule.RUNTIME_TRANSPOSE_MATMUL}
        for vertex in candidates:
            vid = vertex.id
            rule, reason = plan.role_rules[vid]
            if tied & (set(graph.digraph.pred[vid]) | set(graph.digraph.succ[vid])):
                continue  # a Cast between a tied Transpose and its MatMul crashes onnxruntime
            missing = cast_missing or _schema_missing(vertex, graph.model.opset_imports)
            if missing is None:
                found = lookup.kernel_missing(graph, vertex, "bfloat16")
                missing = None if found is None else f"{found[0]} ({found[1]})"
            if missing is not None:
                no_kernel = Rule.PROVIDER_NO_KERNEL.value
                plan.decide(vid, ir.DataType.FLOAT, rule, f"{reason}; not BF16 either ({no_kernel}: {missing})")
                continue
            plan.decide(
                vid, _BF16, rule,
                f"BF16 instead of FP32 (range fallback: FP32's range at FP16's Tensor Core speed); {reason}",
            )
