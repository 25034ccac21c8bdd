"""Kernel coverage: keep in FP32 what the target provider has no low-precision kernel for.

Runs after classification. For the CUDA provider, a free vertex (ALLOW, INFER or CLEAR) whose node
has no kernel taking the target type at the model's opset is pinned to FP32 (rule
``provider.no-kernel``): in low precision onnxruntime would place the node on the CPU, with copies
to and from the GPU around it. In FP32 it keeps its CUDA kernel, or, for an op without any CUDA
kernel, runs on the CPU without the Casts onnxruntime would add there.

The pinned vertex gets the role FIXED (its dtype cannot change on this provider), not DENY: DENY
marks a numeric hazard, which painting spreads forward through the FOLLOW ops downstream (an Add fed
by Exp stays FP32). A missing kernel is no hazard to the values, so the neighbours stay free and
painting and cast placement decide them as usual (PP-OCR's classifier at opset 11, whose 18 Clip-11
have no FP16 CUDA kernel: 437 FP16 nodes and 38 Casts with FIXED, 248 and 54 with DENY).

A node's kernel is looked up as onnxruntime does (:mod:`amp_compiler.policy.kernels`): domain, op, the
schema version at the model's opset, and the type constraints. The vertex's slots must take the
target type; the node's other inputs and outputs may keep their type or take the target type too
(their own vertices are decided on their own).

Where the node's non-float types miss every kernel whatever its float types (SLANet's OneHot: int64 indices
with an int32 depth, where CUDA registers int32/int32 and int64/int64), the message names those constraints
(each whose change alone gives a kernel, else all the non-float ones) and the kernels' combinations of them,
not the float type nor "no FP16 kernel": no float type gives it one. Elsewhere it names the float constraints.

The CPU provider is not pinned, only noted: for a node without an FP16 kernel onnxruntime inserts
Casts around it and runs the FP32 kernel, on the same device, so nothing moves between devices (and
pinning would keep most of a model FP32, the CPU provider having FP16 kernels for few ops). Its
BF16 coverage is smaller still: a BF16 model needs a GPU provider (``emulate_bf16`` runs it
anywhere).

A kernel registered for the target type that refuses it for the node's attribute values (the
provider's ``KernelCoverage.refused``, from ``policy/ort_kernel_limits.json``: the CPU provider's
ScatterElements with ``reduction="add"`` in FP16) is pinned on every provider, the CPU's included:
onnxruntime picks that kernel and adds no Casts, so the written model would fail at run time ("MLFloat16
data type is not supported with ScatterElements opset 16 when reduction is 'add'") or, on CUDA for BF16,
compute wrong values.

TensorRT (11 builds strongly typed networks only: each tensor's type is the one the ONNX file gives)
has no kernel registry: its ONNX parser's operator table says which types it imports each op in
(``policy/trt_onnx_ops.json``), and an op it imports in FP32 but not in the target type stays FP32
(STFT; GridSample, NonZero, RoiAlign and the window functions for BF16). An op it does not import
at all cannot be in a TensorRT engine whatever its type: onnxruntime's TensorRT provider runs it on
CUDA, so the CUDA provider's coverage decides it (the conversion warns about such ops once).

Guarantees (checked by ``ensures``): only free, not yet denied vertices change, to FIXED with the rule
``provider.no-kernel`` (on the CPU provider only for a kernel limit); each pinned vertex names the op, the provider and
where the coverage came from.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, SlotKind
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.dtypes import schema_type
from amp_compiler.onnx.ir.slots import attribute_value, shape_codes
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, ensure_only_pinned, require, require_roles
from amp_compiler.policy import schemas
from amp_compiler.policy.kernels import SHORT_NAMES, KernelCoverage, coverage_for, short_type
from amp_compiler.targets import Provider

__all__ = ["KernelCoveragePass", "target_label"]

_FLOAT_NAMES = {"float", "float16", "bfloat16", "double"}
_NODE_IN, _NODE_OUT = SlotKind.NODE_IN, SlotKind.NODE_OUT
_LISTED = 4  # a kernel's type combinations named in a message; the rest counted


_FREE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})
# Why a vertex has no low-precision kernel, the coverage that says so, and whether a kernel limit refuses
# the type (the kernel exists but fails at run time: pinned on every provider).
_Missing = tuple[str, str, bool]


@dataclasses.dataclass
class KernelCoveragePass(AnalysisPass):
    provider: Provider = Provider.CUDA
    # The coverage to use; None: :func:`amp_compiler.policy.kernels.coverage_for` the provider.
    coverage: KernelCoverage | None = None
    # per node shape (op, the vertex's slots, the other slots' types): why it has no kernel, or None
    _by_shape: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(isinstance(graph.model, ir.Model), self, "kernels are looked up for the ops of an ONNX model")

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure_only_pinned(self, graph, plan, before, _FREE, Role.FIXED, frozenset({Rule.PROVIDER_NO_KERNEL}))
        if self.provider is Provider.CPU:
            ensure_all(
                self, graph.vertices,
                lambda v: plan.roles[v.id] == before.roles[v.id] or self._refuses(graph, v),
                "is pinned on the CPU provider for a missing kernel (only kernel limits pin there)",
            )

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        self._by_shape.clear()
        coverage = self.coverage if self.coverage is not None else coverage_for(self.provider)
        if coverage is None:
            return
        pin = self.provider is not Provider.CPU
        target = short_type(graph.target.type_str)
        opsets = graph.model.opset_imports
        for vertex in graph.vertices:
            if plan.roles.get(vertex.id) not in _FREE:
                continue
            found = self._missing(vertex, coverage, target, opsets)
            if found is None:
                continue
            missing, source, refused = found
            if pin or refused:
                plan.set_role(vertex.id, Role.FIXED, Rule.PROVIDER_NO_KERNEL, f"FP32: {missing} ({source})")
            else:
                # "no FP16 kernel for Conv-11 on the CPU provider (onnxruntime adds Casts around it)"
                consequence = (
                    "onnxruntime adds Casts around it" if graph.target.value == "fp16"
                    else f"a {graph.target.value} model does not load there"
                )
                note = f"{missing} ({consequence})"
                plan.notes[vertex.id] = f"{plan.notes[vertex.id]}; {note}" if vertex.id in plan.notes else note

    def _refuses(self, graph: PrecisionGraph, vertex) -> bool:
        """Whether a kernel limit refuses the target type for the vertex's nodes."""
        coverage = self.coverage if self.coverage is not None else coverage_for(self.provider)
        found = None if coverage is None else self._missing(
            vertex, coverage, short_type(graph.target.type_str), graph.model.opset_imports)
        return found is not None and found[2]

    def kernel_missing(self, graph: PrecisionGraph, vertex, type_name: str) -> tuple[str, str] | None:
        """Why the provider has no kernel taking ``type_name`` ("bfloat16") for the vertex's nodes, and
        the coverage that says so; None when it has one (or no coverage is known)."""
        coverage = self.coverage if self.coverage is not None else coverage_for(self.provider)
        if coverage is None or not isinstance(graph.model, ir.Model):
            return None
        found = self._missing(vertex, coverage, type_name, graph.model.opset_imports)
        return None if found is None else found[:2]

    def _missing(self, vertex, coverage: KernelCoverage, target: str, opsets) -> _Missing | None:
        """Why the vertex's nodes have no low-precision kernel ("no FP16 kernel for X-13 on ..."), the
        coverage that says so, and whether a kernel limit refuses the type (it fails at run time); or None."""
        by_node: dict[int, tuple[ir.Node, set[tuple[bool, int]]]] = {}
        for kind, owner, index in vertex.slots:
            if kind is _NODE_IN or kind is _NODE_OUT:
                entry = by_node.get(id(owner))
                if entry is None:
                    entry = by_node[id(owner)] = (owner, set())
                entry[1].add((kind is _NODE_IN, index))
        for node, mine in by_node.values():
            # What the answer depends on, cheaply: the op, which slots are the vertex's, the other
            # slots' types. Most nodes of a model repeat a few of these.
            shape_key = (
                node.domain, node.op_type, frozenset(mine), shape_codes(node.inputs), shape_codes(node.outputs),
                tuple(attribute_value(node, a) for a in coverage.limit_attributes(node.domain or "", node.op_type)),
            )
            if shape_key in self._by_shape:
                found = self._by_shape[shape_key]
            else:
                found = self._by_shape[shape_key] = self._node_missing(
                    node, dict.fromkeys(mine, target), coverage, target, opsets)
            if found is not None:
                return found
        return None

    def types_missing(self, graph: PrecisionGraph, node: ir.Node,
                      types: Mapping[tuple[bool, int], str]) -> tuple[str, str] | None:
        """Why the provider has no kernel for ``node`` run in exactly ``types`` (per (is input, index):
        "float16"; a slot not given keeps its value's own type), and the coverage that says so; None when
        it has one (or no coverage or schema is known): the lookup of a node's final types."""
        coverage = self.coverage if self.coverage is not None else coverage_for(self.provider)
        if coverage is None or not isinstance(graph.model, ir.Model):
            return None
        key = (
            node.domain, node.op_type, frozenset(types.items()), shape_codes(node.inputs), shape_codes(node.outputs),
            tuple(attribute_value(node, a) for a in coverage.limit_attributes(node.domain or "", node.op_type)), None,
        )  # as _missing's, and None: exact types, where _missing's nodes take the target type too
        if key not in self._by_shape:
            self._by_shape[key] = self._node_missing(node, types, coverage, None, graph.model.opset_imports)
        found = self._by_shape[key]
        return None if found is None else found[:2]

    def _node_missing(self, node, fixed: Mapping[tuple[bool, int], str], coverage: KernelCoverage,
                      target: str | None, opsets) -> _Missing | None:
        """Why ``node`` has no kernel with its ``fixed`` slots in their given types and the others in
        their own or ``target`` (None: their own alone, and the message names the types), or None."""
        domain = node.domain or ""
        opset = opsets.get("" if domain == "ai.onnx" else domain)
        if opset is None and schemas.is_onnx_domain(domain):
            opset = opsets.get("ai.onnx")
        sig = schemas.lookup(domain, node.op_type, opset if opset is not None else 1)
        if sig is None:
            return None
        requirements = tuple(_requirements(node, sig, fixed, target))
        op = f"{node.op_type}-{sig.since_version}"
        if not coverage.has_op(domain, node.op_type) and coverage.fallback is not None:
            # TensorRT does not import it: onnxruntime's TensorRT provider runs it on its fallback.
            found = self._node_missing(node, fixed, coverage.fallback, target, opsets)
            if found is None:
                return None
            return f"TensorRT does not import {op}, and {found[0]}", found[1], found[2]
        provider = SHORT_NAMES[coverage.provider]
        for checked in (target,) if target is not None else dict.fromkeys(fixed.values()):
            limited = _refused(node, sig.since_version, coverage, checked)
            if limited is not None:
                return limited
        if not coverage.has_op(domain, node.op_type):
            why = f"no {provider} kernel for {op} in any type (onnxruntime would run it on the CPU)"
            return why, coverage.source, False
        if target is None:
            if coverage.supports(domain, node.op_type, sig.since_version, requirements):
                return None
            taking = _blocking(coverage, domain, node.op_type, sig.since_version, requirements) or ", ".join(
                f"{p}={c[0]}" for p, c in dict(requirements).items() if c[0] in _FLOAT_NAMES) or "its types"
            return f"no {provider} kernel for {op} taking {taking}", coverage.source, False
        if not coverage.supports(domain, node.op_type, sig.since_version, requirements):
            if coverage.provider is Provider.TENSORRT:
                types = coverage.float_types(domain, node.op_type, sig.since_version)
                listed = ", ".join(target_label(t) for t in types)
                note = coverage.notes.get((schemas.canonical_domain(domain), node.op_type))
                why = f"TensorRT's ONNX parser imports {node.op_type} in {listed} only, not {target_label(target)}"
                return why, coverage.source + (f"; its restrictions: {note}" if note else ""), False
            blocking = _blocking(coverage, domain, node.op_type, sig.since_version, requirements)
            if blocking is not None:  # no float type would do: the integer types miss
                return f"no {provider} kernel for {op} taking {blocking}", coverage.source, False
            return f"no {target_label(target)} kernel for {op} on the {provider} provider", coverage.source, False
        return None


