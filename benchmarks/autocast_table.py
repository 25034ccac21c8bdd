"""amp-compiler for TensorRT side by side with ModelOpt AutoCast, the FP16 converter NVIDIA names for it.

    python -m benchmarks.autocast_table [--size small] [--models a,b] [--results benchmarks/RESULTS.md]

TensorRT 11 builds strongly typed networks only: an FP32 ONNX file gives an FP32 engine, and the
migration guide's replacement for ``--fp16`` is ModelOpt's AutoCast. Per catalog model (every kind:
CNNs, transformers, If/Loop models, fused and decoder graphs), each tool converts it to FP16 with the
graph inputs and outputs kept FP32, in a fresh child process:

- amp-compiler: ``convert(path, target="fp16", provider="tensorrt", probe=False)`` (from the graph alone, as
  the table was measured before the range probe was on by default in Python);
- AutoCast: ``modelopt.onnx.autocast.convert_to_mixed_precision(path, "fp16", keep_io_types=True,
  providers=["cpu"])`` (``nvidia-modelopt`` installed with ``pip install --no-deps``, as
  ``benchmarks/compare.py`` runs it).

Measured on each output: the share of Tensor Core FLOPs (the policy table's ``tensor_core`` ops)
whose inputs are FP16 (element types as amp-compiler's typing gives them, onnxruntime's contrib ops
included; ``benchmarks.compare``'s count where that typing fails), the Casts between float types added and the
bytes they move (at the catalog's input shapes: the output's less the input's; Casts to or from
integer types are shape arithmetic, not precision, and AutoCast folds some of them away), the worst relative L2 error of a float output against FP32 over two
inputs with the FP16 storage emulated exactly (``amp_compiler.onnx.measure.emulate``, on the output
without its intermediate value_info, which the emulation infers again), whether the
output passes onnx's checker and strict inference (``amp_compiler.onnx.measure.checks.validate``),
loads and runs in onnxruntime (a child process; where the CPU provider crashes on a Cast only it
inserts, again without ``MatmulTransposeFusion``, as amp-compiler's load check does), what TensorRT's
strongly typed networks would refuse in it (``amp_compiler.onnx.write.strongly_typed``), the
conversion time (imports excluded) and the child's peak RSS. ``--results`` writes the table into
the results file between ``<!-- autocast:begin ... -->`` and ``<!-- autocast:end -->``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import onnx

from benchmarks.cold import write_section
from benchmarks.compare import ROOT, _cast_stats, _peak_rss, modelopt_status

TOOLS = ("amp-compiler", "autocast")
SECTION_BEGIN = "<!-- autocast:begin (python -m benchmarks.autocast_table --results benchmarks/RESULTS.md) -->"
SECTION_END = "<!-- autocast:end -->"
SKIP = ("MatmulTransposeFusion",)


# ------------------------------------------------------------------------------------ the child


def _convert(tool: str, src: Path, out: Path) -> None:
    if tool == "amp-compiler":
        from amp_compiler import convert

        convert(src, target="fp16", provider="tensorrt", probe=False).save(out)
        return
    from modelopt.onnx.autocast import convert_to_mixed_precision

    converted = convert_to_mixed_precision(str(src), "fp16", keep_io_types=True, providers=["cpu"])
    out.write_bytes(converted.SerializeToString())


def _worker(args: dict) -> dict:
    """Runs in the child: the tool's imports, then one timed conversion, and the peak memory."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging

        logging.disable(logging.WARNING)
        if args["tool"] == "amp-compiler":
            import amp_compiler.onnx.convert  # noqa: F401
        else:
            from modelopt.onnx.autocast import convert_to_mixed_precision  # noqa: F401
        start = time.perf_counter()
        _convert(args["tool"], Path(args["src"]), Path(args["out"]))
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss": _peak_rss()}


# ------------------------------------------------------------------------------------ the parent


