"""Facts about the deployment graphs (models/deployment.py) and what amp-compiler does with them.

    python -m benchmarks.deployment_facts [--size small|full] [--json OUT.json] [NAME ...]
    python -m benchmarks.deployment_facts --table [--size small|full|all] [--results benchmarks/RESULTS.md]

``--table`` prints the side-by-side table of amp-compiler against each model's anchor (the FP16
graph its own flow ships): fused and MatMul nodes in FP16, Casts, accuracy against FP32 with FP16
storage emulated exactly, size, conversion time; ``--results`` writes it into that file's
deployment section (between its markers, the rest of the file kept).

Per model, printed as one JSON object per line (and all of them in ``--json``):

- ``ops``: node counts by ``domain:op_type``;
- ``onnx_untyped``: node outputs that onnx's shape inference leaves without an element type, by the
  producing op (and whether onnx has a schema for it); ``onnx_strict``: strict inference's verdict;
- ``symbolic``: what onnxruntime's SymbolicShapeInference gives (untyped outputs left, or its error);
- ``not_in_onnx`` / ``not_in_policy``: op types onnx's schemas / our policy table lack, with
  onnxruntime's schema for each (domain, since_version, type constraints);
- ``amp``: today's ``amp-compiler convert`` (exit code, summary or error line), the decisions' rule
  and reason counts, Casts inserted and those feeding only Shape, and the output's accuracy vs FP32
  (exact FP16 storage via amp_compiler.onnx.measure.emulate);
- ``anchors``: per anchor graph, fused/MatMul nodes whose output is FP16, Casts, accuracy vs FP32
  (raw onnxruntime CPU, and emulated with the element types of onnxruntime's symbolic inference).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.shape_inference

from amp_compiler.onnx.measure.checks import compare
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.policy.table import default_table
from benchmarks.cold import write_section
from models import catalog
from models.deployment import SPECS, feeds_for, run_cpu

FUSED_DOMAINS = {"com.microsoft"}
MATMUL_OPS = {"MatMul", "Gemm", "MatMulNBits", "FusedMatMul"}
FP16 = onnx.TensorProto.FLOAT16


def _domain(node: onnx.NodeProto) -> str:
    return node.domain or "ai.onnx"


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(collections.Counter(f"{_domain(n)}:{n.op_type}" for n in model.graph.node).items()))


def _typed(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    vals = [*g.value_info, *g.input, *g.output]
    return {v.name for v in vals if v.type.tensor_type.elem_type} | {i.name for i in g.initializer}


def untyped_outputs(model: onnx.ModelProto) -> dict[str, int]:
    """Node outputs of an inferred model without an element type, counted by producing op."""
    typed = _typed(model)
    out = collections.Counter()
    for n in model.graph.node:
        for o in n.output:
            if o and o not in typed:
                known = onnx.defs.has(n.op_type, n.domain or "")
                out[f"{_domain(n)}:{n.op_type}{'' if known else ' (no onnx schema)'}"] += 1
    return dict(out)


def ort_schema(op: str, domain: str, opset: int) -> dict | None:
    """onnxruntime's schema for ``op`` in ``domain`` at ``opset``: the newest since_version <= opset."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    found = [s for s in C.get_all_operator_schema()
             if s.name == op and s.domain == domain and s.since_version <= opset]
    if not found:
        return None
    s = max(found, key=lambda s: s.since_version)
    return {
        "domain": s.domain or "(default)",
        "since_version": s.since_version,
        "inputs": [f"{p.name}:{p.typeStr}{'?' if 'Optional' in str(p.option) else ''}" for p in s.inputs],
        "outputs": [f"{p.name}:{p.typeStr}{'?' if 'Optional' in str(p.option) else ''}" for p in s.outputs],
        "type_constraints": {t.type_param_str: [x.replace("tensor(", "").rstrip(")") for x in t.allowed_type_strs]
                             for t in s.type_constraints},
    }


def symbolic(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str]:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True)
    except Exception as exc:  # noqa: BLE001 - recorded as a fact
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    if inferred is None:
        return None, "returned None (an op it cannot infer)"
    left = untyped_outputs(inferred)
    return inferred, f"ok, untyped outputs left: {left or 'none'}"


