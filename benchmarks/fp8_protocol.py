"""The FP8 comparison's protocol, shared by ``benchmarks.fp8_table`` (ours) and
``benchmarks.fp8_modelopt`` (ModelOpt's numbers): the same data, runs and measures for both.

- data: 8 calibration batches of each catalog entry's ``make_inputs`` (seeds 10000+i) and 8 held-out
  batches (seeds 20000+i);
- runs: onnxruntime's CPU provider at its BASIC level (from EXTENDED on it deletes a Relu feeding a
  float8 QuantizeLinear), the FP8 model through :func:`amp_compiler.onnx.measure.emulate.emulate` (exact FP16/BF16
  storage; FP8 Q/DQ run as they are, exactly);
- accuracy: per float output over all held-out batches, max |error| as a share of the FP32 range,
  relative L2 and cosine, the worst over outputs; top-1 agreement (argmax over the last axis of the
  first float output) for classifiers;
- FP8 share: a Tensor Core op (the policy table's ``tensor_core``, fused ones included) is FP8 when one
  of its inputs comes straight from a DequantizeLinear; FLOPs from :func:`amp_compiler.onnx.costs.costs.estimate`
  on the FP32 model at the calibration batches' shapes, the same for every tool.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

from amp_compiler.core.tensor_error import accuracy as output_accuracy
from amp_compiler.onnx.costs.costs import estimate, iter_nodes
from amp_compiler.policy import default_table
from models import catalog
from models.deployment import feeds_for

CALIBRATION_SEEDS = [10_000 + i for i in range(8)]
HELD_OUT_SEEDS = [20_000 + i for i in range(8)]


def batches(name: str) -> tuple[onnx.ModelProto, list[dict], list[dict]]:
    """The FP32 model, its calibration batches and its held-out batches."""
    entry, fp32 = catalog.get(name), catalog.load(name)

    def make(seed: int) -> dict:
        return feeds_for(fp32, entry.make_inputs(np.random.default_rng(seed)))

    return fp32, [make(s) for s in CALIBRATION_SEEDS], [make(s) for s in HELD_OUT_SEEDS]


def run(model: onnx.ModelProto, feeds: list[dict]) -> list[list[np.ndarray]]:
    """``model``'s outputs on each batch (CPU provider, BASIC optimisations)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return [session.run(None, {k: v for k, v in b.items() if k in names}) for b in feeds]


def accuracy(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> dict[str, float | None]:
    """The worst max error of range, relative L2 and cosine over the float outputs, and top-1
    agreement of the first float output (None when it has one class)."""
    worst: dict[str, float | None] = {"max_error_of_range": 0.0, "rel_l2": 0.0, "cosine": 1.0, "top1": None}
    for k in range(len(ref[0])):
        if not np.issubdtype(ref[0][k].dtype, np.floating) or not ref[0][k].size:
            continue
        found = output_accuracy(str(k), [b[k] for b in ref], [b[k] for b in got])  # all batches' values together
        worst["max_error_of_range"] = max(worst["max_error_of_range"], found.error_of_range)
        worst["rel_l2"] = max(worst["rel_l2"], found.rel_l2)
        worst["cosine"] = min(worst["cosine"], found.cosine)
        if worst["top1"] is None and ref[0][k].ndim >= 2 and ref[0][k].shape[-1] > 1:
            agree = [np.mean(np.argmax(a[k], axis=-1) == np.argmax(b[k], axis=-1)) for a, b in zip(ref, got)]
            worst["top1"] = float(np.mean(agree))
    return worst


@dataclasses.dataclass(frozen=True)
class Gemm:
    op: str
    node: str
    output: str
    flops: int


def gemms(fp32: onnx.ModelProto, sample: dict[str, np.ndarray]) -> list[Gemm]:
    """The FP32 model's Tensor Core ops with their FLOPs at the sample's shapes."""
    policy = default_table()
    costs = estimate(fp32, {k: tuple(v.shape) for k, v in sample.items()})
    return [
        Gemm(n.op_type, n.name, n.output[0], int(c.flops))
        for n, c in zip(iter_nodes(fp32), costs.nodes, strict=False)
        if n.output and policy.is_tensor_core(n.domain, n.op_type)
    ]


def fp8_outputs(model: onnx.ModelProto) -> set[str]:
    """Node names and output names of the Tensor Core ops that read an input straight from a
    DequantizeLinear (a GEMM producing a graph output writes a renamed tensor that a Cast turns into
    the output, so the FP32 model's GEMMs are matched by either)."""
    policy = default_table()
    dequantized = {o for n in iter_nodes(model) if n.op_type == "DequantizeLinear" for o in n.output}
    fp8 = [n for n in iter_nodes(model)
           if n.output and policy.is_tensor_core(n.domain, n.op_type) and dequantized.intersection(n.input)]
    return {n.output[0] for n in fp8} | {n.name for n in fp8 if n.name}


def is_fp8(gemm: Gemm, fp8: set[str]) -> bool:
    return gemm.output in fp8 or bool(gemm.node) and gemm.node in fp8


def flop_share(all_gemms: list[Gemm], fp8: set[str]) -> float:
    total = sum(g.flops for g in all_gemms)
    return sum(g.flops for g in all_gemms if is_fp8(g, fp8)) / total if total else 0.0


def counts(model: onnx.ModelProto) -> dict[str, int]:
    """Q/DQ and Cast nodes, and the serialized size in bytes."""
    ops = Counter(n.op_type for n in iter_nodes(model))
    return {"qdq": ops["QuantizeLinear"] + ops["DequantizeLinear"], "casts": ops["Cast"], "size": model.ByteSize()}
