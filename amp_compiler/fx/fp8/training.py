"""``target="fp8"`` for training: Transformer Engine's recipe as a rewrite of the captured training graph.

    captured training graph (FP32) -> the GEMMs of weights (linear, mm, addmm, matmul with a 2-D
    parameter) -> the FP16 training pipeline (fx/convert.transform) -> those GEMMs call
    fx/fp8_scaling.fp8_train_gemm, reading the FP32 master weight and the delayed-scaling buffers

Guarantees: every rewritten GEMM reads its FP32 master parameter directly (quantized to E4M3 each
step with its delayed scale; its gradient is FP32), its input as the FP16 graph holds it, its bias
through the FP16 graph's cast; the casts of weights nothing else reads leave the graph. Products of
two activations (attention) stay FP16, as in TE's recipe, and so do the ops the policy table says
are not lowered to the FP8 GEMM; their decisions say so (``fp8.kept-fp16``).
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from amp_compiler.core.decision import NodeDecision
from amp_compiler.core.fp8_numbers import Fp8Format
from amp_compiler.core.plan import Rule
from amp_compiler.fx.fp8.candidates import FALLBACK, gemm_operands
from amp_compiler.fx.fp8.inference import redecide, table_kept
from amp_compiler.fx.fp8.scaling import (
    HISTORY_BUFFER,
    SCALE_BUFFER,
    DelayedScaling,
    DelayedScalingState,
    ScaledTensor,
    fp8_train_gemm,
)
from amp_compiler.fx.graph.arguments import schema_argument
from amp_compiler.fx.graph.flops import graph_flops
from amp_compiler.fx.graph.lower import CAST, short
from amp_compiler.fx.graph.pipeline import REPORT_KEY, refresh_meta
from amp_compiler.fx.graph.policy import AtenPolicy
from amp_compiler.fx.graph.report import FxReport
from amp_compiler.fx.graph.views import tensor_dtype
from amp_compiler.targets import Target

__all__ = ["TrainingGemm", "rewrite_training", "training_gemms", "training_report"]

_ACTIVATIONS = ("Transformer Engine's recipe puts the GEMMs of weights (linear layers) in FP8; a product of two "
                "activations (attention) stays in the fallback precision (FP16)")


@dataclasses.dataclass(frozen=True)
class TrainingGemm:
    node: fx.Node
    a_arg: str
    b_arg: str
    bias_arg: str | None
    transposed: bool


def training_gemms(gm: fx.GraphModule, policy: AtenPolicy, exclude: set[fx.Node]) -> tuple[list[TrainingGemm],
                                                                                             list[fx.Node]]:
    """In the FP32 training graph: the GEMMs of an activation with a 2-D parameter (to rewrite), and
    the other GEMMs that could take FP8 (products of activations, kept FP16)."""
    weights, others = [], []
    for node in gm.graph.nodes:
        found = gemm_operands(node, policy) if node not in exclude else None
        if found is None:
            continue
        info, a, b = found
        assert info.fp8_operands is not None
        if a.op != "get_attr" and b.op == "get_attr" and b.meta["val"].ndim == 2:
            weights.append(TrainingGemm(node, *info.fp8_operands, info.fp8_bias, info.fp8_transposed))
        else:
            others.append(node)
    return weights, others


def rewrite_training(gm: fx.GraphModule, gemms: list[TrainingGemm], recipe: DelayedScaling) -> DelayedScalingState:
    """After the FP16 training pipeline: the GEMMs that compute in FP16 call the FP8 training GEMM
    (see module doc); the state holds their three columns each."""
    graph = gm.graph
    chosen = [g for g in gemms if tensor_dtype(g.node) == FALLBACK]
    columns = [ScaledTensor(g.node.name, role, fmt) for g in chosen
               for role, fmt in (("input", Fp8Format.E4M3), ("weight", Fp8Format.E4M3),
                                 ("grad_output", recipe.grad_format))]
    state = DelayedScalingState(gm, recipe, columns)
    if not chosen:
        return state
    with graph.inserting_before(next(iter(graph.nodes))):
        scale, history = graph.get_attr(SCALE_BUFFER), graph.get_attr(HISTORY_BUFFER)
    for k, g in enumerate(chosen):
        node = g.node
        a = schema_argument(node, g.a_arg)[1]
        b = schema_argument(node, g.b_arg)[1]
        master = b.args[0] if b.op == "call_function" and b.target is CAST else b
        bias = schema_argument(node, g.bias_arg)[1] if g.bias_arg else None
        node.target = fp8_train_gemm
        node.args = (a, master, bias, scale, history)
        node.kwargs = {"columns": (3 * k, 3 * k + 1, 3 * k + 2), "b_transposed": g.transposed,
                       "grad_format": recipe.grad_format.value, "out_dtype": FALLBACK}
        if b is not master and not b.users:
            graph.erase_node(b)
    graph.lint()
    gm.recompile()
    refresh_meta(gm)
    return state


def _gemm_reason(node: fx.Node, recipe: DelayedScaling) -> str:
    grad = recipe.grad_format.name
    history = (f"the max amax of the last {recipe.amax_history_len} steps" if recipe.amax_compute_algo == "max"
               else "the previous step's amax")
    return (f"FP8 training GEMM (Transformer Engine's delayed scaling, {recipe.fp8_format}): input and FP32 master "
            f"weight quantized to E4M3, the output's gradient to {grad}, each with a per-tensor scale from {history} "
            f"times 2^{recipe.margin} over the format's max; FP32 accumulation; the weight's gradient is FP32")


def training_report(gm: fx.GraphModule, base: FxReport, state: DelayedScalingState, others: list[fx.Node],
                    policy: AtenPolicy) -> FxReport:
    """The FP16 training pipeline's report of ``gm`` with the FP8 rewrite's decisions."""
    old = {d.node: d for d in base.decisions}
    rewritten = {c.gemm for c in state.columns}
    kept = {n.name for n in others}
    out: list[NodeDecision] = []
    for node in gm.graph.nodes:
        d = old.get(node.name)
        if node.name in rewritten:
            d = redecide(node, d, op_type="amp_compiler.fx.fp8_train_gemm", precision="fp8",
                         rule=Rule.FP8_GEMM.value, reason=_gemm_reason(node, state.recipe))
        elif node.op == "get_attr" and str(node.target) in (SCALE_BUFFER, HISTORY_BUFFER):
            d = redecide(node, d, op_type="get_attr", domain="fx", precision="fp32", rule=Rule.CONSTANT.value,
                         reason="delayed-scaling state of the FP8 GEMMs (FP32 buffer: amax history [steps, "
                                "tensors] or the scales), updated after every step")
        elif d is not None and d.precision == short(FALLBACK) and node.name in kept:
            d = redecide(node, d, rule=Rule.FP8_KEPT.value, reason=f"{d.reason}; {_ACTIVATIONS}")
        elif d is not None and d.precision == short(FALLBACK) and (why := table_kept(node, policy)):
            d = redecide(node, d, rule=Rule.FP8_KEPT.value, reason=f"{d.reason}; {why}")
        else:
            d = redecide(node, d)
        out.append(d)
    report = dataclasses.replace(base, target=Target.FP8.value, decisions=out,
                                 flops=graph_flops(gm, policy, gemms=(fp8_train_gemm,)))
    gm.meta[REPORT_KEY] = report
    return report

