"""Final kernel check: every node runs in types its provider has a kernel for, or the conversion says so.

:class:`~amp_compiler.passes.analysis.coverage.KernelCoveragePass` runs right after classification and
looks up the target type of the free vertices only. The types a node finally runs in are decided
later, by rules that never look a kernel up: the user's blocks, range and precision pins, painting,
cast placement. onnxruntime's CUDA provider has GroupQueryAttention (and PagedAttention, SparseAttention,
GemmaRotaryEmbedding, ...) in float16/bfloat16 only, and the ops its CPU optimizer writes at its highest
level (domain ``com.microsoft.nchwc``) in no type at all: a node kept FP32 there is placed on the CPU
provider, with copies between GPU and CPU around it, or the model is refused, and the conversion used
to say nothing (a GroupQueryAttention range-pinned under ``--range-fallback fp32`` or blocked with
``--block-op``).

This pass runs last, on the final decisions of an ONNX model for a GPU provider (CUDA, TensorRT). Each
node of a vertex is looked up (the one lookup,
:meth:`~amp_compiler.passes.analysis.coverage.KernelCoveragePass.types_missing`: the provider's kernel
table) in its final types (an op onnx defines with a function body is left out: onnxruntime expands it
into that body's ops where it has no kernel for it): per input and output, its vertex's decided type (the
target type where range scaling runs it low inside, :class:`~amp_compiler.core.plan.Scaling`), else its
value's own. Where the provider has no kernel for them, the node's vertices whose decision allows another
type take it, the fewest that give the node a kernel:

- FP32 as painting's or cast placement's choice (``paint.default-fp32``, ``placement.min-cut``, a free
  role): a question of Cast bytes, not of values. It takes the target type (rule
  ``provider.kernel-types``): GemmaRotaryEmbedding, a FOLLOW op whose CUDA kernel takes FP16 only;
- FP32 only for FP16's range (:data:`~amp_compiler.core.plan.RANGE_ONLY_RULES`) in an FP16 conversion
  whose range fallback allows BF16 (``bf16``, ``scaled``): BF16, which has FP32's range, keeping its rule;
- the target type of a free vertex as the policy or painting chose it: BF16 under such a range fallback,
  else FP32 (``provider.kernel-types``). GroupQueryAttention's kernels take its output and its KV cache
  in one type: the range fallback moves a range-pinned output to BF16, and its FP16 KV cache follows it.

At most :data:`_MAX_TRIES` choices are tried per node, the fewest changes first; an op the provider has
in no type is not tried. Every other decision stands: a user's block or allow, a precision pin
(``policy.high.*``, ``--tolerance``), a
range pin where the range fallback is ``fp32`` (BF16 is the user's to allow: no BF16 Tensor Cores
before Ampere; FP16 overflows), a schema or a provider that takes no other type. Those nodes are
recorded in ``plan.no_kernel``, which the conversion turns into one warning per op type
(:func:`no_kernel_warnings`: count, types, provider, consequence, and what would run them there) and
which the TF32 warning leaves out (there is no FP32 kernel to run as TF32).

Guarantees (checked by ``ensures``): a decision changes only to ``provider.kernel-types`` on a free
vertex (from the target type the policy or painting chose, or from a Cast-bytes FP32), or from FP32
to BF16 under its range rule;
afterwards ``plan.no_kernel`` holds exactly the nodes whose final types have no kernel on the provider.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterator

import onnx
import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph
from amp_compiler.core.plan import RANGE_ONLY_RULES, PrecisionPlan, Role, Rule
from amp_compiler.dtypes import schema_type
from amp_compiler.onnx.ir.slots import NODE_IN, NODE_OUT, Slot
from amp_compiler.passes.analysis.base import AnalysisPass, ensure, ensure_all, require
from amp_compiler.passes.analysis.coverage import KernelCoveragePass, target_label
from amp_compiler.policy import schemas
from amp_compiler.policy.kernels import SHORT_NAMES, KernelCoverage, coverage_for, short_type
from amp_compiler.targets import Provider

__all__ = ["FinalKernelPass", "final_types", "no_kernel_warnings"]

_F32, _F16, _BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16
_FREE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})
#: FP32 decisions of free vertices that are about Cast bytes, not values.
_CAST_CHOICES = frozenset({Rule.PAINT_DEFAULT, Rule.MINCUT})
_USER_RULES = frozenset({Rule.USER_BLOCK_OP, Rule.USER_BLOCK_NODE})
#: Low-precision decisions that are someone's choice, not painting's: the user's allows and declared types,
#: ``--tolerance``'s measured keeps. They stay as they are.
_CHOSEN_LOW = frozenset({Rule.USER_ALLOW, Rule.USER_CUSTOM_OP, Rule.TOLERANCE_KEPT})
_MAX_TRIES = 256  # type choices tried per node (a node has a few vertices: 1 to 3 for the ops in question)
_NAMED = 3  # nodes named in a warning; the rest counted


def final_types(graph: PrecisionGraph, plan: PrecisionPlan, node: ir.Node,
                changed: dict[int, ir.DataType] | None = None) -> dict[tuple[bool, int], str]:
    """Per (is input, index) of ``node``'s slots in a vertex: the type it runs in ("float16"), the
    vertex's decision (or ``changed``'s), the target type where range scaling runs it low inside."""
    types: dict[tuple[bool, int], str] = {}
    for kind, values in ((NODE_IN, node.inputs), (NODE_OUT, node.outputs)):
        for i in range(len(values)):
            vid = graph.slot_vertex.get(Slot(kind, node, i))
            if vid is None or graph.vertices[vid].untyped:
                continue
            dtype = (changed or {}).get(vid) or (
                graph.target.dtype if vid in plan.scalings else plan.decisions[vid].dtype)
            if dtype is not ir.DataType.UNDEFINED:
                types[(kind is NODE_IN, i)] = short_type(schema_type(dtype))
    return types


@dataclasses.dataclass
class FinalKernelPass(AnalysisPass):
    """The final types' kernels, looked up once per node (see the module docstring)."""

    provider: Provider = Provider.CUDA
    range_fallback: str = "fp32"  # the conversion's: "bf16"/"scaled" allow BF16 for range pins of FP16
    coverage: KernelCoverage | None = None

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require(isinstance(graph.model, ir.Model), self, "kernels are looked up for the ops of an ONNX model")
        require(set(plan.decisions) == {v.id for v in graph.vertices}, self, "every vertex must be decided first")

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        def kept_or_moved(vertex) -> bool:
            now, then = plan.decisions[vertex.id], before.decisions[vertex.id]
            if now == then:
                return True
            if now.rule is Rule.PROVIDER_KERNEL_TYPES:
                return plan.roles[vertex.id] in _FREE and (
                    then.rule in _CAST_CHOICES if then.dtype is _F32 else then.rule not in _CHOSEN_LOW)
            return now.rule is then.rule and then.rule in RANGE_ONLY_RULES and (then.dtype, now.dtype) == (_F32, _BF16)

        ensure_all(self, graph.vertices, kept_or_moved, "changed, though it is no choice a kernel may override")
        coverage = self._coverage()
        if self.provider is Provider.CPU or coverage is None:
            return
        lookup = KernelCoveragePass(self.provider, coverage)
        opset = _default_opset(graph)
        missing = {n for n in _nodes(graph)
                   if lookup.types_missing(graph, n, final_types(graph, plan, n)) and not _expanded(n, opset)}
        ensure(missing == set(plan.no_kernel), self, "plan.no_kernel is not the nodes without a kernel")

    def _coverage(self) -> KernelCoverage | None:
        return self.coverage if self.coverage is not None else coverage_for(self.provider)

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        plan.no_kernel.clear()
        coverage = self._coverage()
        if self.provider is Provider.CPU or coverage is None:
            return  # the CPU provider Casts around a node it has no kernel for, on the same device
        lookup = KernelCoveragePass(self.provider, coverage)
        again: dict[ir.Node, None] = {}  # the nodes to look up once more: those missing, and those a move reached
        opset = _default_opset(graph)
        for node in _nodes(graph):
            if lookup.types_missing(graph, node, final_types(graph, plan, node)) is None or _expanded(node, opset):
                continue
            again[node] = None
            if not any(cov is not None and cov.has_op(node.domain or "", node.op_type)
                       for cov in (coverage, coverage.fallback)):
                continue  # none in any type
            options = [(vid, others) for vid in graph.node_vertices[node] if (others := self._others(graph, plan, vid))]
            for changed in itertools.islice(_changes(options), _MAX_TRIES):
                if lookup.types_missing(graph, node, final_types(graph, plan, node, changed)) is None:
                    for vid, to in changed.items():
                        self._move(graph, plan, vid, to, coverage)
                        again.update((owner, None) for kind, owner, _ in graph.vertices[vid].slots
                                     if kind in (NODE_IN, NODE_OUT) and isinstance(owner, ir.Node))
                    break
        for node in again:  # the final word, after every move (a node no move reached kept its kernel)
            found = lookup.types_missing(graph, node, final_types(graph, plan, node))
            if found is not None:
                plan.no_kernel[node] = f"{found[0]} ({found[1]})"

    def _others(self, graph: PrecisionGraph, plan: PrecisionPlan, vid: int) -> list[ir.DataType]:
        """The types a vertex's decision allows instead of its own, best first (see the module docstring)."""
        decision = plan.decisions[vid]
        if vid in plan.scalings:
            return []
        free = plan.roles.get(vid) in _FREE
        bf16 = graph.target.dtype is _F16 and self.range_fallback in ("bf16", "scaled")
        if decision.dtype is _F32:
            if free and decision.rule in _CAST_CHOICES:
                return [graph.target.dtype]
            return [_BF16] if bf16 and decision.rule in RANGE_ONLY_RULES else []
        if free and decision.dtype is graph.target.dtype and decision.rule not in _CHOSEN_LOW:
            return [_BF16, _F32] if bf16 else [_F32]
        return []

    def _move(self, graph: PrecisionGraph, plan: PrecisionPlan, vid: int, to: ir.DataType,
              coverage: KernelCoverage) -> None:
        decision = plan.decisions[vid]
        provider = SHORT_NAMES[coverage.provider]
        label = target_label(short_type(schema_type(to)))
        if decision.rule in RANGE_ONLY_RULES:
            plan.decide(vid, to, decision.rule, f"BF16 instead of FP32 (the {provider} provider has no FP32 kernel "
                        f"for its node, {coverage.source}; BF16 has FP32's range); {decision.reason}")
            return
        was = target_label(short_type(schema_type(decision.dtype)))
        plan.decide(vid, to, Rule.PROVIDER_KERNEL_TYPES,
                    f"{label}: the {provider} provider has a kernel for its node in these types, not in {was} "
                    f"({coverage.source}); was: {decision.reason}")


