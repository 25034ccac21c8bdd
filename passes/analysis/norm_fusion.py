"""Norm fusions: no LayerNorm written as elementwise ops that onnxruntime fuses into a node it cannot type.

onnxruntime's ``LayerNormFusion`` (``onnxruntime/core/optimizer/layer_norm_fusion.cc``, level EXTENDED,
the default, on the CPU, CUDA, ROCm and DML providers) fuses a LayerNorm written by hand, as BERT/TF
code and torch.onnx's TorchScript exporter write ``nn.LayerNorm``::

    X -> ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(scale) -> Add(bias)

into one ``LayerNormalization(X, scale, bias)``. It also absorbs a Cast at the pattern's input (one whose
only readers are the ReduceMean and the Sub) and a Cast between the Div and the Mul ("Apex O2"): the
fused node then reads the tensor *before* the first Cast as X, and the Mul's operand as scale. A
conversion keeps the body FP32 (Pow, ReduceMean) next to an FP16 MatMul, so it writes exactly such a
Cast: the fused node gets X FP16 and scale FP32. From opset 17 its schema (ONNX's, one type T for X,
scale and bias) refuses that, and every session of the model fails at creation ("Type parameter (T)
of Optype (LayerNormalization) bound to different types"); below opset 17 onnxruntime's own schema
accepts it, but its CUDA kernels exist only for (X, scale) in (FP32, FP32), (FP16, FP16), (FP32, FP16),
(FP16, FP32), (BF16, BF16) (``contrib_ops/cuda/layer_norm.cc``): BF16 X with FP32 scale has none.

``SimplifiedLayerNormFusion`` (same file) fuses an RMSNorm, ``X -> Pow(2) -> ReduceMean -> Add(eps) ->
Sqrt -> Div(X, .) -> Mul(scale)``, into ``SimplifiedLayerNormalization`` (separate types for X and
scale); it absorbs the Casts only on the CUDA and ROCm providers, with the kernels above: BF16 X with
FP32 scale, what a BF16 conversion of an RMSNorm after a MatMul writes, has none. On the CPU
provider it absorbs no Cast and fuses nothing with a Cast inside: no hazard there.

Guarantee (checked by ``ensures``): after this pass, for every such pattern the fusion would type as
it does, the fused node's X and scale have a kernel: the affine tail (the Mul, and the LayerNorm's Add)
takes the type the fused node reads as X (rule ``runtime.ort-layernorm-fusion``), where those vertices
are free (not FIXED or DENY); the normalization itself stays as decided (FP32), so the fused kernel,
which computes in FP32 inside, and an unfused runtime (TensorRT, ``ORT_DISABLE_ALL``) both keep the FP32
statistics. The Cast the boundary needs moves from the LayerNorm's output to the Div's, a tensor of the
same size: no more bytes where the LayerNorm feeds a low-precision MatMul, as in every transformer.
Runs after placement, on the final decisions (it reads which Cast lowering writes where), ONNX models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.dtypes import short_name
from amp_compiler.onnx.ir.slots import GRAPH_IN, NODE_IN, NODE_OUT, Slot
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, require
from amp_compiler.policy import schemas
from amp_compiler.targets import Provider

__all__ = ["NormFusionPass", "NormPattern", "norm_patterns"]

_F32, _F16, _BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16
#: (X, scale) types onnxruntime's fused norms have a CUDA/ROCm kernel for (contrib_ops/cuda/layer_norm.cc);
#: a LayerNormalization from opset 17 has ONNX's schema, one type: only the equal pairs.
_KERNELS = frozenset({(_F32, _F32), (_F16, _F16), (_BF16, _BF16), (_F32, _F16), (_F16, _F32)})
#: Providers whose SimplifiedLayerNormFusion absorbs Casts (the CPU provider's fuses none with a Cast inside);
#: TensorRT's subgraphs are its own, but what it leaves to onnxruntime runs on CUDA.
_RMS_CAST_PROVIDERS = frozenset({Provider.CUDA, Provider.TENSORRT})
_SOURCE = "onnxruntime/core/optimizer/layer_norm_fusion.cc"


@dataclasses.dataclass(frozen=True)
class NormPattern:
    """A norm onnxruntime fuses: ``x`` its input, ``readers`` the nodes reading it (a leading Cast is absorbed
    when they are its only readers), ``affine`` the Mul (and the LayerNorm's Add) whose type the scale takes."""

    fused: str  # "LayerNormalization" or "SimplifiedLayerNormalization"
    x: ir.Value
    readers: tuple[ir.Node, ...]
    affine: tuple[ir.Node, ...]


def _is(node: ir.Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and schemas.is_onnx_domain(node.domain)


def _only_reader(value: ir.Value, op: str) -> ir.Node | None:
    users = {use.node for use in value.uses()}
    node = next(iter(users)) if len(users) == 1 else None
    return node if _is(node, op) and not value.is_graph_output() else None


def _tail(sqrt_in: ir.Node, x: ir.Value) -> tuple[ir.Node, ir.Node] | None:
    """From the Add(eps) under the Sqrt: (Div, Mul) where the Div divides ``x`` by the Sqrt."""
    sqrt = _only_reader(sqrt_in.outputs[0], "Sqrt")
    if sqrt is None:
        return None
    div = _only_reader(sqrt.outputs[0], "Div")
    if div is None or div.inputs[0] is not x or div.inputs[1] is not sqrt.outputs[0]:
        return None
    mul = _only_reader(div.outputs[0], "Mul")
    return (div, mul) if mul is not None else None


def norm_patterns(model: ir.Model) -> Iterator[NormPattern]:
    """The LayerNorms and RMSNorms written as elementwise ops that onnxruntime's norm fusions match, in
    node order (a Cast inside them aside: the types are for :class:`NormFusionPass` to judge). A LayerNorm's
    own tail, ``d -> Pow -> ... -> Div(d, .) -> Mul``, is no RMSNorm: LayerNormFusion runs first and takes it."""
    taken: set[ir.Node] = set()
    for graph in model.graphs():
        for node in graph:
            if _is(node, "ReduceMean") and node.inputs[0] is not None:
                x = node.inputs[0]
                subs = [use.node for use in node.outputs[0].uses()]
                centred = (x, node.outputs[0])
                if not subs or len(subs) > 2 or not all(_is(s, "Sub") and tuple(s.inputs) == centred for s in subs):
                    continue
                for sub in subs:
                    d = sub.outputs[0]
                    pow_ = next((u.node for u in d.uses() if _is(u.node, "Pow") and u.idx == 0), None)
                    mean2 = _only_reader(pow_.outputs[0], "ReduceMean") if pow_ is not None else None
                    add_eps = _only_reader(mean2.outputs[0], "Add") if mean2 is not None else None
                    tail = _tail(add_eps, d) if add_eps is not None else None
                    bias_add = _only_reader(tail[1].outputs[0], "Add") if tail is not None else None
                    if tail is not None and bias_add is not None:
                        taken.add(tail[1])
                        yield NormPattern("LayerNormalization", x, (node, *subs), (tail[1], bias_add))
                        break
            elif _is(node, "Pow") and node.inputs[0] is not None:
                x = node.inputs[0]
                mean = _only_reader(node.outputs[0], "ReduceMean")
                add_eps = _only_reader(mean.outputs[0], "Add") if mean is not None else None
                tail = _tail(add_eps, x) if add_eps is not None else None
                if tail is not None and tail[0].inputs[0] is x and tail[1] not in taken:
                    yield NormPattern("SimplifiedLayerNormalization", x, (node, tail[0]), (tail[1],))


def _never(_vertex: object) -> bool:
    return False


def _vid(graph: PrecisionGraph, slot: Slot) -> int | None:
    return graph.slot_vertex.get(slot)


def _dtype(graph: PrecisionGraph, plan: PrecisionPlan, slot: Slot) -> ir.DataType | None:
    vid = _vid(graph, slot)
    return plan.decisions[vid].dtype if vid is not None and vid in plan.decisions else None


def _entry_slot(value: ir.Value) -> Slot | None:
    producer = value.producer()
    if producer is not None:
        return Slot(NODE_OUT, producer, value.index() or 0)
    graph = value.graph
    if graph is not None and value in graph.inputs:
        return Slot(GRAPH_IN, graph, graph.inputs.index(value))
    return None


def fused_x(graph: PrecisionGraph, plan: PrecisionPlan, pattern: NormPattern) -> ir.DataType | None:
    """The type the fused node reads as X once lowering writes its Casts: the type ``x`` is produced in
    when the Cast to the body's type has the pattern's readers as its only readers (lowering writes one
    Cast per tensor and type, shared by every reader in that type), else the body's."""
    body = _dtype(graph, plan, Slot(NODE_IN, pattern.readers[0], 0))
    entry_slot = _entry_slot(pattern.x)
    entry = _dtype(graph, plan, entry_slot) if entry_slot is not None else None
    if body is None or entry is None or entry == body:
        return body
    in_body = {use.node for use in pattern.x.uses() if _dtype(graph, plan, Slot(NODE_IN, use.node, use.idx)) == body}
    return entry if in_body == set(pattern.readers) else body


@dataclasses.dataclass
class NormFusionPass(AnalysisPass):
    provider: Provider = Provider.CUDA

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require(isinstance(graph.model, ir.Model), self, "the patterns are read from an ONNX model")
        require(all(v.id in plan.decisions for v in graph.vertices), self, "runs on the final decisions")

    def _patterns(self, graph: PrecisionGraph) -> Iterator[NormPattern]:
        for pattern in norm_patterns(graph.model):
            if pattern.fused == "LayerNormalization" or self.provider in _RMS_CAST_PROVIDERS:
                yield pattern

    def _scale(self, graph: PrecisionGraph, plan: PrecisionPlan, pattern: NormPattern) -> ir.DataType | None:
        """The scale's type, or None where a Cast between the affine ops stops the fusion."""
        types = {_dtype(graph, plan, Slot(NODE_OUT, node, 0)) for node in pattern.affine}
        return next(iter(types)) if len(types) == 1 else None

    def _unfit(self, graph: PrecisionGraph, plan: PrecisionPlan, pattern: NormPattern) -> ir.DataType | None:
        """The fused node's X type, where its scale's type has no kernel with it; else None."""
        x, scale = fused_x(graph, plan, pattern), self._scale(graph, plan, pattern)
        if x is None or scale is None or x == scale:
            return None
        opset = graph.model.opset_imports.get("", 0)
        kernel = (x, scale) in _KERNELS and (pattern.fused == "SimplifiedLayerNormalization" or opset < 17)
        return None if kernel else x

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        for pattern in self._patterns(graph):  # node order: an earlier norm's output is a later one's input
            x = self._unfit(graph, plan, pattern)
            if x is None:
                continue
            vids = [_vid(graph, Slot(NODE_OUT, node, 0)) for node in pattern.affine]
            if any(v is None or plan.roles.get(v) in (Role.FIXED, Role.DENY) for v in vids):
                continue  # forced or fixed: left as decided (ensures names it)
            reason = (
                f"{short_name(x)}, the type of the input of the LayerNorm written as elementwise ops at "
                f"{pattern.readers[0].name!r}: onnxruntime fuses it, with the Casts at its ends, into one "
                f"{pattern.fused} ({_SOURCE}) that reads that input and this scale and has no kernel for two "
                "types; it computes the statistics in FP32 inside, as the FP32 ops around it here"
            )
            for vid in vids:
                if vid is not None:
                    plan.decide(vid, x, Rule.RUNTIME_LAYERNORM_FUSION, reason)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        rule = Rule.RUNTIME_LAYERNORM_FUSION
        ensure_all(self, graph.vertices,
                   lambda v: plan.decisions[v.id] == before.decisions[v.id] or plan.decisions[v.id].rule is rule,
                   f"changed decision, where only {rule.value} may change one")
        for pattern in self._patterns(graph):
            vids = [_vid(graph, Slot(NODE_OUT, node, 0)) for node in pattern.affine]
            if any(v is None or plan.roles.get(v) in (Role.FIXED, Role.DENY) for v in vids):
                continue
            unfit = [graph.vertices[v] for v in vids if v is not None and self._unfit(graph, plan, pattern) is not None]
            ensure_all(self, unfit, _never,
                       f"is the scale of a {pattern.fused} onnxruntime fuses with an input of another type")