def opset_of(model: onnx.ModelProto, domain: str) -> int:
    return next((o.version for o in model.opset_import if o.domain == domain), 1)


def structure(model: onnx.ModelProto) -> dict:
    facts: dict = {"ops": op_counts(model)}
    inferred = onnx.shape_inference.infer_shapes(model)
    facts["onnx_untyped"] = untyped_outputs(inferred)
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
        facts["onnx_strict"] = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded as a fact
        facts["onnx_strict"] = str(exc).splitlines()[0][:200]
    facts["symbolic"] = symbolic(model)[1]
    table = default_table()
    kinds = {(n.domain, n.op_type) for n in model.graph.node}
    facts["not_in_onnx"] = {
        f"{d or 'ai.onnx'}:{op}": ort_schema(op, d, opset_of(model, d)) for d, op in sorted(kinds)
        if not onnx.defs.has(op, d)
    }
    facts["not_in_policy"] = sorted(f"{d or 'ai.onnx'}:{op}" for d, op in kinds if table.get(d, op) is None)
    return facts


def accuracy(reference: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> dict:
    """Worst cosine and worst max error of range over the float outputs, and the worst output."""
    accs = [compare(n, reference[n], np.asarray(got[n], dtype=np.float32)) for n in reference
            if np.issubdtype(reference[n].dtype, np.floating)]
    worst = min(accs, key=lambda a: a.cosine if a.finite else -1)
    return {"cosine": round(min(a.cosine for a in accs), 7),
            "error_of_range": round(max(a.error_of_range for a in accs), 6),
            "worst_output": worst.name, "finite": all(a.finite for a in accs)}


def low_precision_counts(model: onnx.ModelProto) -> dict:
    """Fused (com.microsoft, SimplifiedLayerNormalization) and MatMul-like nodes whose first output
    is FP16 (types from onnxruntime's symbolic inference), and Cast nodes."""
    inferred, verdict = symbolic(model)
    src = inferred or onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*src.graph.value_info, *src.graph.output]}
    fused = [n for n in model.graph.node if n.domain in FUSED_DOMAINS or n.op_type == "SimplifiedLayerNormalization"]
    mm = [n for n in model.graph.node if n.op_type in MATMUL_OPS]
    return {
        "fused_fp16": f"{sum(types.get(n.output[0]) == FP16 for n in fused)}/{len(fused)}",
        "matmul_fp16": f"{sum(types.get(n.output[0]) == FP16 for n in mm)}/{len(mm)}",
        "casts": sum(n.op_type == "Cast" for n in model.graph.node),
        "typed_by": "symbolic" if inferred is not None else "onnx (" + verdict + ")",
    }


