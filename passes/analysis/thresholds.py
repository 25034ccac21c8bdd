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

So the vertex computing such an op's float input, reached upstream through precision-neutral (PASS)
ops such as Reshape, Cast or Slice, each of which is kept FP32 too, stays FP32 (DENY, rule
``threshold.input``), the op and the policy table's ``thresholds`` reason named. The producers in
such models are small (a PCA's 6x4 MatMul), so nothing measurable is lost.

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``) or another pass fixed it, is DENY with ``threshold.input``; nothing else changes.
"""

from __future__ import annotations

import dataclasses

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.policy import Category

__all__ = ["ThresholdInputPass", "threshold_inputs"]


def _reads_thresholds(vertex: Vertex) -> bool:
    return vertex.node is not None and vertex.policy is not None and bool(vertex.policy.thresholds)


def _passes_through(vertex: Vertex) -> bool:
    """A precision-neutral op (Reshape, Cast, Slice...): what it passes on was computed upstream."""
    return vertex.node is not None and vertex.policy is not None and vertex.policy.category is Category.PASS


def threshold_inputs(graph: PrecisionGraph) -> dict[int, Vertex]:
    """Per free vertex whose result a threshold-reading op reads (directly, or through PASS ops, which
    are included along with the op they lead back to): that op's vertex."""
    found: dict[int, Vertex] = {}
    pred = graph.digraph.pred
    for reader in graph.vertices:
        if not _reads_thresholds(reader):
            continue
        stack = list(pred[reader.id])
        while stack:
            vid = stack.pop()
            vertex = graph.vertices[vid]
            if vid in found or vid == reader.id or not vertex.free or _reads_thresholds(vertex):
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
