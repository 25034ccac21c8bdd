"""The switched probe: one model, loaded once, whose named switches (bool inputs) each turn one part
of a conversion on, and the error a set of switches on gives at its outputs, measured on the
samples. The one probe behind ``--tolerance`` (:mod:`amp_compiler.onnx.tolerance.refine`) and the FP8
budget (:mod:`amp_compiler.onnx.fp8.budget`).

Two kinds of switch, any number of each:

- *group* switches (``--tolerance`` must know what pinning each unit, or part of one, would remove
  from the output error; a node's own *added* error says little about what reaches the outputs).
  The probe is then the converted model under exact FP16/BF16 storage emulation
  (:mod:`amp_compiler.onnx.measure.emulate`), with a bool input per *group* (disjoint sets of the
  main graph's nodes). What a node reads is rounded, as the low-precision model stores it, when its
  producer's group or its own group is on (a tensor between two pinned nodes stays FP32; one between
  a pinned and a low-precision node goes through a Cast), and exact otherwise; a low-precision weight
  or constant reads as stored when its reader's group is on, else as the FP32 model holds it.
- *FP8* switches: when one is on, its GEMM reads each data input through exactly the converted
  model's Q/DQ arithmetic (:mod:`amp_compiler.onnx.measure.fp8_view`: an activation's value in the
  fallback type quantized with its calibration scale, a weight quantized from its FP32 values) instead
  of what it read: a ``Where`` on the switch. Without a conversion (the FP8 budget's probe) the probe
  is the FP32 model with FP8 switches only.

The probe computes

- with every switch on: the emulated converted model, bit for bit (when the groups cover its
  low-precision nodes and the FP8 switches its FP8 GEMMs);
- with every switch off: the FP32 model up to FP32's own rounding (onnxruntime fuses the FP32 ops
  differently around the switches: 1e-6 relative), except what no group controls (roundings inside
  If/Loop bodies, tables stored low for FP32 readers). :attr:`SwitchProbe.base` measures the error
  left with every switch off; without a conversion it is 0: the all-off run is the reference.

Guarantees: :meth:`SwitchProbe.error` is the worst error of the float graph outputs against the
FP32 model on the calibration samples under the probe's metric (relative L2 by default, summed over
samples per output: :class:`amp_compiler.core.tensor_error.OutputErrors`, the one place the error of
a run is computed); :meth:`SwitchProbe.held_error` the same on the held-out samples; infinite when
an output is not finite where FP32 is. The probe never changes the models it is
given, and holds each weight once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnx_ir as ir

from amp_compiler.core.decision import NodeDecision
from amp_compiler.core.tensor_error import ErrorMetric, Metric, OutputErrors, relative_l2
from amp_compiler.onnx.ir.walk import node_order
from amp_compiler.onnx.measure.emulate import emulate_in_place, typed_model
from amp_compiler.onnx.measure.fp8_view import fp8_view
from amp_compiler.passes.onnx.qdq import Fp8Candidate
from amp_compiler.runtime.runner import Runner

__all__ = ["SwitchProbe", "build_probe", "exact_name", "switch_name"]

_LOW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def switch_name(k: int) -> str:
    """The probe's bool input that turns switch ``k`` on."""
    return f"amp_switch{k}"


def exact_name(constant: str) -> str:
    """The name of the FP32 copy of a low-precision constant that the probe reads when switched off."""
    return f"{constant}__exact"


_TAG = "amp_compiler.probe.position"  # metadata of an FP8 switch's GEMM until it is switched: its position


