"""Compare a converted model with its FP32 original: the outputs, and where in the graph the error grows.

    samples (or the inputs convert's range probe generates) -> both models run with every main-graph
       float tensor exposed
    -> per float output: cosine, max error of range, NaN/Inf, argmax agreement, and its error under the
       metric (``metric``: relative L2 by default, or any other :data:`amp_compiler.core.tensor_error.ErrorMetric`,
       the user's callable included: the one error ``--tolerance`` and the FP8 budget hold); per integer
       or bool output (labels, indices): the share of its values that differ from FP32's
    -> per tensor of the FP32 graph matched by name in the converted one: its error against FP32 and
       how much it grew over the node's inputs -> the nodes where it grows most, with the rule that
       decided each (when a default conversion of the FP32 model reproduces that node)

On the CPU provider the converted model runs through :func:`amp_compiler.onnx.measure.emulate.emulate`, which rounds
every FP16/BF16 tensor exactly as a GPU stores it (onnxruntime's CPU kernels would hide it); on the CUDA
provider its real kernels run. The FP32 reference always runs on the CPU. Tensors are matched by name,
so any pair works, other tools' conversions included (onnxconverter-common keeps tensor names and adds
its Casts under new ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.shape_inference
import onnx_ir as ir

from amp_compiler.core.tensor_error import (
    ArgmaxAgreement,
    ChangedValues,
    ErrorMetric,
    ErrorStats,
    Metric,
    OutputErrors,
    is_exact,
    metric_name,
    parse_metric,
)
from amp_compiler.dtypes import short_name
from amp_compiler.errors import ModelRunError, OptionError, RunBudgetError
from amp_compiler.onnx.convert import convert
from amp_compiler.onnx.measure.calibrate import IntermediateRunner
from amp_compiler.onnx.measure.emulate import emulate, stored_values
from amp_compiler.onnx.measure.range_probe import probe_samples
from amp_compiler.onnx.write.tf32 import fp32_products_warnings
from amp_compiler.runtime.runner import Runner, default_runner
from amp_compiler.targets import Provider, Target

__all__ = ["Comparison", "NodeComparison", "OutputComparison", "SCHEMA_VERSION", "compare_models"]

SCHEMA_VERSION = 3  # 2: the metric, and each output's error under it; 3: integer/bool outputs' changed values


@dataclasses.dataclass
class OutputComparison:
    """One output of the converted model against the FP32 model's, over the samples. An integer or bool
    output (a label, an index) is compared value by value: ``changed`` is the share of its values that
    differ (None for a float output), and its float fields are its values' statistics as numbers."""

    name: str
    cosine: float
    max_abs_error: float
    error_of_range: float  # max |error| / (max - min) of the FP32 output
    nonfinite: int  # NaN/inf values where FP32 is finite
    argmax_agreement: float | None  # ArgmaxAgreement.share: rows whose argmax agrees (None: no argmax)
    error: float = 0.0  # under the comparison's metric (a callable metric's one value, for every output; 0
    # for an integer output, which no metric measures: ``changed`` does)
    changed: float | None = None  # integer/bool output: the share of its values that differ from FP32's
    changed_values: int = 0  # ... how many
    values: int = 0  # ... of how many


@dataclasses.dataclass
class NodeComparison:
    """The error of one node's output in the converted model, and how much of it the node added."""

    position: int  # in the FP32 model's main graph
    node: str
    op_type: str
    tensor: str
    precision: str  # the tensor's type in the converted model ("fp16", "fp32", ...)
    rel_l2: float
    error_of_range: float
    growth: float  # rel_l2 minus the largest rel_l2 among the node's float inputs
    nonfinite: int
    rule: str | None = None  # the rule that decided the node, when a default conversion reproduces it
    reason: str | None = None


