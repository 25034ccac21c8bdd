"""The per-node report of an FX conversion: the same :class:`~amp_compiler.core.decision.NodeDecision`
records as the ONNX path (node, op, precision, rule id, reason, dtypes), one per graph node, plus the
casts inserted and the parameter memory before and after."""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Set as AbstractSet

import torch
import torch.fx as fx

from amp_compiler.core.decision import NodeDecision, count_by_precision, count_by_rule
from amp_compiler.core.graph import SlotKind
from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.plan import PrecisionPlan, Rule
from amp_compiler.dtypes import LOW_PRECISIONS, MIXED, NO_FLOAT, precision_rank
from amp_compiler.fx.graph.arguments import tensor_arguments
from amp_compiler.fx.graph.lower import Lowering, short
from amp_compiler.fx.graph.precision_graph import FxPrecisionGraph
from amp_compiler.fx.graph.views import FLOAT_DTYPES, tensor_dtype
from amp_compiler.report.model import PrecisionReport
from amp_compiler.sizes import format_bytes

__all__ = ["RANGE_RULES", "FxReport", "node_decisions", "node_dtypes", "state_bytes"]

#: The rules observed ranges decide with (:class:`~amp_compiler.passes.analysis.CalibrationRangePass`).
RANGE_RULES = (Rule.PROBE_OVERFLOW, Rule.PROBE_UNDERFLOW, Rule.CALIBRATION_OVERFLOW, Rule.CALIBRATION_UNDERFLOW)