def _changes(options: list[tuple[int, list[ir.DataType]]]) -> Iterator[dict[int, ir.DataType]]:
    """Every choice of other types for some of the vertices in ``options``: the fewest changes first."""
    for k in range(1, len(options) + 1):
        for chosen in itertools.combinations(options, k):
            for types in itertools.product(*(others for _, others in chosen)):
                yield {vid: to for (vid, _), to in zip(chosen, types, strict=True)}


def _default_opset(graph: PrecisionGraph) -> int:
    """The model's opset of onnx's default domain."""
    imports = graph.model.opset_imports if isinstance(graph.model, ir.Model) else {}
    return imports.get("", imports.get("ai.onnx", 1))


def _expanded(node: ir.Node, opset: int) -> bool:
    """Whether onnxruntime expands ``node`` into the function body onnx defines its op with at ``opset``: no
    provider claims it (the CPU provider has no kernel for the op either) and it has such a body
    (GroupNormalization, Mish, SoftmaxCrossEntropyLoss, ...). The body's ops then run, so the kernel table's
    silence on the op itself means nothing (sweep W: a CLIP's SoftmaxCrossEntropyLoss and GroupNormalization-21,
    which torch.onnx writes for diffusion UNets, were said to make onnxruntime refuse models it loads and runs).
    An op the CPU provider has (Relu, whose schema has a body too) is placed there, with copies, as said."""
    if not schemas.is_onnx_domain(node.domain or ""):
        return False
    cpu = coverage_for(Provider.CPU)  # read only for a node its GPU provider has no kernel for
    if cpu is not None and cpu.has_op("", node.op_type):
        return False
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    # (onnx's type stubs do not declare these two properties)
    return bool(getattr(schema, "has_function", False) or getattr(schema, "has_context_dependent_function", False))