@dataclasses.dataclass
class Comparison:
    fp32: str
    converted: str
    provider: str
    emulated: bool  # the converted model ran through exact low-precision emulation
    samples: int
    generated_inputs: bool  # no data given: inputs were generated
    outputs: list[OutputComparison]
    growth: list[NodeComparison]  # the nodes where the error grows most, in graph order
    first_nonfinite: NodeComparison | None  # the first node whose output has NaN/inf where FP32 has none
    tensors_compared: int
    decisions: str  # where the rules come from
    warnings: list[str] = dataclasses.field(default_factory=list)
    metric: str = Metric.REL_L2.value  # the metric of ``error`` and each output's ``error``
    error: float = 0.0  # the worst float output's error under the metric (0 when there is none)
    changed: float | None = None  # the largest share of changed values of an integer/bool output (None: none)
    tf32: bool = False  # emulated with the FP32 Tensor Core ops' operands read as TF32 (a GPU's default)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def compare_models(
    fp32: onnx.ModelProto,
    converted: onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]] | None = None,
    *,
    provider: Provider = Provider.CPU,
    top: int = 5,
    names: tuple[str, str] = ("fp32", "converted"),
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    runner: Runner | None = None,
    metric: ErrorMetric | str = Metric.REL_L2,
    tf32: bool = False,
) -> Comparison:
    """Run both models on ``samples`` (default: the range probe's generated samples, those ``convert`` ran
    without data, :func:`~amp_compiler.onnx.measure.range_probe.probe_samples`; ``input_shapes`` fixing
    dynamic dims) and compare them (see the module docstring). ``top``: how many nodes of largest error growth
    to name. ``runner``: where the models run (default: a child process with the default budget).
    ``metric``: the outputs' error (a :class:`~amp_compiler.targets.Metric` or its name, or a callable
    ``(fp32_outputs, converted_outputs) -> float`` over dicts of float outputs, one array per sample).
    ``tf32``: the emulation reads the converted model's FP32 Tensor Core operands as TF32, as onnxruntime's
    CUDA provider and TensorRT run them by default (:func:`~amp_compiler.onnx.measure.emulate.emulate`;
    the CPU provider only: on ``cuda`` onnxruntime's own ``use_tf32`` decides, on by default).
    Raises :class:`ModelRunError` when onnxruntime cannot run either model."""
    metric = parse_metric(metric)
    if tf32 and provider is not Provider.CPU:
        raise OptionError("TF32 is emulated on the cpu provider; on cuda onnxruntime's use_tf32 decides "
                          "(on by default)", option="tf32")
    runner, owned = default_runner(runner)
    try:
        given = list(samples) if samples else None
        return _compare(fp32, converted, given, provider, top, names, input_shapes, runner, metric, tf32)
    finally:
        if owned:
            runner.close()


def _compare(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]] | None,
    provider: Provider, top: int, names: tuple[str, str], input_shapes: dict[str, tuple[int, ...]] | None,
    runner: Runner, metric: ErrorMetric = Metric.REL_L2, tf32: bool = False,
) -> Comparison:
    generated = ""  # how the inputs were generated, when no samples were given
    if not samples:
        probe = probe_samples(fp32, runner, input_shapes=input_shapes)
        samples, generated = probe.samples, probe.inputs
    emulated = provider is Provider.CPU
    reference = _runner(fp32, runner, Provider.CPU, names[0])
    runnable = emulate(converted, tf32=tf32) if emulated else converted
    try:
        candidate = _runner(runnable, runner, provider, names[1])
    except BaseException:
        reference.close()
        raise
    try:
        found = _measure(fp32, converted, samples, reference, candidate, provider, top, names, generated, metric)
        if emulated and not tf32:
            found.warnings.extend(fp32_products_warnings(converted, names[1]))
        return dataclasses.replace(found, tf32=tf32)
    finally:
        reference.close()
        candidate.close()