def _blocking(coverage: KernelCoverage, domain: str, op: str, since: int,
              requirements: tuple[tuple[str, tuple[str, ...]], ...]) -> str | None:
    """The type constraints that keep ``requirements`` from every kernel of the op where its non-float types
    do, whatever its float ones, and the provider's kernels for them: "T1=int64, T2=int32: its kernels take
    T1/T2 int32/int32, int64/int64" (OneHot, indices int64 with depth int32). Named: each constraint whose
    change alone gives a kernel, or where none alone would, all the non-float ones. None where the float
    types are what miss (some kernel takes the non-float ones) or no kernel serves the version."""
    defs = coverage.defs(domain, op, since)
    fixed = [(p, c) for p, c in requirements if not any(t in _FLOAT_NAMES for t in c)]
    if not defs or any(k.accepts(fixed) for k in defs):
        return None
    params = list(dict.fromkeys(p for p, _ in fixed))
    alone = [p for p in params if any(k.accepts([r for r in requirements if r[0] != p]) for k in defs)]
    named = alone or params
    given = ", ".join(f"{p}=" + "/".join(dict.fromkeys(t for q, c in fixed if q == p for t in c)) for p in named)
    combos = list(dict.fromkeys(
        "/".join("|".join(sorted(k.types[p])) if p in k.types else "any" for p in named) for k in defs))
    listed = ", ".join(combos[:_LISTED]) + (f" and {len(combos) - _LISTED} more" if len(combos) > _LISTED else "")
    return f"{given}: its kernels take {'/'.join(named)} {listed}"


