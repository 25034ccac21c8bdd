"""What a conversion returns: the converted model, one decision per node, and how to save it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from amp_compiler.core.decision import NodeDecision, count_by_rule
from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.onnx.write.check_pieces import TypeTable
from amp_compiler.onnx.write.save import Verify, check_output_path
from amp_compiler.options import ConvertOptions

if TYPE_CHECKING:  # the writer of a model whose weights are still on disk: the conversion makes one
    from amp_compiler.onnx.write.output import DeferredOutput

__all__ = ["ConversionResult"]


@dataclasses.dataclass
class ConversionResult:
    """The converted model, one :class:`NodeDecision` per node of it, and what the conversion changed."""

    model: onnx.ModelProto
    decisions: list[NodeDecision]
    casts_inserted: int  # Casts the conversion inserted (in the output)
    constants_converted: int
    options: ConvertOptions
    cast_bytes_painting: int | None = None  # bytes Casts would move as painted (shapes as inferred)
    cast_bytes: int | None = None  # bytes the placed Casts move

    # Set when the input kept its large weights on disk (a path or a DeferredModel with external
    # data): the converted IR, written by save() with its weights in a data file; ``model`` builds
    # the ModelProto, with every weight inside it, only when it is asked for.
    output: DeferredOutput | None = dataclasses.field(default=None, repr=False, compare=False)
    casts_removed: int = 0  # Casts of the input model that the conversion made unnecessary
    # Nodes left as they are because an element type of theirs is unknown ("name (op)"): a warning.
    untyped_nodes: tuple[str, ...] = ()
    # The graph input shapes the options' input_shapes fix, checked against the model, named dims
    # shared by other inputs filled in (amp_compiler.onnx.costs.costs.bind_input_shapes); empty without them.
    input_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # What the user should know: tensors that provably overflow the target above some magnitude of a
    # graph input whose range is not known (state it, and they stay FP32).
    warnings: list[str] = dataclasses.field(default_factory=list)
    # Positions (the input's node order) of the nodes the allow options (allow_ops, allow_nodes) force
    # low, the block options' precedence applied: :func:`amp_compiler.core.decision.allow_message`
    # says how many went low, and which stayed FP32 all the same and by which rule.
    allowed: tuple[int, ...] = ()
    # What the provider cannot take whatever the precision, one line per kind (TensorRT: ops its
    # ONNX parser does not import, onnxruntime contrib ops, custom ops without a declared precision),
    # and what keeps FP32 because the model's opset could not be raised for the target's type.
    provider_warnings: list[str] = dataclasses.field(default_factory=list)
    # The input shapes of the calibration data's first sample (FP8's), for cost estimates where input_shapes
    # fix no dims; empty without data.
    sample_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # The model's opset where the conversion raised it for its types ("opset 17 -> 22 (bfloat16 Conv)":
    # amp_compiler.onnx.load.opset.for_bf16), "" where it did not.
    opset_change: str = ""
    # What the conversion did about nodes out of topological order ("nodes sorted into topological order in
    # its graph": amp_compiler.onnx.load.node_order), "" where they were in order.
    node_order: str = ""
    # What the conversion split of onnxruntime's fused ops before its analysis ("3 com.microsoft FusedConv
    # ... split into Conv + activation; ...": amp_compiler.onnx.load.fused_ops), "" where nothing.
    fused_split: str = ""
    # The type and shape the conversion inferred for every tensor of the main graph (the output
    # describes only what the input described): the load check types the borders of its pieces
    # with them (amp_compiler.onnx.write.check_pieces).
    value_types: TypeTable = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # onnxruntime optimizers the load check (on the CPU provider) turns off: they trip on a Cast only
    # that provider would insert, not on the model as the provider it is for runs it
    # (amp_compiler.passes.analysis.hazards.stand_in_skips).
    load_check_skips: tuple[str, ...] = ()
    # The range probe (options.probe): how its generated inputs were made ("" when it did not run),
    # the model runs it and the measure took, and why it was skipped ("" when it was not).
    probe_inputs: str = ""
    probe_runs: int = 0
    probe_skipped: str = ""
    probe_dims: dict[str, int] = dataclasses.field(default_factory=dict)  # dynamic dims of its inputs
    probe_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # its inputs' shapes
    # Each float output's error against FP32 on the probe's inputs (exact emulation), empty when
    # not measured; why it was not, when the probe ran ("" when it was).
    accuracy: list[OutputAccuracy] = dataclasses.field(default_factory=list)
    accuracy_not_measured: str = ""
    # Per output, the kind of generated input its error above was measured on, when the probe's samples
    # differ in kind (a model with an image input: its worst of uniform noise and dead-leaves images).
    accuracy_on: dict[str, str] = dataclasses.field(default_factory=dict)
    # What ``accuracy`` is measured against: "fp32", or for an input that stores FP16/BF16 already (a
    # converted model, converted again) that input itself, exactly emulated: no FP32 reference exists.
    reference: str = "fp32"

    def decisions_by_rule(self) -> dict[str, int]:
        return count_by_rule(self.decisions)

    def save(
        self, path: str | os.PathLike, *, input_files: Iterable[str | os.PathLike] = (), force: bool = False,
        verify: Verify | None = None,
    ) -> Path | None:
        """Write the converted model to ``path``, refusing to overwrite ``input_files`` (the input
        model, then its external data; ``force`` allows the model file itself). ``verify`` is called
        with the complete temporary model file before it is renamed into place, and may raise to
        refuse it (e.g. :func:`amp_compiler.onnx.write.load_check.check_output_loads`).

        A model converted from one with external data is written the same way: its initializers of
        1 KiB or more go to ``<path>.data`` beside it, one tensor at a time (weights never all in
        memory, and no 2 GiB protobuf limit). Returns that data file, or None for a single file.
        """
        output = check_output_path(path, input_files, force=force)
        if self.output is not None:
            return self.output.write(output, verify)
        output.write_model(self.model, verify)
        return None


def _result_model(self: ConversionResult) -> onnx.ModelProto | None:
    model = self.__dict__.get("_model")
    if model is None and self.output is not None:
        model = self.__dict__["_model"] = self.output.materialize()
    return model


def _set_result_model(self: ConversionResult, model: onnx.ModelProto | None) -> None:
    self.__dict__["_model"] = model


# ``model`` is a field (positional first argument, in repr and ==) read through a property, so that
# a deferred conversion builds its ModelProto only when asked.
ConversionResult.model = property(_result_model, _set_result_model, doc="The converted ModelProto.")  # type: ignore[assignment]