def _measure(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    reference: IntermediateRunner, candidate: IntermediateRunner, provider: Provider, top: int,
    names: tuple[str, str], generated: str, metric: ErrorMetric = Metric.REL_L2,
) -> Comparison:
    emulated = provider is Provider.CPU

    outputs = [o.name for o in fp32.graph.output]
    floats: list[str] | None = None  # the float outputs both models give (the first sample tells)
    by_metric: OutputErrors | None = None
    out_stats = {name: ErrorStats() for name in outputs}
    agree = {name: ArgmaxAgreement() for name in outputs}
    changed = {name: ChangedValues() for name in outputs}  # integer/bool outputs, value by value
    tensors: dict[str, ErrorStats] = {}
    for sample in samples:
        ref = _run(reference, sample, names[0])
        got = stored_values(_run(candidate, sample, names[1]))
        for name, value in ref.items():
            if name in got and np.issubdtype(np.asarray(value).dtype, np.floating):
                tensors.setdefault(name, ErrorStats()).add(value, got[name])
        for name in outputs:
            if name in ref and name in got and np.issubdtype(np.asarray(ref[name]).dtype, np.floating):
                out_stats[name].add(ref[name], got[name])
                agree[name].add(ref[name], got[name])
            elif name in ref and name in got and is_exact(ref[name]):  # emulated exactly: a change is real
                if changed[name].add(ref[name], got[name]):
                    out_stats[name].add(ref[name], got[name])
        if floats is None:
            floats = [n for n in outputs
                      if n in ref and n in got and np.issubdtype(np.asarray(ref[n]).dtype, np.floating)]
            by_metric = OutputErrors(len(floats), metric, floats)
        assert by_metric is not None
        by_metric.add([np.asarray(ref[n], dtype=np.float64) for n in floats],
                      [np.asarray(got[n], dtype=np.float64) for n in floats])

    warnings = []
    if generated:
        warnings.append(f"inputs were generated as convert's range probe makes them ({generated}): "
                        "give data for real ones")
    missing = [n for n in outputs if out_stats[n].count == 0 and changed[n].values == 0]
    if missing:
        warnings.append(f"outputs not compared (neither float nor integer, or absent from {names[1]}): "
                        f"{', '.join(missing)}")
    exact = {n: c for n, c in changed.items() if c.values}
    errors = _node_errors(fp32, converted, tensors)
    decisions = _attach_rules(fp32, converted, errors)
    masks = [e for e in errors if _held_beyond_range(tensors[e.tensor])]
    if masks:
        listed = ", ".join(e.node or f"{e.op_type} #{e.position}" for e in masks[:3])
        listed += " ..." if len(masks) > 3 else ""
        warnings.append(f"not ranked: {len(masks)} tensor(s) with FP32 values beyond FP16's range that the converted "
                        f"model holds finite ({listed}): attention masks' -infinity written as -32768 by design, whose "
                        "softmax is the same on every row that keeps a key")
    ranked = [e for e in errors if e not in masks]
    growth = sorted(sorted(ranked, key=lambda e: -e.growth)[:top], key=lambda e: e.position)
    first_bad = next((e for e in errors if e.nonfinite), None)
    by_output = dict(zip(floats or [], by_metric.relative() if by_metric is not None else [], strict=True))
    return Comparison(
        fp32=names[0], converted=names[1], provider=provider.value, emulated=emulated,
        samples=len(samples), generated_inputs=bool(generated),
        outputs=[_output(name, out_stats[name], agree[name], by_output.get(name, 0.0), exact.get(name))
                 for name in outputs if out_stats[name].count or name in exact],
        growth=[e for e in growth if e.growth > 0], first_nonfinite=first_bad,
        tensors_compared=len(tensors), decisions=decisions, warnings=warnings,
        metric=metric_name(metric), error=max(by_output.values(), default=0.0),
        changed=max((c.share for c in exact.values()), default=None),
    )


def _runner(model: onnx.ModelProto, runner: Runner, provider: Provider, name: str) -> IntermediateRunner:
    try:
        return IntermediateRunner(model, runner, provider)
    except (OptionError, RunBudgetError):
        raise
    except ModelRunError as exc:  # onnxruntime refuses the model: a user-facing problem of that file
        raise ModelRunError(f"{name}: {exc}") from None