def build_probe(
    fp32: onnx.ModelProto, converted: onnx.ModelProto | None = None, decisions: Sequence[NodeDecision] = (),
    groups: Sequence[Collection[int]] = (), *, fp8: Mapping[int, Fp8Candidate] | None = None,
    fp8_switches: Mapping[int, int] | None = None,
) -> onnx.ModelProto:
    """The probe (see module doc) of ``converted`` (whose ``decisions`` are one per node, in node
    order), a conversion of ``fp32``, with switch ``k`` for group ``groups[k]`` (disjoint sets of
    positions in ``fp32``'s main graph), and switch ``fp8_switches[p]`` for the FP8 candidate
    ``fp8[p]`` at position ``p``. Without ``converted``: ``fp32`` with the FP8 switches only."""
    fp8, fp8_switches = fp8 or {}, fp8_switches or {}
    positions: list[int | None]
    if converted is None:
        probe = onnx.ModelProto()
        probe.CopyFrom(fp32)
        positions = list(range(len(probe.graph.node)))
    else:
        probe = _switched_conversion(fp32, converted, decisions, groups, fp8)
        positions = [_untag(node) for node in probe.graph.node]
    return _add_fp8_switches(probe, positions, fp8, fp8_switches, exact_weights=converted is not None)


def _switched_conversion(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, decisions: Sequence[NodeDecision],
    groups: Sequence[Collection[int]], tagged: Collection[int],
) -> onnx.ModelProto:
    """The emulated conversion with its group switches; the nodes at the positions ``tagged`` carry
    their position in their metadata (:data:`_TAG`), for the FP8 switches."""
    m = typed_model(converted)
    group_at = {pos: k for k, group in enumerate(groups) for pos in group}
    main = list(m.graph)
    in_main = {id(n) for n in main}
    group_of: dict[int, int] = {}  # id(node) -> its group
    fp32_inputs: dict[int, Sequence[str]] = {}  # id(node) -> the node's input names in the FP32 model
    for node, d in zip(node_order(m), decisions, strict=True):
        if d.index is not None and d.index < len(fp32.graph.node) and id(node) in in_main:
            fp32_inputs[id(node)] = fp32.graph.node[d.index].input
            if d.index in tagged:
                node.metadata_props[_TAG] = str(d.index)
            if d.index in group_at:
                group_of[id(node)] = group_at[d.index]
    low_constants = {v for v in m.graph.initializers.values() if v.dtype in _LOW}
    low_constants |= {n.outputs[0] for n in main if n.op_type == "Constant" and n.outputs[0].dtype in _LOW}
    rounded = emulate_in_place(m)
    _Switches(m, len(groups), group_of, fp32_inputs, rounded, low_constants, _constants(fp32.graph)).insert(main)
    out = ir.to_proto(m)
    out.ir_version = converted.ir_version
    return out


def _untag(node: onnx.NodeProto) -> int | None:
    """The position a node was tagged with (:data:`_TAG`), the tag removed; None if it has none."""
    tags = [e for e in node.metadata_props if e.key == _TAG]
    for entry in tags:
        node.metadata_props.remove(entry)
    return int(tags[0].value) if tags else None


def _add_fp8_switches(
    probe: onnx.ModelProto, positions: Sequence[int | None], candidates: Mapping[int, Fp8Candidate],
    switches: Mapping[int, int], exact_weights: bool,
) -> onnx.ModelProto:
    """``probe`` (changed in place and returned) where each node at a position in ``candidates``
    (``positions``: each node's, or None) reads its data inputs through a ``Where`` on switch
    ``switches[position]`` between their FP8 view and what it read. A weight's view reads its FP32
    values: the probe's own when it holds them, else (``exact_weights``: the conversion's probe
    holds the weight rounded) the FP32 copy the group switches keep, or one added here."""
    graph = probe.graph
    initializers = {t.name for t in graph.initializer}
    nodes = []
    for node, position in zip(list(graph.node), positions, strict=True):
        if position is None or position not in candidates:
            nodes.append(node)
            continue
        for inp in candidates[position].inputs:
            source = inp.name
            if inp.weight is not None and exact_weights:
                source = exact_name(inp.name)
                if source not in initializers:
                    graph.initializer.append(onnx.numpy_helper.from_array(inp.weight, source))
                    initializers.add(source)
            view = fp8_view(inp, f"fp8switch{position}_{inp.index}_", source)
            nodes += view.nodes
            graph.initializer.extend(view.initializers)
            chosen = f"fp8switch{position}_{inp.index}_in"
            nodes.append(oh.make_node("Where", [switch_name(switches[position]), view.fp8, node.input[inp.index]],
                                      [chosen]))
            node.input[inp.index] = chosen
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    declared = {i.name for i in graph.input}
    graph.input.extend(oh.make_tensor_value_info(switch_name(k), onnx.TensorProto.BOOL, [])
                       for k in sorted(set(switches[p] for p in candidates)) if switch_name(k) not in declared)
    return probe


