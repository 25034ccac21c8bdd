"""Threshold readers: keep FP32 what computes the input of an op that compares it with constants.

A tree ensemble (ai.onnx.ml TreeEnsemble, TreeEnsembleClassifier/Regressor) sends each row down
the branch its feature's comparison with a split threshold picks; Binarizer compares with its
threshold; LabelEncoder and OneHotEncoder match float keys exactly. These ops stay FP32 themselves
(the policy table), but when the op computing their input went FP16, what they read was FP16-rounded
all the same, and a value rounded across a threshold takes the other branch: exactly as FP16
rounding before a quantizer moves values across integer levels (``quantized.requantize``). Measured:
a MatMul feeding a TreeEnsemble that splits at 1000.3 (FP16's step there is 0.5) flipped 5 of 301
outputs, 100% of the output's range, while the range probe (inputs N(0, 1)) saw nothing; scikit-learn
PCA -> DecisionTree and PCA -> GradientBoosting pipelines changed held-out labels and predictions.

The standard comparisons (Less, LessOrEqual, Greater, GreaterOrEqual; aten's lt, le, gt, ge) read
thresholds too where their other operand is a constant holding more than one distinct value (the policy's
``thresholds_operand``): a vector of cut points, one per element it is compared with. That is how a tree compiled
to tensor ops splits (hummingbird's GEMM strategy: ``Gemm(X, one-hot feature selection) <= thresholds -> Cast ->
MatMul``; its default for shallow trees), and how bucketing and per-feature cut points are written. Measured on
held-out breast_cancer rows (exact emulation): a 20-tree RandomForest's vote shares moved 5.02% of their range
with the selection Gemm in FP16 (stated 0.027%), 0.02% with it in FP32; an IsolationForest's scores 3.6-4.1%.
A comparison with a scalar constant, or one whose values are all equal (``x > 0``, ``p > 0.5``), is a gate and is
left alone: a gate such as LeakyReLU written ``Where(x > 0, x, a*x)`` is continuous at its threshold, so a value
FP16 rounds across it moves nothing, and pinning its producer would send a Conv's or MatMul's FLOPs to FP32 for
nothing (tests/passes/analysis/test_thresholds.py checks that such a MatMul stays FP16).

So the vertex computing such an op's float input, reached upstream through precision-neutral (PASS)
ops such as Reshape, Cast or Slice, each of which is kept FP32 too, stays FP32 (DENY, rule
``threshold.input``), the op and the policy table's ``thresholds`` reason named. The producers in
such models are small (a PCA's 6x4 MatMul; a compiled tree's feature selection, [features, internal nodes]), so
little is lost: of the three Tensor Core ops of a hummingbird GEMM tree, the selection goes FP32. Equal is
no threshold reader: what a graph matches exactly against several levels is a count (the tree's path lengths,
sums of 0/1 products: exact in FP16 up to 2048), and pinning the path-count MatMul for it kept 36% of a
20-tree forest's multiply-adds FP32 and changed no output (0.024% of range either way).

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``) or another pass fixed it, is DENY with ``threshold.input``; nothing else changes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.policy import Category

__all__ = ["ThresholdInputPass", "threshold_inputs"]


def _reads_thresholds(graph: PrecisionGraph, vertex: Vertex) -> bool:
    """An op comparing with thresholds: its attributes (a tree ensemble), or, for a ``thresholds_operand`` op (Less,
    Greater...), a constant operand holding more than one distinct value; a scalar or all-equal one is a gate."""
    if vertex.node is None or vertex.policy is None or not vertex.policy.thresholds:
        return False
    return not vertex.policy.thresholds_operand or any(
        np.unique(array).size > 1 for array in _constant_operands(graph, vertex)
    )


def _constant_operands(graph: PrecisionGraph, vertex: Vertex) -> list[np.ndarray]:
    """The values of the constants ``vertex`` reads: its own, and those reaching it through PASS ops that read
    nothing computed (a Constant reshaped, then cast)."""
    pred = graph.digraph.pred

    def constant_only(vid: int) -> bool:
        return _passes_through(graph.vertices[vid]) and all(map(constant_only, pred[vid]))

    arrays: list[np.ndarray] = []
    stack = [vertex.id]
    while stack:
        vid = stack.pop()
        arrays.extend(a for c in graph.vertices[vid].constants if (a := constant_array(c)) is not None)
        stack.extend(p for p in pred[vid] if constant_only(p))
    return arrays


def _passes_through(vertex: Vertex) -> bool:
    """A precision-neutral op (Reshape, Cast, Slice...): what it passes on was computed upstream."""
    return vertex.node is not None and vertex.policy is not None and vertex.policy.category is Category.PASS


def threshold_inputs(graph: PrecisionGraph) -> dict[int, Vertex]:
    """Per free vertex whose result a threshold-reading op reads (directly, or through PASS ops, which
    are included along with the op they lead back to): that op's vertex."""
    found: dict[int, Vertex] = {}
    pred = graph.digraph.pred
    readers = {v.id for v in graph.vertices if _reads_thresholds(graph, v)}
    for rid in sorted(readers):
        reader = graph.vertices[rid]
        stack = list(pred[reader.id])
        while stack:
            vid = stack.pop()
            vertex = graph.vertices[vid]
            if vid in found or vid == reader.id or not vertex.free or vid in readers:
                continue
            found[vid] = reader
            if _passes_through(vertex):
                stack.extend(pred[vid])
    return found


@dataclasses.dataclass
class ThresholdInputPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        found = threshold_inputs(graph)

        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.THRESHOLD_INPUT}), found)
        ensure_pinned(self, graph, plan, found, "feeds an op comparing it with thresholds")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        for vid, reader in sorted(threshold_inputs(graph).items()):
            if not pinnable(plan, vid):
                continue
            why = reader.policy.thresholds if reader.policy is not None else ""
            plan.set_role(vid, Role.DENY, Rule.THRESHOLD_INPUT,
                          f"FP32: its result is read by {reader.describe()}, and {why}")