def _nodes(graph: PrecisionGraph) -> Iterator[ir.Node]:
    """The nodes of the graph's vertices (those with float data), in order."""
    return (node for node in graph.node_vertices if isinstance(node, ir.Node))


def no_kernel_warnings(graph: PrecisionGraph, plan: PrecisionPlan, provider: Provider,
                       range_fallback: str) -> list[str]:
    """One line per op type of ``plan.no_kernel`` (per domain, for a domain the provider has no op of):
    how many nodes, which, what onnxruntime does with them, and for an op the provider has in other types,
    the types it has no kernel for, the rules that keep them so and what would run them there."""
    coverage = coverage_for(provider)
    if not plan.no_kernel or coverage is None:
        return []
    groups: dict[tuple[str, str], list[ir.Node]] = {}
    for node in plan.no_kernel:
        assert isinstance(node, ir.Node)  # an ONNX plan's ops
        domain = schemas.canonical_domain(node.domain or "")
        key = (domain, "" if _domain_absent(coverage, domain) else node.op_type)
        groups.setdefault(key, []).append(node)
    cpu = coverage_for(Provider.CPU)
    lookup = KernelCoveragePass(provider, coverage)
    name = SHORT_NAMES[provider]
    last = coverage.fallback or coverage  # where an op the provider does not take runs (TensorRT: CUDA)
    lines = []
    for (domain, op), nodes in groups.items():
        named = [n.name for n in nodes if n.name]
        listed = ", ".join(named[:_NAMED]) + (f" and {len(named) - _NAMED} more" if len(named) > _NAMED else "")
        rules = ", ".join(dict.fromkeys(r.value for n in nodes for r in _rules(graph, plan, n)))
        consequence = _consequence(cpu, nodes[0])
        if not op:
            counts = collections.Counter(n.op_type for n in nodes)
            ops = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            lines.append(
                f"{len(nodes)} node(s) of domain {domain} ({ops}): the {SHORT_NAMES[last.provider]} provider has "
                f"no kernel for any op of it ({last.source}): {consequence}; onnxruntime writes such ops when it "
                f"optimizes a graph for its CPU provider: convert the model as exported")
            continue
        if not any(cov is not None and cov.has_op(domain, op) for cov in (coverage, coverage.fallback)):
            lines.append(
                f"{len(nodes)} {op} node(s){' (' + listed + ')' if listed else ''}: the {SHORT_NAMES[last.provider]} "
                f"provider has no kernel for {op} in any type ({last.source}): {consequence}")
            continue
        remedy = _remedy(lookup, nodes[0], graph, plan, range_fallback)
        lines.append(
            f"{len(nodes)} {op} node(s){' (' + listed + ')' if listed else ''} run in types the {name} provider has "
            f"no kernel for (rule {rules}: {plan.no_kernel[nodes[0]]}): {consequence}{remedy}")
    return lines