def with_symbolic_types(model: onnx.ModelProto, inferred: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with value_info giving each node output the element type symbolic inference found,
    and no shape: its shapes can be wrong (GroupQueryAttention's present_* get the past length), and
    onnxruntime then fails to reuse buffers ("Shape mismatch attempting to re-use buffer")."""
    io = {v.name for v in [*model.graph.input, *model.graph.output]}
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    for n in model.graph.node:
        for o in n.output:
            if o and o not in io and types.get(o):
                out.graph.value_info.append(onnx.helper.make_tensor_value_info(o, types[o], None))
    return out


def anchor_accuracy(model: onnx.ModelProto, inputs: dict, reference: dict) -> dict:
    out = {}
    try:
        raw = run_cpu(model, feeds_for(model, inputs))
        out["raw_ort"] = accuracy(reference, raw)
    except Exception as exc:  # noqa: BLE001 - recorded as a fact
        out["raw_ort"] = f"does not run: {str(exc).splitlines()[0][:200]}"
    inferred, verdict = symbolic(model)
    try:
        emu = emulate(with_symbolic_types(model, inferred) if inferred is not None else model)
        out["emulated"] = accuracy(reference, run_cpu(emu, inputs))
        out["emulated_types_from"] = "symbolic" if inferred is not None else "onnx inference only: " + verdict
    except Exception as exc:  # noqa: BLE001 - recorded as a fact
        out["emulated"] = f"fails: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return out


def amp_compiler_today(model: onnx.ModelProto, inputs: dict, reference: dict, tmp: Path) -> dict:
    src, dst, rep = tmp / "in.onnx", tmp / "out.onnx", tmp / "report.json"
    onnx.save(model, str(src))
    exe = str(Path(sys.executable).with_name("amp-compiler"))
    t0 = time.perf_counter()
    proc = subprocess.run([exe, "convert", str(src), "-o", str(dst), "--report", str(rep)],
                          capture_output=True, text=True, timeout=1200)
    facts: dict = {"exit": proc.returncode, "seconds": round(time.perf_counter() - t0, 2),
                   "line": (proc.stdout.strip() or proc.stderr.strip()).splitlines()[-1][:400].replace(str(tmp) + "/", "")}
    if proc.returncode != 0:
        return facts
    report = json.loads(rep.read_text())
    reasons = collections.Counter(
        f"{n['precision']} | {n['rule']} | {n['reason'][:110]}" for n in report["nodes"] if not n["inserted"])
    facts["reasons"] = dict(reasons.most_common(8))
    facts["report_low_flops_share"] = round(report["summary"]["flops_low"] / max(report["summary"]["flops_total"], 1), 4)
    out = onnx.load(str(dst))
    before = {n.name for n in model.graph.node}
    consumers = collections.defaultdict(list)
    for n in out.graph.node:
        for i in n.input:
            consumers[i].append(n.op_type)
    new_casts = [n for n in out.graph.node if n.op_type == "Cast" and n.name not in before]
    facts["casts_inserted"] = len(new_casts)
    facts["casts_feeding_only_shape"] = sum(
        bool(consumers[c.output[0]]) and all(op == "Shape" for op in consumers[c.output[0]]) for c in new_casts)
    facts["low_precision"] = low_precision_counts(out)
    facts["accuracy_emulated"] = anchor_accuracy(out, inputs, reference).get("emulated")
    return facts


def facts_for(spec, cache: Path) -> dict:
    t0 = time.perf_counter()
    model = spec.build(cache)
    facts: dict = {"name": spec.name, "build_s": round(time.perf_counter() - t0, 2),
                   "mb": round(model.ByteSize() / 1e6, 3), **structure(model)}
    inputs = spec.make_inputs(np.random.default_rng(0))
    reference = run_cpu(model, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        facts["amp"] = amp_compiler_today(model, inputs, reference, Path(tmp))
    facts["fp32"] = low_precision_counts(model)
    facts["anchors"] = {}
    for label, build in spec.anchors().items():
        anchor = build(cache)
        facts["anchors"][label] = {"mb": round(anchor.ByteSize() / 1e6, 3), **low_precision_counts(anchor),
                                   **anchor_accuracy(anchor, inputs, reference)}
    return facts


SECTION_BEGIN = "<!-- deployment-graphs:begin (python -m benchmarks.deployment_facts --table --results) -->"
SECTION_END = "<!-- deployment-graphs:end -->"


def _accuracy_cell(model: onnx.ModelProto, inputs: dict, reference: dict) -> str:
    try:
        got = run_cpu(emulate(model), inputs)
    except Exception as exc:  # noqa: BLE001 - a fact for the table
        return f"does not run: {str(exc).splitlines()[0][:80]}"
    acc = accuracy(reference, got)
    return f"{acc['cosine']:.7f} / {acc['error_of_range']:.2%}"


def side_by_side(spec, cache: Path) -> list[str]:
    """Table rows: amp-compiler (graph I/O kept FP32, and free to change) and each anchor of ``spec``;
    an anchor's Casts with the bound the tests hold ours to (its Casts, plus one per graph input or
    output it makes FP16 and ours keeps FP32)."""
    from amp_compiler import convert
    from models.anchors import cast_allowance, counts

    model = spec.build(cache)
    inputs = spec.make_inputs(np.random.default_rng(0))
    reference = run_cpu(model, inputs)
    t0 = time.perf_counter()
    ours = convert(model, probe=False).model
    seconds = time.perf_counter() - t0
    free_io = convert(model, keep_io_types=False, probe=False).model
    anchors = {label: build(cache) for label, build in spec.anchors().items()}
    rows = []
    for label, m, c, extra in [("amp-compiler", ours, counts(ours), f"{seconds:.2f} s"),
                               ("amp-compiler --no-keep-io-types", free_io, counts(free_io), ""),
                               *((a, m, counts(m), "") for a, m in anchors.items())]:
        allowance = "" if label.startswith("amp-compiler") else f" (bound for ours: {cast_allowance(ours, c)})"
        rows.append(
            f"| {spec.name} | {label} | {c.fused_low}/{c.fused} | {c.matmul_low}/{c.matmul} | {c.casts}{allowance} | "
            f"{_accuracy_cell(m, inputs, reference)} | {m.ByteSize() / 1e6:.2f} | {extra} |"
        )
    return rows


LEGEND = """## Deployment graphs against their anchors

Command: `python -m benchmarks.deployment_facts --table --size all --results benchmarks/RESULTS.md`
(models from `models/deployment.py`; `tests/e2e/test_deployment.py` holds the small ones, and with `-m slow`
the full ones, to the same bounds). Anchors: `ort-fp16` is onnxruntime's transformer optimizer's
`convert_float_to_float16(keep_io_types=True)` (its `--float16` writes the same bytes), `genai-cuda`
onnxruntime-genai's builder `-p fp16 -e cuda` (`-p int4 -e cuda` for the int4 model). Fused ops
(com.microsoft, SimplifiedLayerNormalization) and MatMul/Gemm/MatMulNBits count as FP16 when their first
output is, by onnxruntime's symbolic inference. Casts are every Cast of the graph (the model's own
included); an anchor's row gives the bound the tests hold amp-compiler to: its Casts plus one per graph
input or output it makes FP16 and amp-compiler keeps FP32. Accuracy: against the FP32 model on
onnxruntime CPU with FP16 storage emulated exactly (`amp_compiler.onnx.measure.emulate`), decoders on a decode step
(one new token after 7 cached ones, small; 120, full), worst float output. The convert time includes
onnxruntime's symbolic shape inference (cast sizes of fused ops' outputs) and varies with the machine's
load.