@dataclasses.dataclass
class FxReport:
    """What :func:`amp_compiler.fx.convert` decided, per node, and what it changed."""

    target: str
    mode: str  # "inference" | "training" | "compile"
    decisions: list[NodeDecision]
    casts_inserted: int
    stored_low: dict[str, str]  # parameter/buffer name -> dtype it is now stored in
    parameter_bytes_before: int
    parameter_bytes_after: int
    warnings: list[str] = dataclasses.field(default_factory=list)
    # The names of the graph's outputs as captured, before casts fed them: torch.onnx.export re-traces
    # the module and names outputs after their ops (a Cast: "_to_copy_1"); pass these as its
    # output_names to keep the model's.
    output_names: list[str] = dataclasses.field(default_factory=list)
    flops: dict[str, int] = dataclasses.field(default_factory=dict)  # node -> estimated FLOPs (fx/flops.py)
    # target fp8: the chosen FP8 set's measured error at the outputs (relative L2 vs FP32, worst output,
    # on the calibration samples), the budget it was chosen within, and the model runs the choice took.
    fp8_error: float | None = None
    fp8_budget: float | None = None
    fp8_runs: int = 0
    # What the activation ranges the analysis read were observed on ("the example inputs", "3
    # calibration samples"; empty: none were, and a warning says why) and the FP32 runs that took
    # (amp_compiler.fx.graph.ranges).
    ranges_from: str = ""
    range_runs: int = 0
    # Each output's error against the FP32 graph's on those same inputs, the converted graph run once on
    # each (amp_compiler.fx.graph.accuracy); empty where no ranges were observed.
    accuracy: list[OutputAccuracy] = dataclasses.field(default_factory=list)

    def flops_by_precision(self) -> dict[str, int]:
        """Estimated FLOPs per precision ("fp8", "fp16", "fp32", ...), of the nodes deciding them."""
        out: dict[str, int] = {}
        for d in self.decisions:
            f = self.flops.get(d.node, 0)
            if f:
                out[d.precision] = out.get(d.precision, 0) + f
        return out

    def flops_share(self, precision: str) -> float:
        by_p = self.flops_by_precision()
        total = sum(by_p.values())
        return by_p.get(precision, 0) / total if total else 0.0

    @property
    def parameter_ratio(self) -> float:
        return self.parameter_bytes_after / self.parameter_bytes_before if self.parameter_bytes_before else 1.0

    def decisions_by_rule(self) -> dict[str, int]:
        return count_by_rule(self.decisions)

    def decisions_by_precision(self) -> dict[str, int]:
        return count_by_precision(self.decisions)

    def decision(self, node: str) -> NodeDecision:
        for d in self.decisions:
            if d.node == node:
                return d
        raise KeyError(node)

    def summary(self) -> str:
        by_p = self.decisions_by_precision()
        nodes = ", ".join(f"{p} {n}" for p, n in sorted(by_p.items()))
        if self.mode == "inference":
            params = (
                f"parameters {format_bytes(self.parameter_bytes_before)} -> "
                f"{format_bytes(self.parameter_bytes_after)} ({self.parameter_ratio:.0%})"
            )
        else:
            params = "parameters stay FP32, cast at use"
        by_f = self.flops_by_precision()
        total = sum(by_f.values())
        shares = ", ".join(f"{p} {f / total:.0%}" for p, f in sorted(by_f.items(), key=lambda x: precision_rank(x[0])))
        flops = f" | FLOPs: {shares}" if total else ""
        fp8 = ""
        if self.fp8_error is not None:
            fp8 = f" | FP8 error at the outputs {self.fp8_error:.2%} (budget {self.fp8_budget:.0%})"
        return (f"{self.target} {self.mode} | nodes: {nodes}{flops}{fp8} | casts inserted: {self.casts_inserted} "
                f"| {params}{self._ranges_note()}")

    def _ranges_note(self) -> str:
        """The summary's word on observed ranges: what they were seen on, and how many nodes they kept
        FP32, and BF16 (the range fallback's matrix products; the ONNX summary's probe note)."""
        if not self.ranges_from:
            return ""
        rules = {r.value for r in RANGE_RULES}
        moved = Counter(d.precision for d in self.decisions if d.rule in rules)
        bf16 = moved.pop("bf16", 0) if self.target == "fp16" else 0
        kept = f"{moved.total()} node(s) kept FP32" + (f" and {bf16} BF16" if bf16 else "")
        note = f" | ranges from {self.ranges_from} ({self.range_runs} FP32 run(s)): {kept} by them"
        return note + self._accuracy_note()

    def _accuracy_note(self) -> str:
        """The summary's measured error: the worst float output's max error of range and its cosine (NaN/Inf
        where FP32 is finite first), and any integer/bool output's changed values (the ONNX summary's)."""
        floats = [a for a in self.accuracy if not a.exact and a.measured]
        parts = []
        if floats:
            worst = min(floats, key=lambda a: (a.finite, -a.error_of_range))
            error = "NaN/Inf" if not worst.finite else f"max error {worst.error_of_range:.2%} of range"
            named = f" ({worst.name})" if len(floats) > 1 else ""
            parts.append(f"{error}{named}, cosine {worst.cosine:.5f}")
        parts += [f"{a.name}: {a.changed} of {a.values} values changed" for a in self.accuracy if a.exact and a.changed]
        return f" | output vs FP32 on them: {'; '.join(parts)}" if parts else ""


    def table(self, verbose: bool = False) -> str:
        rows = [("node", "op", "precision", "rule")] + [
            (d.node, d.op_type, d.precision, d.rule) for d in self.decisions
        ]
        widths = [min(max(len(r[i]) for r in rows), 48) for i in range(4)]
        lines = [self.summary()]
        for k, r in enumerate(rows):
            lines.append("  ".join(c[:w].ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
            if verbose and k:
                lines.append("    " + self.decisions[k - 1].reason)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_precision_report(self, model: str = "GraphModule") -> PrecisionReport:
        """The report as :class:`amp_compiler.report.model.PrecisionReport`, for its renderers."""
        from amp_compiler.report.model import NodeReport, PrecisionReport, Summary

        nodes = [
            NodeReport(
                graph=d.graph, name=d.node, op_type=d.op_type, domain=d.domain, precision=d.precision,
                rule=d.rule, reason=d.reason, input_dtypes=d.input_dtypes, output_dtypes=d.output_dtypes,
                flops=self.flops.get(d.node),
            )
            for d in self.decisions
        ]
        by_f = self.flops_by_precision()
        summary = Summary(
            target=self.target, provider="torch", nodes=len(nodes),
            nodes_by_precision=self.decisions_by_precision(), flops_total=sum(by_f.values()),
            flops_low=sum(f for p, f in by_f.items() if p in LOW_PRECISIONS),
            casts=self.casts_inserted, cast_bytes=0, size_before=self.parameter_bytes_before,
            size_after=self.parameter_bytes_after,
        )
        return PrecisionReport(model=model, summary=summary, nodes=nodes, warnings=list(self.warnings))


def state_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's parameters and buffers, each storage counted once (tied weights)."""
    seen: set[int] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def node_dtypes(node: fx.Node, outputs: bool) -> list[str]:
    """Short names of the dtypes a node produces (``outputs``) or reads (its tensor arguments)."""
    if outputs:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return [short(val.dtype)]
        if isinstance(val, (tuple, list)):
            return [short(v.dtype) if isinstance(v, torch.Tensor) else "" for v in val]
        return []
    return [short(tensor_dtype(t)) or "?" for _, t in tensor_arguments(node)]


def node_decisions(
    gm: fx.GraphModule,
    fxg: FxPrecisionGraph,
    plan: PrecisionPlan,
    lowering: Lowering,
    order: dict[fx.Node, int],
    *,
    training: bool,
    weight_placeholders: AbstractSet[fx.Node] = frozenset(),
) -> list[NodeDecision]:
    """One decision per node of the converted graph (inserted casts included), in graph order."""
    own_slots: dict[fx.Node, list] = {}
    for s in fxg.slots:
        if s.kind in (SlotKind.NODE_IN, SlotKind.NODE_OUT):
            own_slots.setdefault(s.owner, []).append(s)
    const_users: dict[fx.Node, set[str]] = {}
    for src, slots in fxg.constant_slots.items():
        const_users[src] = {s.owner.name for s in slots}
    out = []
    for node in gm.graph.nodes:
        precision, rule, reason = NO_FLOAT, Rule.NONFLOAT.value, "no float inputs or outputs"
        op_type = str(node.target) if node.op in ("call_function", "call_module", "call_method") else node.op
        domain = "aten" if op_type.startswith("aten.") else "fx"
        if node in lowering.casts:
            c = lowering.casts[node]
            precision, rule = short(c.dtype), Rule.LOWERING_CAST.value
            reason = f"Cast inserted: {', '.join(c.users)} need(s) {c.source.name!r} as {short(c.dtype)}"
        elif node.op == "placeholder":
            if node in weight_placeholders:
                precision, rule = short(tensor_dtype(node)), Rule.CONSTANT.value
                reason = (
                    "parameter passed as a graph input: read as it is, or through a cast where a user needs "
                    "another type"
                )
            elif tensor_dtype(node) in FLOAT_DTYPES and node in fxg.defining:
                precision, rule, reason = short(tensor_dtype(node)), Rule.FIXED.value, "graph inputs keep their dtype"
        elif node.op == "get_attr":
            dtype = tensor_dtype(node)
            dtype = dtype if dtype in FLOAT_DTYPES else None
            target = str(node.target)
            users = ", ".join(sorted(const_users.get(node, ()))) or "no float computation"
            if target in lowering.stored:
                stored = lowering.stored[target]
                precision, rule = short(stored.after), Rule.CONSTANT_STORED_LOW.value
                reason = (
                    f"stored in {short(stored.after)} (was {short(stored.before)}): every use ({users}) computes "
                    f"in {short(stored.after)}"
                )
            elif dtype is not None and node in fxg.constant_slots:
                precision, rule = short(dtype), Rule.CONSTANT.value
                if training:
                    reason = (
                        f"FP32 master {_kind(gm, target)}: users ({users}) read it through a cast where they "
                        "compute in another type; gradients flow back through the cast"
                    )
                else:
                    reason = f"kept {short(dtype)}: read by {users}, not all in one other type"
            elif dtype is not None:
                precision, rule = short(dtype), Rule.CONSTANT.value
                readers = sorted(
                    f"{n.name}'s {tensor_arguments(n)[k][0]!r}"
                    for (n, k), src in fxg.fixed_inputs.items() if src is node
                )
                if readers:
                    reason = (
                        f"kept {short(dtype)}: read as it is by {', '.join(readers)} (a mixed-type kernel argument)"
                    )
                else:
                    reason = "read as it is: no float computation reads it"
        elif node.op == "output":
            dts = sorted({d for d in node_dtypes(node, False) if d and d != "?"})
            if dts:
                precision = dts[0] if len(dts) == 1 else MIXED
                rule, reason = Rule.FIXED.value, "graph outputs keep their dtype"
        elif node.op == "call_function" and node.target is operator.getitem:
            src = node.args[0]
            vid = fxg.main_vertex.get(src)
            if vid is not None and tensor_dtype(node) is not None:
                precision = short(tensor_dtype(node))
                rule = plan.decisions[vid].rule.value
                reason = f"element {node.args[1]} of {src.name}: {plan.decisions[vid].reason}"
        elif node in fxg.observers:
            precision, rule = NO_FLOAT, Rule.OBSERVER.value
            reason = "checks the inputs' shapes" if node.op == "call_module" else "checks a tensor's metadata"
            if node in lowering.dtype_rewrites:
                reason += f"; its expected dtype follows the tensor ({short(lowering.dtype_rewrites[node])})"
        elif node in fxg.main_vertex:
            main = fxg.main_vertex[node]
            dtypes = {lowering.slot_dtypes[s] for s in own_slots.get(node, ())}
            decision = plan.decisions[main]
            precision = short(next(iter(dtypes))) if len(dtypes) == 1 else MIXED
            rule, reason = decision.rule.value, decision.reason
            if main in plan.notes:
                reason = f"{reason}; {plan.notes[main]}"
            if node in lowering.dtype_rewrites and node in fxg.dtype_arg_slots:
                reason += f" (its dtype argument is now {short(lowering.dtype_rewrites[node])})"
        out.append(
            NodeDecision(
                graph="main",
                node=node.name,
                op_type=op_type,
                domain=domain,
                precision=precision,
                rule=rule,
                reason=reason,
                input_dtypes=node_dtypes(node, False),
                output_dtypes=node_dtypes(node, True),
                index=order.get(node),
            )
        )
    return out


def _kind(gm: fx.GraphModule, target: str) -> str:
    names = dict(gm.named_parameters(remove_duplicate=False))
    return "parameter" if target in names else "buffer"
