"""The precision report as data: what was decided per node, why, what it costs, what it changes.

Renderers (terminal, JSON, CSV, HTML) read these dataclasses and nothing else. JSON carries
``schema_version`` and loads back into the same objects (:meth:`PrecisionReport.from_dict`), from
this version and the ones before it:

- 4: an output's accuracy says whether it was ``measured`` (false: FP32's own values were all NaN/Inf
  on the inputs, and its zero error says nothing, or it was ``empty``: no values at all); earlier
  versions load as measured (and a version 4 report without ``empty`` as not empty).
- 3: an output's accuracy may be an integer or bool output's (a label, an index): ``changed`` counts
  its values that differ from FP32's, of ``values`` (``changed`` is null for a float output);
  ``changed_share`` is derived from them, and written for readers of the JSON.
- 2: an output's accuracy holds the FP32 output's ``value_range``; ``error_of_range`` is derived from
  it, and still written for readers of the JSON.
- 1: an output's accuracy held ``error_of_range`` only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from amp_compiler.core.measures import NodeError, OutputAccuracy, TensorRange

__all__ = ["SCHEMA_VERSION", "NodeError", "NodeReport", "OutputAccuracy", "PrecisionReport", "Summary", "TensorRange"]

SCHEMA_VERSION = 4


@dataclasses.dataclass
class NodeReport:
    graph: str
    name: str
    op_type: str
    domain: str
    precision: str  # fp16 | bf16 | fp32 | mixed | none
    rule: str  # stable rule id ("policy.low", "constant.overflow", "calibration.overflow", ...)
    reason: str
    input_dtypes: list[str]
    output_dtypes: list[str]
    flops: int | None = None  # estimated floating-point operations (multiply-add = 2)
    bytes: int | None = None  # bytes read and written by the node (at its decided dtypes)
    tensor_core: bool | None = None  # FP16/BF16 MatMul/Gemm/Conv whose dims are multiples of 8
    tensor_core_note: str = ""
    casts_in: list[str] = dataclasses.field(default_factory=list)  # names of Casts feeding it
    casts_out: list[str] = dataclasses.field(default_factory=list)  # Casts reading its outputs
    range: TensorRange | None = None  # of its first float output
    error: NodeError | None = None
    inserted: bool = False  # a node the conversion inserted (a Cast, a range scaling's Mul): not the input model's


@dataclasses.dataclass
class Summary:
    target: str
    provider: str
    nodes: int  # nodes of the input model (inserted Casts are counted in ``casts``)
    nodes_by_precision: dict[str, int]
    flops_total: int
    flops_low: int  # FLOPs of nodes running in the low-precision type
    casts: int
    cast_bytes: int  # bytes the inserted Casts read and write, per run
    size_before: int  # model bytes
    size_after: int
    accuracy: list[OutputAccuracy] = dataclasses.field(default_factory=list)
    calibration_samples: int = 0
    model_runs: int = 0  # runs of the converted model by the --tolerance refinement
    pinned_by_tolerance: int = 0
    tolerance: float | None = None  # the --tolerance asked for (relative L2 per float output)
    # Nodes left as they are because an element type of theirs is unknown (their FLOPs are not low
    # precision): a warning.
    untyped_nodes: int = 0
    # Why the output accuracy was not measured ("" when it was): what stopped its run (the run budget,
    # a crash, onnxruntime refusing the model or its inputs).
    accuracy_not_measured: str = ""
    # The values the dynamic dims of the random inputs took (empty with calibration data, or when no
    # input dim is dynamic): amp_compiler.onnx.measure.generated_inputs.
    generated_dims: dict[str, int] = dataclasses.field(default_factory=dict)
    # Per output, the kind of generated sample its accuracy was measured on, where the range probe ran
    # more than one kind (an image model: "uniform noise" or "dead-leaves image"; its worst is kept).
    accuracy_on: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def low_flops_share(self) -> float:
        return self.flops_low / self.flops_total if self.flops_total else 0.0


@dataclasses.dataclass
class PrecisionReport:
    model: str  # file name or graph name
    summary: Summary
    nodes: list[NodeReport]
    warnings: list[str] = dataclasses.field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for node in data["nodes"]:  # what range scaling chose from is not the report's (its reasons say what it chose)
            if node.get("range"):
                node["range"].pop("binades", None)
                node["range"].pop("channel_peaks", None)
        for entry, accuracy in zip(data["summary"]["accuracy"], self.summary.accuracy, strict=True):
            entry["error_of_range"] = accuracy.error_of_range  # derived, written for readers of the JSON
            entry["changed_share"] = accuracy.changed_share
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrecisionReport:
        """The report a :meth:`to_dict` of this schema version, or of an earlier one, wrote."""
        version = data.get("schema_version")
        if version not in (1, 2, 3, SCHEMA_VERSION):
            raise ValueError(f"report schema_version {version!r} is not 1, 2, 3 or {SCHEMA_VERSION}")
        s = dict(data["summary"])
        s["accuracy"] = [_accuracy(a, version) for a in s.get("accuracy", [])]
        nodes = []
        for n in data["nodes"]:
            n = dict(n)
            n["range"] = TensorRange(**n["range"]) if n.get("range") else None
            n["error"] = NodeError(**n["error"]) if n.get("error") else None
            nodes.append(NodeReport(**n))
        return cls(
            model=data["model"],
            summary=Summary(**s),
            nodes=nodes,
            warnings=list(data.get("warnings", [])),
            schema_version=SCHEMA_VERSION,
        )


def _accuracy(entry: dict[str, Any], version: int) -> OutputAccuracy:
    """An output's accuracy as a report of ``version`` wrote it. Version 1 wrote ``error_of_range``
    (max error / value range) without the range: the range is what gives that ratio back (to the
    last bit or two; 0 for a ratio of 0, inf or NaN, which is what a range of 0 gives back)."""
    if version == 1:
        ratio, error = entry["error_of_range"], entry["max_abs_error"]
        value_range = error / ratio if 0 < ratio < float("inf") else 0.0
        return OutputAccuracy(entry["name"], entry["cosine"], error, value_range, entry["finite"])
    return OutputAccuracy(**{k: v for k, v in entry.items() if k not in ("error_of_range", "changed_share")})