- The torch-exported decoder (`llama-torch-kv`) has more Casts than its anchor: its RMSNorm is decomposed
  (Pow, ReduceMean, ...) behind the model's own `Cast(to=float)`, which the TorchScript trace shares with
  the residual stream, so amp-compiler keeps the norms and the residual stream FP32 (Pow overflows FP16
  above 256) and rotary Cos/Sin FP32: 4 Casts per layer and 4 more (`TorchDecoder.extra_casts`). The
  anchor converts everything but a short block list, Pow and Cos/Sin included.
- The genai decoders' graph inputs and outputs (KV cache, logits) are FP16 in the builder's graph: with
  them kept FP32 amp-compiler adds a Cast at each; with `--no-keep-io-types` the Casts are the builder's 2.
"""


def table(size: str, names: list[str], cache: Path) -> str:
    header = [
        LEGEND,
        "| model | graph | fused ops in FP16 | MatMul in FP16 | Casts | cosine / max error (of range), emulated FP16 | MB | convert |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for spec in SPECS:
        if (size == "all" or spec.size == size) and (not names or spec.name in names):
            rows += side_by_side(spec, cache)
            print(spec.name, file=sys.stderr, flush=True)
    return "\n".join(header + rows) + "\n"




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.deployment_facts", description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=["small", "full", "all"], default="small")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--table", action="store_true", help="the side-by-side table against the anchors")
    ap.add_argument("--results", type=Path, default=None, help="write the table into this file's section")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    cache = Path(os.environ.get("AMP_MODELS_CACHE", catalog.CACHE_DIR))
    if args.table:
        text = table(args.size, args.names, cache)
        print(text)
        if args.results:
            write_section(args.results, text, SECTION_BEGIN, SECTION_END)
        return 0
    rows = []
    for spec in SPECS:
        if (args.size != "all" and spec.size != args.size) or (args.names and spec.name not in args.names):
            continue
        rows.append(facts_for(spec, cache))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