def _run(runner: IntermediateRunner, sample: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    try:
        return runner.run(sample)
    except RunBudgetError:
        raise
    except ModelRunError as exc:
        raise ModelRunError(f"{name}: {exc}") from None


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def _output(
    name: str, s: ErrorStats, agree: ArgmaxAgreement, error: float, changed: ChangedValues | None = None,
) -> OutputComparison:
    if changed is not None:
        return OutputComparison(name, s.cosine, s.max_abs, s.error_of_range, s.nonfinite, None, 0.0,
                                changed.share, changed.changed, changed.values)
    return OutputComparison(name, s.cosine, s.max_abs, s.error_of_range, s.nonfinite, agree.share, error)


def _types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _node_errors(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, tensors: dict[str, ErrorStats]
) -> list[NodeComparison]:
    """One entry per FP32 main-graph node whose first float output was compared, in graph order. Its
    precision is the type its namesake in the converted model writes (a node that writes a graph output
    kept FP32 writes a low-precision tensor, which a Cast takes to the output's name), else the type of
    the tensor of its output's name (an unnamed node's: of what the Cast writing it reads, where one does)."""
    types = _types(converted)
    written = {n.name: list(n.output) for n in converted.graph.node if n.name}
    producers = {o: n for n in converted.graph.node for o in n.output}
    fp8 = fp8_readers(converted, types)
    rel = {name: s.rel_l2 for name, s in tensors.items()}
    out = []
    for i, node in enumerate(fp32.graph.node):
        tensor = next((o for o in node.output if o in tensors), None)
        if tensor is None:
            continue
        s = tensors[tensor]
        worst_in = max((rel.get(x, 0.0) for x in node.input if x), default=0.0)
        namesake = written.get(node.name) if node.name else None
        k = list(node.output).index(tensor)
        dtype = types.get(namesake[k]) if namesake is not None and k < len(namesake) else None
        writer = producers.get(tensor)
        if dtype is None and writer is not None and writer.op_type == "Cast" != node.op_type:
            dtype = types.get(writer.input[0])  # an unnamed node's output, cast to the graph output's type
        dtype = dtype or types.get(tensor)
        precision = short_name(ir.DataType(dtype)) if dtype else "?"
        if node.name and node.name in fp8:
            precision = short_name(ir.DataType.FLOAT8E4M3FN)  # its inputs: FP8 values, dequantized
        out.append(NodeComparison(
            position=i, node=node.name, op_type=node.op_type, tensor=tensor,
            precision=precision,
            rel_l2=s.rel_l2, error_of_range=s.error_of_range, growth=s.rel_l2 - worst_in, nonfinite=s.nonfinite,
        ))
    return out


def _held_beyond_range(stats: ErrorStats) -> bool:
    """Whether a tensor's FP32 values go below FP16's lowest and the converted model holds another finite
    value there, not a rounding of it (its largest error is of the order of that value): an attention
    mask's -infinity (float32's lowest, -1e9) that the conversion writes as -32768 on purpose. A real
    overflow is -inf (non-finite), and a value a range fallback keeps (BF16, scaled FP16) is near FP32's."""
    lowest = stats.ref_min
    return lowest < -float(np.finfo(np.float16).max) and stats.nonfinite == 0 and stats.max_abs > -lowest / 2


_FLOAT8 = frozenset(int(t) for t in (ir.DataType.FLOAT8E4M3FN, ir.DataType.FLOAT8E4M3FNUZ, ir.DataType.FLOAT8E5M2,
                                       ir.DataType.FLOAT8E5M2FNUZ))


def fp8_readers(model: onnx.ModelProto, types: dict[str, int]) -> set[str]:
    """The names of ``model``'s main-graph nodes (but Q/DQ nodes) reading the output of a DequantizeLinear
    of a float8 tensor: the GEMMs an FP8 conversion gives FP8 inputs (``types``: element types by name)."""
    dequantized = {n.output[0] for n in model.graph.node
                   if n.op_type == "DequantizeLinear" and n.input and types.get(n.input[0]) in _FLOAT8}
    return {n.name for n in model.graph.node if n.name and n.op_type not in ("QuantizeLinear", "DequantizeLinear")
            and any(i in dequantized for i in n.input)}


def _target_of(types: dict[str, int]) -> Target:
    """BF16 for a model with BF16 tensors and no FP16 ones; FP16 otherwise (FP16 and BF16 together: an
    FP16 conversion with BF16 range fallbacks)."""
    found = set(types.values())
    return Target.BF16 if onnx.TensorProto.BFLOAT16 in found and onnx.TensorProto.FLOAT16 not in found else Target.FP16


def _attach_rules(fp32: onnx.ModelProto, converted: onnx.ModelProto, errors: list[NodeComparison]) -> str:
    """Give each node the rule a default conversion of ``fp32`` decides for it, where the converted
    model's node of that name has the precision that conversion gives it; returns where the rules
    came from, in a sentence."""
    types = _types(converted)
    fp8 = fp8_readers(converted, types)
    if fp8:  # its FP8 choices come from calibration data: a default conversion makes none of them
        return (f"no rules: the converted model is an FP8 conversion ({len(fp8)} node(s) read FP8 inputs through "
                "Q/DQ), chosen from calibration data compare does not have; the conversion's own report "
                "(convert --report) gives its rules")
    target = _target_of(types)
    # FP16 and BF16 together: an FP16 conversion with BF16 range fallbacks (the default scales them in FP16)
    mixed = target is Target.FP16 and onnx.TensorProto.BFLOAT16 in set(types.values())
    how = f"{target.value} conversion" + (" (BF16 range fallbacks)" if mixed else "")
    try:
        fresh = convert(fp32, target=target, range_fallback="bf16" if mixed else None)
    except Exception as exc:  # the FP32 model does not convert: the comparison stands without rules
        return f"no rules: a default conversion of the FP32 model failed ({_first_line(exc)})"
    decided = fresh.decisions
    if _same_nodes(fresh.model, converted, types):  # unnamed nodes too: each error's node by its position
        by_index = {d.index: d for d in decided if d.index is not None}
        for e in errors:
            d = by_index.get(e.position)
            if d is not None:
                e.rule, e.reason = d.rule, d.reason
        return f"rules: the converted model is what a default {how} of the FP32 model makes"
    by_name = {d.node: d for d in decided if d.node and d.index is not None}
    nodes = [n for n in converted.graph.node if n.name in by_name]
    def dtypes(node: onnx.NodeProto) -> list[str]:
        return [short_name(ir.DataType(types[o])) if o in types else "?" for o in node.output]

    same = {
        n.name for n in nodes
        if by_name[n.name].op_type == n.op_type and by_name[n.name].output_dtypes == dtypes(n)
    }
    for e in errors:
        d = by_name.get(e.node)
        if d is not None and e.node in same:
            e.rule, e.reason = d.rule, d.reason
    main = [n for n in fp32.graph.node if n.name]
    unnamed = len(fp32.graph.node) - len(main)
    if not main:
        return (f"no rules: the converted model is not what a default {how} of the FP32 model makes, and "
                "the FP32 model's nodes have no names to match the converted model's by")
    made = {d.node for d in decided if d.node}
    added = [n for n in converted.graph.node if not n.name or n.name not in made]
    if len(same) == len(main) and not unnamed and not added:
        return f"rules: the converted model is what a default {how} of the FP32 model makes"
    unmatched = f"; {unnamed} unnamed node(s) cannot be matched" if unnamed else ""
    if added:
        unmatched += f"; it has {len(added)} node(s) a default {how} does not make"
    return (
        f"rules: {len(same)} of {len(main)} named nodes have the precision a default {how} "
        f"of the FP32 model gives them (another tool or other options made the rest{unmatched}); "
        "rules are shown for those"
    )


def _same_nodes(fresh: onnx.ModelProto, converted: onnx.ModelProto, types: dict[str, int]) -> bool:
    """Whether ``converted``'s main graph is ``fresh``'s node for node: the same ops reading and writing
    the same tensors, of the same element types (a model written by a default conversion, its nodes
    named or not)."""
    if len(fresh.graph.node) != len(converted.graph.node):
        return False
    fresh_types = _types(fresh)
    for a, b in zip(fresh.graph.node, converted.graph.node, strict=True):
        if (a.op_type, a.domain, list(a.input), list(a.output)) != (b.op_type, b.domain, list(b.input), list(b.output)):
            return False
        if any(fresh_types.get(o) != types.get(o) for o in b.output):
            return False
    return True