def _domain_absent(coverage: KernelCoverage, domain: str) -> bool:
    """Whether neither the provider nor its fallback has a kernel for any op of ``domain``."""
    for cov in (coverage, coverage.fallback):
        if cov is not None and any(d == domain for d, _ in cov.kernels):
            return False
    return True


def _rules(graph: PrecisionGraph, plan: PrecisionPlan, node: ir.Node) -> list[Rule]:
    """The rules of ``node``'s FP32 vertices (all its vertices' when none is FP32)."""
    vids = graph.node_vertices[node]
    fp32 = [plan.decisions[v].rule for v in vids if plan.decisions[v].dtype is _F32]
    return fp32 or [plan.decisions[v].rule for v in vids]


def _consequence(cpu: KernelCoverage | None, node: ir.Node) -> str:
    """What onnxruntime does with a node its GPU provider has no kernel for."""
    domain = node.domain or ""
    if cpu is None:
        return ("onnxruntime runs them on its CPU provider where that has a kernel, copying their inputs and outputs "
                "between GPU and CPU, or refuses to load the model")
    if cpu.has_op(domain, node.op_type):
        return "onnxruntime runs them on its CPU provider, copying their inputs and outputs between GPU and CPU"
    return "its CPU provider has no kernel for them either: onnxruntime refuses to load the model"


def _remedy(lookup: KernelCoveragePass, node: ir.Node, graph: PrecisionGraph, plan: PrecisionPlan,
            range_fallback: str) -> str:
    """What would run the node on the provider: the types it takes the node in (every float slot in one
    type), and the choice that keeps the node out of them."""
    slots = final_types(graph, plan, node)
    takes = [target_label(t) for t in ("float", "float16", "bfloat16")
             if lookup.types_missing(graph, node, dict.fromkeys(slots, t)) is None]
    if not takes:
        return ""
    rules = set(_rules(graph, plan, node))
    said = f"; the {SHORT_NAMES[lookup.provider]} provider takes it in {', '.join(takes)}"
    if rules & _USER_RULES:
        return f"{said}, which the user's block keeps them out of"
    if rules & RANGE_ONLY_RULES and range_fallback == "fp32" and "BF16" in takes and graph.target.dtype is _F16:
        return (f"{said}: a BF16 range fallback (--range-fallback bf16, for GPUs with BF16 Tensor Cores, Ampere "
                f"and later) runs them there with FP32's range")
    return said
