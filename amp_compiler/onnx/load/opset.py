"""The opset a conversion writes its model at, where the low types need a later one than the model's: 19
for FP8 (float8 Q/DQ), 22 for BF16 where the model's Tensor Core ops take bfloat16 only from there
(Conv: opset 22) — an FP8 model with a BF16 fallback, and a BF16 conversion (:func:`bf16_opset`).

Guarantees: :func:`raise_opset` returns the model at that opset or later, rewritten by onnx's version
converter (which adapts the ops whose signature changed), with its model-local functions (which the
converter drops) carried over where none of their ops was redefined by then, at the IR version the opset
needs and 9 or later (float8 types), or refuses with one line (an :class:`OptionError`). Ops of the
default domain that onnx does not define
(onnxruntime's SimplifiedLayerNormalization, registered there at version 1, whose meaning no opset
change touches) are set aside while the converter runs, which would otherwise stop at them, and put
back unchanged. The input model is not modified.
"""

from __future__ import annotations

import dataclasses

import onnx
import onnx.defs
import onnx.version_converter

from amp_compiler.errors import OptionError
from amp_compiler.onnx.load.proto_walk import model_graphs
from amp_compiler.policy import default_table
from amp_compiler.policy.kernels import coverage_for
from amp_compiler.targets import Provider, Target

__all__ = [
    "BF16_CONV_OPSET", "FP8_IR_VERSION", "FP8_OPSET", "OpsetChange", "bf16_opset", "for_bf16", "fp8_opset", "opset_of",
    "raise_opset",
]

FP8_OPSET = 19  # QuantizeLinear/DequantizeLinear take float8e4m3fn (and saturate) from opset 19
BF16_CONV_OPSET = 22  # Conv, ConvTranspose and a few more take bfloat16 from opset 22
FP8_IR_VERSION = 9  # float8 element types exist from IR version 9
_ASIDE = "amp_compiler.set_aside"  # the domain undefined default-domain ops wait in


def fp8_opset(fallback: Target) -> int:
    """The opset an FP8 model with ``fallback`` for the other ops is written at (at least)."""
    return BF16_CONV_OPSET if fallback is Target.BF16 else FP8_OPSET


def opset_of(model: onnx.ModelProto) -> int:
    """The version of the default domain ``model`` imports (0: none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def bf16_opset(model: onnx.ModelProto, provider: Provider = Provider.CUDA) -> tuple[int, tuple[str, ...]] | None:
    """:data:`BF16_CONV_OPSET` and the op types that need it, where ``model``'s opset is below it and some of
    its Tensor Core ops (any graph's) take no bfloat16 at the model's opset but do at that one, in their
    schema and in ``provider``'s kernels (a schema's bfloat16 no kernel runs gains nothing: onnxruntime's
    CUDA ConvTranspose and LSTM have none); else None. At its own opset such an op keeps FP32 in a BF16
    conversion (rule ``fixed``: its schema has no bfloat16): an opset-17 CNN converted to BF16 kept every
    Conv FP32, 0/2 Tensor Core ops low, where at opset 22 both are BF16."""
    current = opset_of(model)
    if not 0 < current < BF16_CONV_OPSET:
        return None
    table, kernels = default_table(), coverage_for(provider)
    ops = set()
    for graph in model_graphs(model):
        for node in graph.node:
            op = node.op_type
            if (node.domain in ("", "ai.onnx") and table.is_tensor_core("ai.onnx", op) and not _takes_bf16(op, current)
                    and _takes_bf16(op, BF16_CONV_OPSET) and kernels is not None
                    and kernels.takes("ai.onnx", op, BF16_CONV_OPSET, "bfloat16")):
                ops.add(op)
    return (BF16_CONV_OPSET, tuple(sorted(ops))) if ops else None


@dataclasses.dataclass(frozen=True)
class OpsetChange:
    """A model made ready for BF16 (:func:`for_bf16`): ``model`` (the input where nothing changed),
    ``before`` and ``after`` its default-domain opsets (equal: unchanged), ``refused`` why the version
    converter could not raise it ("" when it did, or had nothing to do)."""

    model: onnx.ModelProto
    before: int
    after: int
    ops: tuple[str, ...] = ()  # the op types that needed it
    refused: str = ""

    @property
    def note(self) -> str:
        """What the summary says of it ("" where nothing changed)."""
        if self.after == self.before:
            return ""
        return f"opset {self.before} -> {self.after} (bfloat16 {', '.join(self.ops)})"


def for_bf16(model: onnx.ModelProto, provider: Provider = Provider.CUDA) -> OpsetChange:
    """``model`` at :func:`bf16_opset`'s opset where it names one and onnx's version converter can raise
    it; where it cannot, the model as it is and the converter's reason (its Tensor Core ops then keep FP32,
    which the caller says: a BF16 conversion is not refused for it)."""
    current = opset_of(model)
    wanted = bf16_opset(model, provider)
    if wanted is None:
        return OpsetChange(model, current, current)
    opset, ops = wanted
    try:
        raised = raise_opset(model, opset, "bf16", needs=f"bfloat16 {', '.join(ops)}")
    except OptionError as exc:
        return OpsetChange(model, current, current, ops, str(exc))
    return OpsetChange(raised, current, opset_of(raised), ops)


def _takes_bf16(op_type: str, opset: int) -> bool:
    """Whether the schema of ``op_type`` at ``opset`` allows bfloat16 for its first input."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:  # no such op at that opset
        return False
    if not schema.inputs:
        return False
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    first = schema.inputs[0].type_str
    return "tensor(bfloat16)" in allowed.get(first, [first])