@dataclasses.dataclass
class Result:
    model: str
    kind: str
    tool: str
    status: str = "ok"  # ok | failed (the tool refused or crashed) | unavailable
    detail: str = ""
    seconds: float | None = None
    peak_rss: int | None = None
    tc_low: float | None = None
    casts: int | None = None
    cast_bytes: int | None = None
    valid: str = ""  # "" or the checker's / strict inference's first line
    runs: str = ""  # "yes", "yes, without MatmulTransposeFusion", or why not
    error: float | None = None  # worst relative L2 of a float output vs FP32, storage emulated
    error_note: str = ""
    typed_faults: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)  # amp-compiler's provider warnings


def _child(tool: str, src: Path, out: Path, timeout: int) -> dict:
    payload = json.dumps({"tool": tool, "src": str(src), "out": str(out)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.autocast_table", "--worker", payload],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout} s"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": ((proc.stderr.strip().splitlines() or ["no output"])[-1])[:160]}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:160]


def _runs(model: onnx.ModelProto, feeds: list[dict]) -> tuple[str, list | None]:
    """Whether onnxruntime's CPU provider loads and runs ``model`` (in a child), and its outputs."""
    from amp_compiler.errors import ModelCrashError, ModelRunError
    from amp_compiler.runtime.runner import ChildRunner, RunBudget

    for disabled in ((), SKIP):
        with ChildRunner(RunBudget(seconds=300, memory=8 << 30)) as runner:
            try:
                session = runner.load(model, disabled=disabled)
                outputs = [session.run(f) for f in feeds]
                return ("yes" if not disabled else "yes, without MatmulTransposeFusion"), outputs
            except ModelCrashError as exc:
                if disabled:
                    return f"crashes ({exc})", None
            except ModelRunError as exc:
                return f"no: {_first_line(exc)}", None
    return "no", None


_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                     onnx.TensorProto.DOUBLE})


def float_casts(model: onnx.ModelProto, shapes: dict) -> tuple[int, int]:
    """(Casts from a float type to a float type, the bytes they read and write) in ``model``'s graphs."""
    from amp_compiler.onnx.costs.costs import estimate, iter_nodes
    from amp_compiler.onnx.load.proto_walk import iter_proto_graphs

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - without types, a Cast's source counts as float
        inferred = model
    types: dict[str, int] = {}
    for g in iter_proto_graphs(inferred.graph):
        types.update({v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)})
        types.update({t.name: t.data_type for t in g.initializer})
    count = total = 0
    for node, cost in zip(iter_nodes(model), estimate(model, shapes).nodes, strict=True):
        if node.op_type != "Cast":
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), 0)
        if to in _FLOATS and types.get(node.input[0], onnx.TensorProto.FLOAT) in _FLOATS:
            count += 1
            total += cost.bytes
    return count, total


def tc_low_share(model: onnx.ModelProto, shapes: dict) -> float | None:
    """The share of Tensor Core FLOPs whose first input is FP16 or BF16, types from amp-compiler's
    typed IR (onnx's inference does not type contrib ops' outputs)."""
    from amp_compiler.onnx.costs.costs import estimate, iter_nodes
    from amp_compiler.onnx.load.typed import checked_typed_ir
    from amp_compiler.policy import default_table

    try:
        typed = checked_typed_ir(model, "output", deferred=False, check=False)
    except Exception:  # noqa: BLE001 - an output our typing refuses: onnx's inference alone
        return _cast_stats(model, shapes)[2]
    types = {v.name: v.dtype for g in typed.graphs() for node in g for v in (*node.inputs, *node.outputs)
             if v is not None and v.name}
    types.update({v.name: v.dtype for v in typed.graph.inputs})
    low = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    table = default_table()
    total = fp16 = 0
    for node, cost in zip(iter_nodes(model), estimate(model, shapes).nodes, strict=True):
        if table.is_tensor_core(node.domain, node.op_type):
            total += cost.flops
            dtype = types.get(node.input[0]) if node.input else None
            fp16 += cost.flops if dtype is not None and int(dtype) in low else 0
    return fp16 / total if total else None