def _refused(node: ir.Node, since: int, coverage: KernelCoverage, target: str) -> _Missing | None:
    """Why the provider's kernel refuses the target type for this node's attribute values, or None."""
    limit = coverage.refused(node.domain or "", node.op_type, since, functools.partial(attribute_value, node), target)
    if limit is None:
        return None
    provider = SHORT_NAMES[coverage.provider]
    shown = attribute_value(node, limit.attribute)
    why = (
        f"the {provider} provider's {node.op_type}-{since} kernel refuses {target_label(target)} with "
        f"{limit.attribute}={shown!r}: it fails {limit.fails}"
    )
    return why, limit.source, True


def target_label(type_name: str) -> str:
    return {"float16": "FP16", "bfloat16": "BF16", "float": "FP32", "double": "FP64"}.get(type_name, type_name)


def _requirements(node: ir.Node, sig: schemas.OpSignature, fixed: Mapping[tuple[bool, int], str], target: str | None):
    """(type parameter, candidate types) per present input and output of ``node``: the ``fixed`` slots
    their given type, the others their own, or ``target`` too where it is a float (``target`` given)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for is_input, values in ((True, node.inputs), (False, node.outputs)):
        for i, value in enumerate(values):
            if value is None:
                continue
            key = sig.type_key(is_input, i)
            param = key[0] if isinstance(key, tuple) else key  # If/Loop/Scan: ("V", index)
            if param not in sig.allowed:
                continue  # no formal here, or a fixed type ("tensor(float)"): not a type parameter
            given = fixed.get((is_input, i))
            if given is not None:
                out.append((param, (given,)))
                continue
            dtype = value.dtype if isinstance(value.type, ir.TensorType) else None
            if dtype is None:
                continue  # unknown (or not a tensor): no requirement
            current = short_type(schema_type(dtype))
            out.append((param, (current, target) if target is not None and current in _FLOAT_NAMES else (current,)))
    return out