def raise_opset(model: onnx.ModelProto, opset: int = FP8_OPSET, why: str = "fp8", needs: str = "") -> onnx.ModelProto:
    """``model`` at ``opset`` or later and IR version 9 or later (see module doc); ``why``: what needs it
    (the refusal's first words), ``needs``: which ops (FP8's own where not given)."""
    current = opset_of(model)
    out = model
    if current < opset:
        needs = needs or f"float8 QuantizeLinear{', bfloat16 Conv' if opset > FP8_OPSET else ''}"
        refused = (f"{why} needs opset {opset} ({needs}) and onnx's version converter cannot raise this model's "
                   f"opset {current}")
        changed = _functions_changed(model, opset)
        if changed:
            raise OptionError(f"{refused}: its function {changed} uses ops whose definition changed by then "
                              "(the converter does not convert model-local functions)", option="target")
        out = onnx.ModelProto()
        out.CopyFrom(model)
        aside = _set_aside(out)
        try:
            out = onnx.version_converter.convert_version(out, opset)
        except Exception as exc:  # the converter raises bare RuntimeErrors (C++ adapters)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OptionError(f"{refused}: {first}", option="target") from None
        _put_back(out, aside)
        _keep_described(model, out)
        _keep_metadata(model, out)
        _carry_functions(model, out, opset)
    least = max(FP8_IR_VERSION, onnx.helper.find_min_ir_version_for(list(out.opset_import), ignore_unknown=True))
    if out.ir_version < least:  # opset 22 is IR version 10's
        if out is model:
            out = onnx.ModelProto()
            out.CopyFrom(model)
        out.ir_version = least
    return out


def _functions_changed(model: onnx.ModelProto, opset: int) -> str:
    """The name of a model-local function whose default-domain ops were redefined between its opset and
    ``opset`` (a schema's version changed), else "": onnx's version converter drops model-local functions,
    and one whose ops kept their definitions is valid at ``opset`` as it is."""
    for function in model.functions:
        own = next((o.version for o in function.opset_import if o.domain in ("", "ai.onnx")), None)
        if own is None or own >= opset:
            continue
        for node in function.node:
            if node.domain in ("", "ai.onnx") and _since(node.op_type, own) != _since(node.op_type, opset):
                return f"{function.domain}.{function.name} ({node.op_type})"
    return ""


def _since(op_type: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:  # not a default-domain op (a call of another function)
        return None


def _carry_functions(original: onnx.ModelProto, converted: onnx.ModelProto, opset: int) -> None:
    """Put ``original``'s model-local functions into ``converted`` (the version converter drops them), their
    default-domain opset import raised to ``opset`` (:func:`_functions_changed` found none of their ops
    redefined by then)."""
    del converted.functions[:]
    for function in original.functions:
        copy = converted.functions.add()
        copy.CopyFrom(function)
        for entry in copy.opset_import:
            if entry.domain in ("", "ai.onnx") and entry.version < opset:
                entry.version = opset


def _set_aside(model: onnx.ModelProto) -> set[str]:
    """Move default-domain nodes onnx has no schema for into :data:`_ASIDE`; their op types."""
    aside = set()
    for graph in model_graphs(model):
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, ""):
                node.domain = _ASIDE
                aside.add(node.op_type)
    if aside:
        model.opset_import.append(onnx.helper.make_opsetid(_ASIDE, 1))
    return aside


def _keep_described(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """Drop the value_info entries onnx's version converter added (its shape inference's, which the
    input did not describe): inside an If's branches they can contradict each other (an Optimum merged
    decoder's: a tensor of rank 1 in one branch, 3 in the other), and onnxruntime then refuses the
    written model. Each graph keeps the entries its counterpart in ``original`` had."""
    before = [{v.name for v in g.value_info} for g in model_graphs(original)]
    after = list(model_graphs(converted))
    if len(before) != len(after):
        every = set().union(*before)
        before = [every] * len(after)
    for graph, names in zip(after, before, strict=True):
        kept = [v for v in graph.value_info if v.name in names]
        if len(kept) != len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(kept)


def _keep_metadata(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """Put back the ``metadata_props`` onnx's version converter drops: each graph's, and each node's where
    the converted node makes the same outputs as a node of ``original``'s same graph (an adapter's new node
    makes others, and gets none). The torch.onnx exporter writes each node's source location there (a
    ViT's 0.7 MB): without them the written model lost that, and the size line counted the loss as a
    saving (a Swin-T at BF16: 1.33 MB -> 333 kB printed for 595 -> 297 kB of weights; sweep Y)."""
    before, after = list(model_graphs(original)), list(model_graphs(converted))
    if len(before) != len(after):
        return
    for source, graph in zip(before, after, strict=True):
        if source.metadata_props and not graph.metadata_props:
            graph.metadata_props.extend(source.metadata_props)
        props = {tuple(n.output): n.metadata_props for n in source.node if n.metadata_props}
        for node in graph.node:
            found = props.get(tuple(node.output))
            if found is not None and not node.metadata_props:
                node.metadata_props.extend(found)


def _put_back(model: onnx.ModelProto, aside: set[str]) -> None:
    if not aside:
        return
    for graph in model_graphs(model):
        for node in graph.node:
            if node.domain == _ASIDE:
                node.domain = ""
    kept = [o for o in model.opset_import if o.domain != _ASIDE]
    del model.opset_import[:]
    model.opset_import.extend(kept)