def measure(result: Result, fp32: onnx.ModelProto, out: Path, feeds: list[dict], reference: list) -> None:
    """Everything the module doc lists, for the output at ``out``."""
    from amp_compiler.core.tensor_error import OutputErrors
    from amp_compiler.onnx.measure.checks import validate
    from amp_compiler.onnx.measure.emulate import emulate
    from amp_compiler.onnx.write.strongly_typed import strongly_typed_faults

    model = onnx.load(out)
    shapes = {k: tuple(v.shape) for k, v in feeds[0].items()}
    base_casts, base_bytes = float_casts(fp32, shapes)
    casts, cast_bytes = float_casts(model, shapes)
    result.casts, result.cast_bytes = casts - base_casts, cast_bytes - base_bytes
    result.tc_low = tc_low_share(model, shapes)
    try:
        validate(model, converted_from=fp32)
    except Exception as exc:  # noqa: BLE001 - "invalid" is a result
        result.valid = _first_line(exc)
    try:
        result.typed_faults = strongly_typed_faults(model)
    except Exception as exc:  # noqa: BLE001
        result.typed_faults = [f"the check failed: {_first_line(exc)}"]
    result.runs, _ = _runs(model, feeds[:1])
    try:
        # Without the intermediate value_info the tool wrote: onnxruntime's buffer reuse trips on the
        # shapes AutoCast writes once the emulation's rounding Casts sit beside them (its output runs).
        bare = onnx.ModelProto()
        bare.CopyFrom(model)
        del bare.graph.value_info[:]
        emulated = emulate(bare)
    except Exception as exc:  # noqa: BLE001 - its FP16 storage cannot be emulated
        result.error_note = f"not emulated: {_first_line(exc)}"
        return
    status, got = _runs(emulated, feeds)
    if got is None:
        result.error_note = f"its emulation does not run: {status}"
        return
    floats = [k for k, r in enumerate(reference[0]) if np.issubdtype(np.asarray(r).dtype, np.floating)]
    errors = OutputErrors(len(floats))
    for ref, out_arrays in zip(reference, got, strict=True):
        errors.add([np.asarray(ref[k], np.float64) for k in floats], [np.asarray(out_arrays[k], np.float64) for k in floats])
    result.error = errors.worst()


def run(names: list[str], log=print, timeout: int = 900) -> list[Result]:
    from amp_compiler.onnx.measure.checks import run_onnxruntime
    from models import catalog

    unavailable = modelopt_status()
    results = []
    with tempfile.TemporaryDirectory(prefix="amp-autocast-") as tmp:
        for name in names:
            entry = catalog.get(name)
            fp32 = catalog.load(entry)
            src = Path(tmp) / f"{name}.onnx"
            src.write_bytes(fp32.SerializeToString())
            feeds = [entry.make_inputs(np.random.default_rng(seed)) for seed in (0, 1)]
            reference = [run_onnxruntime(fp32, f) for f in feeds]
            for tool in TOOLS:
                result = Result(name, entry.kind, tool)
                results.append(result)
                if tool == "autocast" and unavailable:
                    result.status, result.detail = "unavailable", unavailable
                    continue
                log(f"{tool} on {name}")
                out = Path(tmp) / f"{name}.{tool}.onnx"
                answer = _child(tool, src, out, timeout)
                if "error" in answer or not out.exists():
                    result.status, result.detail = "failed", answer.get("error", "no output")
                    continue
                result.seconds, result.peak_rss = answer["seconds"], answer["peak_rss"]
                if tool == "amp-compiler":
                    from amp_compiler import convert

                    result.warnings = convert(fp32, provider="tensorrt", probe=False).provider_warnings
                try:
                    measure(result, fp32, out, feeds, reference)
                except Exception as exc:  # noqa: BLE001 - a measurement failing is reported
                    result.detail = f"measurement failed: {_first_line(exc)}"
                for path in Path(tmp).glob(f"{name}.{tool}.onnx*"):
                    path.unlink()
    return results


# ------------------------------------------------------------------------------------ the table


def _cell(r: Result) -> list[str]:
    if r.status != "ok":
        return [f"**{r.status}**: {r.detail}"] + [""] * 6
    share = "-" if r.tc_low is None else f"{100 * r.tc_low:.1f}%"
    error = f"{r.error:.2e}" if r.error is not None else r.error_note or "-"
    valid = "yes" if not r.valid else f"**no**: {r.valid}"
    typed = "none" if not r.typed_faults else "; ".join(r.typed_faults)[:160]
    return [share, f"{r.casts} / {r.cast_bytes / 1e6:.2f} MB", error, f"{valid}; runs: {r.runs}", typed,
            f"{r.seconds:.2f} s / {r.peak_rss / 2**20:.0f} MB"]