def _constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The main graph's constant tensors by name: initializers and Constant nodes' ``value``."""
    found = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    found[node.output[0]] = attr.t
    return found


class _Switches:
    """Inserts the nodes that choose, per reading node, the rounded or the exact value: an If on the
    switches whose branches are Identities (what a Where computes, bit for bit; onnxruntime's CPU
    Where on a scalar condition took 56% of a probe run of ppocr-v4-det, its If with one Identity
    per branch a copy: a probe run 0.6-0.7 s instead of 0.9-1.1 s at 320x448). A rounded copy's
    round trip (``Cast(low) -> Cast(float)``, :func:`amp_compiler.onnx.measure.emulate.emulate_in_place`)
    runs inside the branch taken when the switches are on, and leaves the main graph when nothing
    else reads it: a run computes only the roundings its switches turn on."""

    def __init__(self, m: ir.Model, n_groups: int, group_of: dict[int, int],
                 fp32_inputs: dict[int, Sequence[str]], rounded: dict[ir.Value, ir.Value],
                 low_constants: set[ir.Value], constants: dict[str, onnx.TensorProto]):
        self.graph = m.graph
        self.group_of, self.fp32_inputs, self.rounded = group_of, fp32_inputs, rounded
        self.low_constants, self.constants = low_constants, constants
        self.switches = [ir.Value(name=switch_name(k), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
                         for k in range(n_groups)]
        self.graph.inputs.extend(self.switches)
        self.conditions: dict[frozenset[int], ir.Value] = {}
        self.chosen: dict[tuple[ir.Value, frozenset[int]], ir.Value] = {}
        self.exact_constants: dict[str, ir.Value] = {}
        self.branches = 0  # the If branches made, for their values' names

    def insert(self, nodes: Iterable[ir.Node]) -> None:
        for node in nodes:
            own = self.group_of.get(id(node))
            for k, value in enumerate(node.inputs):
                if value is None:
                    continue
                exact, on = self._exact(node, k, value, own)
                if exact is not None and on:
                    node.replace_input_with(k, self._where(value, exact, on, before=node))
        for i, value in enumerate(self.graph.outputs):
            exact = self.rounded.get(value)
            on = self._groups_of(exact.producer(), None) if exact is not None else frozenset()
            if exact is not None and on:
                chosen = self._where(value, exact, on, before=None)
                chosen.name, value.name = value.name, f"{value.name}__switched"
                self.graph.outputs[i] = chosen
        self._drop_unread_round_trips()

    def _drop_unread_round_trips(self) -> None:
        """The main graph's round trips whose rounded copy nothing reads any more (each reader's If
        rounds in its own branch)."""
        outputs = set(self.graph.outputs)
        for copy in self.rounded:
            back = copy.producer()
            if back is None or back.graph is not self.graph or copy.uses() or copy in outputs:
                continue
            low = back.inputs[0]
            self.graph.remove(back, safe=True)
            to_low = low.producer() if low is not None else None
            if to_low is not None and low is not None and not low.uses():
                self.graph.remove(to_low, safe=True)

    def _round_trip_type(self, rounded: ir.Value, exact: ir.Value) -> ir.DataType | None:
        """The low type ``rounded`` is ``exact`` rounded to by a round trip of Casts; None if it is not."""
        back = rounded.producer()
        if self.rounded.get(rounded) is not exact or back is None or back.op_type != "Cast":
            return None
        low = back.inputs[0]
        return low.dtype if low is not None and low.dtype in _LOW else None

    def _exact(self, node: ir.Node, k: int, value: ir.Value, own: int | None):
        """The exact value ``node`` reads at input ``k`` when its switches are off, and those switches."""
        exact = self.rounded.get(value)
        if exact is not None:
            return exact, self._groups_of(exact.producer(), node)
        if value in self.low_constants and own is not None:
            names = self.fp32_inputs.get(id(node), ())
            original = self.constants.get(names[k]) if k < len(names) else None
            if original is not None and tuple(original.dims) == tuple(value.shape or ()):
                return self._exact_constant(original), frozenset({own})
        return None, frozenset()

    def _groups_of(self, producer: ir.Node | None, reader: ir.Node | None) -> frozenset[int]:
        found = (self.group_of.get(id(producer)) if producer is not None else None,
                 self.group_of.get(id(reader)) if reader is not None else None)
        return frozenset(k for k in found if k is not None)

    def _exact_constant(self, tensor: onnx.TensorProto) -> ir.Value:
        value = self.exact_constants.get(tensor.name)
        if value is None:
            array = onnx.numpy_helper.to_array(tensor).astype(np.float32)
            value = ir.Value(name=exact_name(tensor.name), type=ir.TensorType(ir.DataType.FLOAT),
                             shape=ir.Shape(array.shape), const_value=ir.Tensor(array))
            self.graph.register_initializer(value)
            self.exact_constants[tensor.name] = value
        return value

    def _branch(self, source: ir.Value, round_to: ir.DataType | None = None) -> ir.Graph:
        """A branch of the If that chooses: ``source`` (a value of the main graph) as it is, or with
        ``round_to``, rounded to that type and back (the emulation's round trip)."""
        self.branches += 1
        nodes = [ir.Node("", "Identity", [source])]
        if round_to is not None:
            to_low = ir.Node("", "Cast", [source], [ir.AttrInt64("to", int(round_to))])
            low = to_low.outputs[0]
            low.name, low.type, low.shape = f"amp_lowered{self.branches}", ir.TensorType(round_to), source.shape
            nodes = [to_low, ir.Node("", "Cast", [low], [ir.AttrInt64("to", int(ir.DataType.FLOAT))])]
        out = nodes[-1].outputs[0]
        out.name, out.type, out.shape = f"amp_switched{self.branches}", source.type, source.shape
        return ir.Graph([], [out], nodes=nodes, name=f"amp_branch{self.branches}")

    def _where(self, rounded: ir.Value, exact: ir.Value, on: frozenset[int], before: ir.Node | None) -> ir.Value:
        key = (rounded, on)
        chosen = self.chosen.get(key)
        if chosen is not None:
            return chosen
        new = []
        condition = self.conditions.get(on)
        if condition is None:
            a, *rest = sorted(on)
            condition = self.switches[a]
            for b in rest:
                node = ir.Node("", "Or", [condition, self.switches[b]])
                new.append(node)
                condition = node.outputs[0]
            self.conditions[on] = condition
        low_type = self._round_trip_type(rounded, exact)
        where = ir.Node("", "If", [condition], attributes=[
            ir.AttrGraph("then_branch", self._branch(rounded) if low_type is None else self._branch(exact, low_type)),
            ir.AttrGraph("else_branch", self._branch(exact))])
        where.outputs[0].type, where.outputs[0].shape = rounded.type, rounded.shape
        new.append(where)
        if before is None:
            self.graph.extend(new)
        else:
            self.graph.insert_before(before, new)
        self.chosen[key] = where.outputs[0]
        return where.outputs[0]


class SwitchProbe:
    """A loaded probe and the reference outputs on the samples; :meth:`error` runs it on the
    calibration samples, :meth:`held_error` on the held-out ones."""

    def __init__(self, fp32: onnx.ModelProto | None, probe: onnx.ModelProto, n_switches: int,
                 samples: Sequence[dict[str, np.ndarray]], runner: Runner, *,
                 held: Sequence[dict[str, np.ndarray]] = (), metric: ErrorMetric = Metric.REL_L2):
        """``fp32``: the FP32 model, run once per sample for the reference; None when the probe with
        every switch off is that model (a probe without a conversion: its all-off runs are the
        reference, and :attr:`base` is 0). ``held``: held-out samples (:meth:`held_error`);
        ``metric``: the error metric of a run (:class:`amp_compiler.core.tensor_error.OutputErrors`)."""
        self.n_switches, self.metric = n_switches, metric
        self.sets = [list(samples), list(held)]  # calibration, held out
        outputs = (fp32 if fp32 is not None else probe).graph.output
        self.outputs = [o.name for o in outputs if o.type.tensor_type.elem_type in _FLOATS]
        self.runs = 0
        if fp32 is not None:
            reference = runner.load(fp32, basic=True)
            try:
                self.references = [[self._floats(reference, sample, {}) for sample in s] for s in self.sets]
            finally:
                reference.close()
        self.session = runner.load(probe, basic=True)
        if fp32 is None:
            off = self._switches(())
            self.references = [[self._floats(self.session, sample, off) for sample in s] for s in self.sets]
            self.runs += sum(len(s) for s in self.sets)
            self.base = self.held_base = 0.0
        # Per set and output: the sum of squared finite reference values over every sample (what a
        # relative L2 divides by at the end: the error of the samples run so far over it bounds it below).
        self.totals = [[sum(float(np.sum(np.square(r[j][np.isfinite(r[j])]))) for r in refs)
                        for j in range(len(self.outputs))] for refs in self.references]
        if fp32 is not None:
            self.base = self.error(())
            self.held_base = self.held_error(()) if held else 0.0

    @property
    def samples(self) -> list[dict[str, np.ndarray]]:
        """The calibration samples."""
        return self.sets[0]

    def _switches(self, on: Iterable[int]) -> dict[str, np.ndarray]:
        on = frozenset(on)
        return {switch_name(k): np.array(k in on) for k in range(self.n_switches)}

    def _floats(self, session, sample: dict[str, np.ndarray], extra: dict[str, np.ndarray]) -> list[np.ndarray]:
        feeds = {k: v for k, v in sample.items() if k in session.input_names}
        feeds.update(extra)
        outs = dict(zip(session.output_names, session.run(feeds), strict=True))
        return [np.asarray(outs[name], dtype=np.float64) for name in self.outputs]

    def _measure(self, on: Iterable[int], to_the_end: bool, held: bool = False,
                 above: float | None = None) -> OutputErrors | float:
        """The outputs' errors with the switches ``on``, over the calibration (or ``held``-out) samples
        (until one is not finite where the reference is, unless ``to_the_end``). With ``above`` (relative
        L2 only): as soon as the samples run so far prove the worst error beyond it, that lower bound."""
        switches = self._switches(on)
        found = OutputErrors(len(self.outputs), self.metric, self.outputs)
        k = 1 if held else 0
        for sample, reference in zip(self.sets[k], self.references[k], strict=True):
            self.runs += 1
            if not found.add(reference, self._floats(self.session, sample, switches)) and not to_the_end:
                break
            if above is not None and self.metric is Metric.REL_L2:
                bound = max((relative_l2(e, t) for e, t in zip(found.err2, self.totals[k], strict=True)), default=0.0)
                if bound > above:
                    return bound
        return found

    def errors(self, on: Iterable[int], held: bool = False) -> dict[str, float]:
        """The error of each float output against FP32 (under the metric), with the switches ``on``
        and the others off, on the calibration (or ``held``-out) samples."""
        found = self._measure(on, True, held)
        assert isinstance(found, OutputErrors)
        return dict(zip(self.outputs, found.relative(), strict=True))

    def error(self, on: Iterable[int], above: float | None = None) -> float:
        """The worst of :meth:`errors` on the calibration samples (infinite as soon as a sample's output
        is not finite where FP32's is: the other samples are not run). With ``above``: a lower bound
        beyond it, as soon as the samples run so far prove the error beyond it (relative L2)."""
        found = self._measure(on, False, above=above)
        return found if isinstance(found, float) else found.worst()

    def held_error(self, on: Iterable[int], above: float | None = None) -> float:
        """:meth:`error` on the held-out samples."""
        found = self._measure(on, False, held=True, above=above)
        return found if isinstance(found, float) else found.worst()

    def close(self) -> None:
        self.session.close()