def both_convert(a: Result, b: Result) -> bool:
    """Both outputs valid, loaded and run, with an error measured: the rows the goals are judged on."""
    return all(r.status == "ok" and not r.valid and r.runs.startswith("yes") and r.error is not None for r in (a, b))


def table(results: list[Result]) -> list[str]:
    lines = [
        "| model | kind | tool | Tensor Core FLOPs FP16 | Casts added / MB | worst rel. L2 (emulated) | "
        "valid; onnxruntime | strongly typed faults | time / peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = _cell(r)
        lines.append(f"| {r.model} | {r.kind} | {r.tool} | " + " | ".join(cells) + " |")
    return lines


def verdict(results: list[Result]) -> list[str]:
    """Per model both convert: where amp-compiler has fewer Tensor Core FLOPs in FP16, more Casts or a
    larger error than AutoCast (the rows a sentence must explain), and the totals."""
    pairs = {}
    for r in results:
        pairs.setdefault(r.model, {})[r.tool] = r
    judged = worse = 0
    lines = []
    for model, by_tool in pairs.items():
        ours, theirs = by_tool.get("amp-compiler"), by_tool.get("autocast")
        if ours is None or theirs is None or not both_convert(ours, theirs):
            continue
        judged += 1
        assert ours.tc_low is not None and theirs.tc_low is not None and ours.error is not None
        assert theirs.error is not None and ours.casts is not None and theirs.casts is not None
        behind = []
        if ours.tc_low < theirs.tc_low - 1e-9:
            behind.append(f"Tensor Core FLOPs in FP16 {100 * ours.tc_low:.1f}% vs {100 * theirs.tc_low:.1f}%")
        if ours.casts > theirs.casts:
            behind.append(f"Casts {ours.casts} vs {theirs.casts}")
        if ours.error > theirs.error * 1.0001 + 1e-12:
            behind.append(f"error {ours.error:.2e} vs {theirs.error:.2e}")
        if behind:
            worse += 1
            lines.append(f"- {model}: " + ", ".join(behind) + ".")
    return [f"Models both convert to a valid output that runs: {judged}; amp-compiler behind AutoCast on any "
            f"of the three measures: {worse}."] + lines




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["small", "full"])
    parser.add_argument("--models", default=None, help="comma-separated catalog names (default: every one of --size)")
    parser.add_argument("--results", type=Path, default=None, help="write the table into this results file")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per tool and model")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        try:
            print(json.dumps(_worker(json.loads(args.worker))))
        except Exception as exc:  # noqa: BLE001 - the tool's failure, reported to the parent
            print(json.dumps({"error": f"{type(exc).__name__}: {_first_line(exc)}",
                              "trace": traceback.format_exc()[-1500:]}))
        return 0
    from models import catalog

    names = args.models.split(",") if args.models else [e.name for e in catalog.entries(args.size)]
    start = time.perf_counter()
    results = run(names, log=lambda m: print(f"[{time.perf_counter() - start:7.1f} s] {m}", file=sys.stderr, flush=True),
                  timeout=args.timeout)
    lines = table(results) + [""] + verdict(results)
    print("\n".join(lines))
    if args.results is not None:
        import importlib.metadata as md

        def version(package: str) -> str:
            try:
                return f"{package} {md.version(package)}"
            except md.PackageNotFoundError:
                return f"{package} not installed"

        versions = ", ".join(version(p) for p in ("nvidia-modelopt", "onnxruntime", "onnx"))
        head = [
            "## amp-compiler for TensorRT vs ModelOpt AutoCast",
            "",
            f"Command: `python -m benchmarks.autocast_table {' '.join(argv if argv is not None else sys.argv[1:])}` "
            f"({(time.perf_counter() - start) / 60:.1f} min; {versions}). What is measured: "
            "`benchmarks/autocast_table.py`'s docstring.",
            "",
        ]
        write_section(args.results, "\n".join(head + lines) + "\n", SECTION_BEGIN, SECTION_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
