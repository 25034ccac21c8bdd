"""amp-compiler side by side with onnxconverter-common and NVIDIA ModelOpt AutoCast.

    python -m benchmarks.compare [--size smallest|small|full] [--out benchmarks/RESULTS.md]

Models: the catalog's public architectures (``models/catalog.py``, kind ``architecture``, at the
chosen size; ``smallest`` takes one), BERT-base and GPT-2 at full size with their weights inside
the file (setting ``small``, or ``--real``: one conversion per tool, a torch export of minutes the
first time they are built, then the catalog's cache) and generated transformer graphs (``benchmarks/generate.py``) of
1,000 to 100,000 nodes; ``full`` (or ``--large-gb``) adds a generated model of ~2.5 GB of weights,
saved with external data in a temporary folder.

Tools, each converting to FP16 with graph inputs and outputs kept FP32:
- amp-compiler: ``amp_compiler.convert(probe=False)`` (defaults otherwise: provider cuda, min-cut cast
  placement; from the graph alone, as the table's figures were measured);
- onnxconverter-common: ``float16.convert_float_to_float16(model, keep_io_types=True)``;
- ModelOpt AutoCast: ``modelopt.onnx.autocast.convert_to_mixed_precision(path, "fp16",
  keep_io_types=True, providers=["cpu"])``, where ``nvidia-modelopt`` imports (it is installed with
  ``pip install --no-deps``: its ONNX extra would bring CUDA packages).

Each (tool, model) runs in a fresh child process: load the file, convert, serialize (to a file with
external data for the external-data model), ``repeats`` times; the time is the median, the memory the
child's peak RSS (``VmHWM``). The parent then measures the last output: Cast nodes and the bytes they
move (shapes from shape inference with the inputs' concrete shapes), the low-precision share of Tensor
Core FLOPs (the policy table's ``tensor_core`` ops, FLOPs from ``amp_compiler.onnx.costs.costs.estimate``), model size, whether
onnxruntime (CPU) loads and runs it, and its accuracy against FP32 on onnxruntime with the converted
model's FP16 storage emulated exactly (``amp_compiler.onnx.measure.emulate``): worst cosine, worst max error as a
share of the output's range, NaN/Inf where FP32 is finite. A tool that fails or runs past its time
limit is reported as such. Where onnxruntime has the CUDA provider (or with ``--latency-provider``),
the FP32 model's and each output's latency at batch 1 and 8 and the nodes not placed on that provider
are measured too (``benchmarks/latency.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import onnx

TOOLS = ("amp-compiler", "onnxconverter-common", "modelopt-autocast")
LOW_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Setting:
    catalog: str | None  # catalog size for architectures (None: none)
    catalog_limit: int | None  # at most this many architectures
    generated: tuple[int, ...]  # node counts
    repeats: int
    peer_node_limit: dict[str, int]  # peers skip larger generated graphs (quadratic; stated in the table)
    timeout_s: int  # per (tool, model) child process
    large_gb: float  # the external-data model (0: none)
    real: tuple[str, ...] = ()  # full-size catalog architectures, weights inside the file (BERT-base, GPT-2)


_PEERS = {"modelopt-autocast": 3000}  # 1,000 nodes: 7 s, 3,000: 60 s
SETTINGS = {
    "smallest": Setting("small", 1, (1000,), 1, _PEERS, 120, 0.0),
    "small": Setting("small", None, (1000, 3000, 10_000, 30_000, 100_000), 3, _PEERS, 900, 0.0, ("bert-base", "gpt2")),
    "full": Setting("full", None, (1000, 3000, 10_000, 30_000, 100_000), 3, _PEERS, 900, 2.5),
}
#: Graphs this large are converted once per tool (a median of one), to keep the run short; the
#: generated graphs (up to 100,000 nodes) get the setting's repeats. So are models with this many
#: bytes of weights (BERT-base: 438 MB).
SINGLE_RUN_NODES = 300_000
SINGLE_RUN_BYTES = 100_000_000
#: onnxruntime's CPU session creation for an FP16 graph grows faster than its size (17 s at 10,000
#: nodes, where the same graph emulated in FP32, three times the nodes, takes 3 s): above this, the
#: outputs are not loaded or run (sizes and Cast/FLOPs counts are still measured).
MEASURE_NODE_LIMIT = 10_000


# ------------------------------------------------------------------------------------ the tools


def modelopt_status() -> str | None:
    """None when ModelOpt AutoCast imports here, else why not (one line)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from modelopt.onnx.autocast import convert_to_mixed_precision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure means "not available", with its reason
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def convert_once(tool: str, src: Path, out: Path, external: bool) -> None:
    """Load ``src``, convert it to FP16 with ``tool``, write the result to ``out``."""
    if tool == "amp-compiler":
        from amp_compiler import convert

        result = convert(src, probe=False)
        if external or result.output is not None:
            result.save(out)
        else:
            out.write_bytes(result.model.SerializeToString())
        return
    if tool == "onnxconverter-common":
        from onnxconverter_common import float16

        model = onnx.load(src)
        converted = float16.convert_float_to_float16(model, keep_io_types=True)
    elif tool == "modelopt-autocast":
        from modelopt.onnx.autocast import convert_to_mixed_precision

        converted = convert_to_mixed_precision(str(src), "fp16", keep_io_types=True, providers=["cpu"])
    else:
        raise ValueError(f"unknown tool {tool!r}")
    if external:
        onnx.save(converted, out, save_as_external_data=True, location=out.name + ".data")
    else:
        out.write_bytes(converted.SerializeToString())


def _import_tool(tool: str) -> None:
    if tool == "amp-compiler":
        import amp_compiler.onnx.convert  # noqa: F401
    elif tool == "onnxconverter-common":
        from onnxconverter_common import float16  # noqa: F401
    elif tool == "modelopt-autocast":
        from modelopt.onnx.autocast import convert_to_mixed_precision  # noqa: F401


def _peak_rss() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _worker(args: dict) -> dict:
    """Runs in the child: repeated conversions, their times and the process's peak memory."""
    src, out = Path(args["src"]), Path(args["out"])
    sink = io.StringIO()
    times = []
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging

        logging.disable(logging.WARNING)
        _import_tool(args["tool"])  # module imports are not conversion time
        for _ in range(args["repeats"]):
            start = time.perf_counter()
            convert_once(args["tool"], src, out, args["external"])
            times.append(time.perf_counter() - start)
    return {"times": times, "peak_rss": _peak_rss()}


@dataclasses.dataclass
class Run:
    tool: str
    model: str
    status: str = "ok"  # ok | failed | timeout | skipped | unavailable
    detail: str = ""
    seconds: float | None = None
    peak_rss: int | None = None
    casts: int | None = None
    cast_bytes: int | None = None
    tc_low_share: float | None = None
    size_ratio: float | None = None
    loads: bool | None = None
    runs: bool | None = None
    cosine: float | None = None
    max_error: float | None = None
    nonfinite: bool | None = None
    latency: list | None = None  # benchmarks.latency.Latency per batch size (when a provider is measured)
    placement: object | None = None  # benchmarks.latency.Placement


def _run_tool(tool: str, name: str, src: Path, out: Path, setting: Setting, external: bool) -> Run:
    run = Run(tool, name)
    payload = json.dumps({"tool": tool, "src": str(src), "out": str(out), "repeats": setting.repeats, "external": external})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.compare", "--worker", payload],
            capture_output=True, text=True, timeout=setting.timeout_s, cwd=ROOT, env=env,
        )
    except subprocess.TimeoutExpired:
        run.status, run.detail = "timeout", f"over {setting.timeout_s} s"
        return run
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        run.status, run.detail = "failed", tail[:160]
        return run
    if "error" in report:
        run.status, run.detail = "failed", report["error"][:160]
        return run
    run.seconds = statistics.median(report["times"])
    run.peak_rss = report["peak_rss"]
    return run


# ---------------------------------------------------------------------------------- measurements


def _cast_stats(model: onnx.ModelProto, shapes: dict | None) -> tuple[int, int, float | None]:
    """(Cast nodes, bytes they move, low-precision share of Tensor Core FLOPs)."""
    from amp_compiler.onnx.costs.costs import estimate, iter_nodes
    from amp_compiler.policy import default_table

    table = default_table()
    costs = estimate(model, shapes)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - no types: the share stays unknown
        inferred = model
    from amp_compiler.onnx.load.proto_walk import iter_proto_graphs

    types: dict[str, int] = {}
    for g in iter_proto_graphs(inferred.graph):
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
    casts = cast_bytes = 0
    tc_total = tc_low = 0
    for node, cost in zip(iter_nodes(model), costs.nodes):
        if node.op_type == "Cast":
            casts += 1
            cast_bytes += cost.bytes
        elif table.is_tensor_core(node.domain, node.op_type):
            tc_total += cost.flops
            if node.input and types.get(node.input[0]) in LOW_TYPES:
                tc_low += cost.flops
    return casts, cast_bytes, (tc_low / tc_total if tc_total else None)


def _short(exc: BaseException, out: Path) -> str:
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    text = text.replace(str(out.parent) + os.sep, "").replace("[ONNXRuntimeError] : 1 : FAIL : ", "")
    return text[:140]


def _file_bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def _measure_static(run: Run, ref_casts: tuple[int, int], src: Path, out: Path, shapes: dict | None) -> None:
    """What can be measured without onnxruntime: size, Casts, the Tensor Core share."""
    run.size_ratio = _file_bytes(out) / _file_bytes(src)
    casts, cast_bytes, share = _cast_stats(onnx.load(out), shapes)
    run.casts, run.cast_bytes, run.tc_low_share = casts - ref_casts[0], cast_bytes - ref_casts[1], share
    run.detail = f"not loaded in onnxruntime over {MEASURE_NODE_LIMIT:,} nodes"


def _measure(run: Run, ref_model: onnx.ModelProto, ref_casts: tuple[int, int], src: Path, out: Path,
             feeds: dict | None, reference: list | None, shapes: dict | None) -> None:
    import onnxruntime as ort

    from amp_compiler.onnx.measure.checks import compare, run_onnxruntime
    from amp_compiler.onnx.measure.emulate import emulate

    run.size_ratio = _file_bytes(out) / _file_bytes(src)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
        run.loads = True
    except Exception as exc:  # noqa: BLE001 - "does not load" is a result
        run.loads, run.runs = False, False
        run.detail = _short(exc, out)
        session = None
    if feeds is None:  # the external-data model: counts only (its weights are not needed for them)
        casts, cast_bytes, share = _cast_stats(onnx.load(out, load_external_data=False), shapes)
        run.casts, run.cast_bytes, run.tc_low_share = casts - ref_casts[0], cast_bytes - ref_casts[1], share
        return
    model = onnx.load(out)
    casts, cast_bytes, share = _cast_stats(model, shapes)
    run.casts, run.cast_bytes, run.tc_low_share = casts - ref_casts[0], cast_bytes - ref_casts[1], share
    if session is not None:
        try:
            names = {i.name for i in session.get_inputs()}
            session.run(None, {k: v for k, v in feeds.items() if k in names})
            run.runs = True
        except Exception as exc:  # noqa: BLE001
            run.runs = False
            run.detail = _short(exc, out)
    if not run.runs:
        return  # no accuracy for a model onnxruntime does not run
    try:
        got = run_onnxruntime(emulate(model), feeds)
    except Exception as exc:  # noqa: BLE001 - its FP16 storage cannot be emulated here
        run.detail = "accuracy not measured: emulating its FP16 storage failed: " + _short(exc, out)
        return
    accs = [compare(str(i), r, o) for i, (r, o) in enumerate(zip(reference, got)) if np.issubdtype(np.asarray(r).dtype, np.floating)]
    if accs:
        run.nonfinite = not all(a.finite for a in accs)
        finite = [a for a in accs if a.finite]
        run.cosine = min((a.cosine for a in finite), default=None)
        run.max_error = max((a.error_of_range for a in finite), default=None)


# --------------------------------------------------------------------------------------- driver


@dataclasses.dataclass
class Case:
    name: str
    kind: str  # catalog | generated | large
    path: Path
    nodes: int
    weight_bytes: int
    feeds: dict | None
    shapes: dict | None


def _cases(setting: Setting, folder: Path, log) -> list[Case]:
    from benchmarks.generate import large_model, transformer_inputs, transformer_model

    cases = []
    if setting.catalog:
        from models import catalog

        entries = catalog.entries(setting.catalog, "architecture")[: setting.catalog_limit]
        for entry in entries:
            log(f"building {entry.name}")
            model = catalog.load(entry)
            path = folder / f"{entry.name}.onnx"
            path.write_bytes(model.SerializeToString())
            feeds = entry.make_inputs(np.random.default_rng(0))
            cases.append(Case(entry.name, "catalog", path, len(model.graph.node), _weight_bytes(model), feeds,
                              {k: tuple(v.shape) for k, v in feeds.items()}))
    if setting.real:
        from models import catalog

    for name in setting.real:  # full size, weights inside the file: the catalog's cached export
        entry = catalog.get(name)
        log(f"building {name} (full size: a torch export of minutes the first time, then cached)")
        model = catalog.load(entry)
        path = folder / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        feeds = entry.make_inputs(np.random.default_rng(0))
        cases.append(Case(name, "catalog", path, len(model.graph.node), _weight_bytes(model), feeds,
                          {k: tuple(v.shape) for k, v in feeds.items()}))
        del model
    for n in setting.generated:
        model = transformer_model(n, batch="batch")  # any batch size: latency at batch 1 and 8
        path = folder / f"generated-{n}.onnx"
        onnx.save(model, path)
        cases.append(Case(f"generated-{n}", "generated", path, len(model.graph.node), _weight_bytes(model),
                          transformer_inputs(model), None))
    if setting.large_gb:
        sub = folder / "large"
        sub.mkdir()
        log(f"writing the {setting.large_gb:g} GB model")
        model, size = large_model(sub / "large.onnx", setting.large_gb * 1e9)
        cases.append(Case(f"generated-{setting.large_gb:g}GB", "large", sub / "large.onnx", len(model.graph.node),
                          size, None, None))
    return cases


def _weight_bytes(model: onnx.ModelProto) -> int:
    from amp_compiler.onnx.load.proto_walk import iter_model_tensors

    return sum(len(t.raw_data) for t in iter_model_tensors(model))


def latency_provider(requested: str | None = None) -> str | None:
    """The execution provider latency is measured on: ``requested``, else CUDA where onnxruntime has
    it (onnxruntime-gpu on a machine with a GPU), else none."""
    if requested:
        return requested
    import onnxruntime as ort

    return "CUDAExecutionProvider" if "CUDAExecutionProvider" in ort.get_available_providers() else None


def run_benchmark(setting: Setting, tools: tuple[str, ...], log=print, provider: str | None = None
                  ) -> tuple[list[Case], list[Run], dict]:
    """Every tool on every case; with ``provider``, also the latency of the FP32 model and of each
    tool's output on it (a Run with tool "fp32" holds the reference's)."""
    from amp_compiler.onnx.measure.checks import run_onnxruntime
    from benchmarks import latency

    unavailable = {}
    if "modelopt-autocast" in tools:
        why = modelopt_status()
        if why is not None:
            unavailable["modelopt-autocast"] = why
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="amp-bench-") as tmp:
        folder = Path(tmp)
        cases = _cases(setting, folder, log)
        for case in cases:
            external = case.kind == "large"
            ref_model = onnx.load(case.path, load_external_data=not external)
            measured = case.feeds is not None and case.nodes <= MEASURE_NODE_LIMIT
            reference = run_onnxruntime(ref_model, case.feeds) if measured else None
            ref_casts = _cast_stats(ref_model, case.shapes)[:2] if case.feeds is not None else (0, 0)
            if provider is not None and measured:
                log(f"latency of {case.name} (FP32) on {provider}")
                ref = Run("fp32", case.name)
                ref.latency, ref.placement = latency.measure(case.path, provider)
                runs.append(ref)
            for tool in tools:
                if tool in unavailable:
                    runs.append(Run(tool, case.name, "unavailable", unavailable[tool]))
                    continue
                if tool == "modelopt-autocast" and external:
                    runs.append(Run(tool, case.name, "skipped", "not run: it needs about 6.5x the model's size in RAM"))
                    continue
                limit = setting.peer_node_limit.get(tool)
                if limit is not None and case.kind == "generated" and case.nodes > limit:
                    runs.append(Run(tool, case.name, "skipped", f"not run over {limit} nodes: quadratic time"))
                    continue
                out_dir = folder / f"out-{tool}-{case.name}"
                out_dir.mkdir()
                out = out_dir / f"{case.name}.fp16.onnx"
                log(f"{tool} on {case.name} ({case.nodes} nodes)")
                single = case.nodes >= SINGLE_RUN_NODES or case.weight_bytes >= SINGLE_RUN_BYTES or external
                repeats = 1 if single else setting.repeats
                run = _run_tool(tool, case.name, case.path, out, dataclasses.replace(setting, repeats=repeats), external)
                if run.status == "ok":
                    try:
                        if case.nodes > MEASURE_NODE_LIMIT:
                            _measure_static(run, ref_casts, case.path, out, case.shapes)
                        else:
                            _measure(run, ref_model, ref_casts, case.path, out, case.feeds, reference, case.shapes)
                            if provider is not None and run.loads:
                                run.latency, run.placement = latency.measure(out, provider)
                    except Exception as exc:  # noqa: BLE001 - a measurement failing is reported, not fatal
                        run.detail = f"measurement failed: {type(exc).__name__}: {str(exc)[:120]}"
                runs.append(run)
                for p in out_dir.iterdir():
                    p.unlink()
                out_dir.rmdir()
    return cases, runs, unavailable


# ---------------------------------------------------------------------------------------- report


def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("amp-compiler", "onnx", "onnxruntime", "onnx-ir", "numpy", "onnxconverter-common", "nvidia-modelopt"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        out["amp-compiler commit"] = rev + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        pass
    return out


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(s for s in Path("/proc/meminfo").read_text().splitlines() if s.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration):
        pass
    load = ""
    with contextlib.suppress(OSError, AttributeError):
        load = f", load average {os.getloadavg()[0]:.1f} when the report was written"
    gpu = "no GPU"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30).stdout.split("\n")
        gpu = ", ".join(n.strip() for n in names if n.strip()) or gpu
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores{mem}, {gpu}{load}"


def _ratio(runs: list[Run], tool: str, base: str = "amp-compiler") -> tuple[float | None, int]:
    """Geometric mean over models of tool's time / base's time (where both ran)."""
    by_model = {r.model: r for r in runs if r.tool == base and r.seconds}
    logs = [math.log(r.seconds / by_model[r.model].seconds) for r in runs if r.tool == tool and r.seconds and r.model in by_model]
    return (math.exp(sum(logs) / len(logs)) if logs else None), len(logs)


def _row(run: Run, amp: Run | None) -> str:
    if run.status != "ok":
        return f"| {run.tool} | {run.status}: {run.detail} | | | | | | | | |"
    ratio = f"{run.seconds / amp.seconds:.1f}x" if amp is not None and amp.seconds else "-"
    nonfinite = {None: "-", True: "**yes**", False: "no"}[run.nonfinite]
    loads = {None: "-", True: "yes", False: "**no**"}[run.loads]
    if run.loads and run.runs is False:
        loads = "loads, **fails to run**"
    acc = "-" if run.cosine is None else f"{run.cosine:.5f} / {run.max_error:.2%}"
    if run.runs is False:
        acc = nonfinite = "does not run"
    if run.loads is None and run.detail:
        loads = f"- ({run.detail})"
    elif run.cosine is None and run.runs and run.detail:
        acc = run.detail
    return (
        f"| {run.tool} | {run.seconds:.2f} s ({ratio}) | {run.peak_rss / 2**20:.0f} MB | {_fmt(run.casts, 'd')} | "
        f"{_fmt(None if run.cast_bytes is None else run.cast_bytes / 1e6, '.2f')} | "
        f"{_fmt(None if run.tc_low_share is None else 100 * run.tc_low_share, '.1f')}% | {_fmt(run.size_ratio, '.2f')}x | "
        f"{acc} | {nonfinite} | {loads}{' (' + run.detail + ')' if run.detail and run.runs is False else ''} |"
    )


HEADER = (
    "| tool | time, median (vs amp-compiler) | peak RSS | Casts added | Cast MB moved | Tensor Core FLOPs in FP16 | "
    "size vs FP32 | worst cosine / max error (of range) | NaN/Inf | loads in onnxruntime |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def write_report(path: Path, setting_name: str, setting: Setting, cases: list[Case], runs: list[Run],
                 unavailable: dict, command: str, seconds: float) -> str:
    lines = ["# Benchmark: amp-compiler, onnxconverter-common, ModelOpt AutoCast", ""]
    lines += [
        f"Command: `{command}` (setting `{setting_name}`: {setting.repeats} conversion(s) per tool and model in one "
        f"process, one for graphs of {SINGLE_RUN_NODES:,} nodes or more and for the external-data model; "
        f"{seconds / 60:.1f} min in all).",
        "",
        f"Machine: {_machine()}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in _versions().items()) + ".",
        "",
        "What is measured (see `benchmarks/compare.py`): each conversion runs in a fresh child process: load the "
        "file, convert to FP16 with graph inputs/outputs kept FP32, serialize; the time is the median of the "
        "repeats, the memory the child's peak RSS. Casts and Cast bytes are those the conversion added (bytes "
        "read and written by the Cast nodes, shapes from shape inference with the inputs' concrete shapes); the "
        "Tensor Core share is the share of the FLOPs of Tensor Core ops (MatMul, Gemm, Conv, ConvTranspose, "
        "Einsum, LSTM, GRU, RNN: the policy table's `tensor_core` entries) whose inputs are FP16. "
        "Accuracy is against FP32 on onnxruntime CPU, with the converted model's FP16 storage emulated exactly "
        "(`amp_compiler.onnx.measure.emulate`; onnxruntime's CPU FP16 path would hide overflow and rounding): the worst cosine "
        "and the worst max error as a share of the output's range over float outputs; NaN/Inf counts values that "
        "are finite in FP32 but not in the converted model.",
        "",
    ]
    tools = sorted({r.tool for r in runs if r.tool in TOOLS}, key=TOOLS.index)
    lat_runs = [r for r in runs if r.latency is not None]
    # Headline: over the catalog.
    catalog_names = [c.name for c in cases if c.kind == "catalog"]
    lines += ["## Headline (public-architecture catalog)", ""]
    if catalog_names:
        lines += [
            "| tool | models converted | time vs amp-compiler (geometric mean) | peak RSS (median) | Casts added (total) | "
            "Cast MB (total) | Tensor Core FLOPs in FP16 (mean) | size vs FP32 (mean) | worst cosine | NaN/Inf outputs | loads and runs in onnxruntime |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for tool in tools:
            rs = [r for r in runs if r.tool == tool and r.model in catalog_names]
            ok = [r for r in rs if r.status == "ok"]
            if not ok:
                status = rs[0].status if rs else "-"
                lines.append(f"| {tool} | 0/{len(catalog_names)} ({status}: {rs[0].detail if rs else ''}) | | | | | | | | | |")
                continue
            ratio, n = _ratio([r for r in runs if r.model in catalog_names], tool)
            loads = sum(1 for r in ok if r.loads and r.runs)
            cos = [r.cosine for r in ok if r.cosine is not None]
            shares = [r.tc_low_share for r in ok if r.tc_low_share is not None]
            lines.append(
                f"| {tool} | {len(ok)}/{len(catalog_names)} | {'1.0x' if tool == 'amp-compiler' else _fmt(ratio, '.1f') + 'x'} | "
                f"{statistics.median(r.peak_rss for r in ok) / 2**20:.0f} MB | {sum(r.casts or 0 for r in ok)} | "
                f"{sum(r.cast_bytes or 0 for r in ok) / 1e6:.1f} | "
                f"{_fmt(100 * statistics.mean(shares) if shares else None, '.1f')}% | "
                f"{statistics.mean(r.size_ratio for r in ok):.2f}x | {_fmt(min(cos) if cos else None, '.5f')} | "
                f"{sum(1 for r in ok if r.nonfinite)} | {loads}/{len(catalog_names)} |"
            )
        lines.append("")
    for title, kind in (("Public architectures", "catalog"), ("Generated transformer graphs", "generated"), ("External data", "large")):
        group = [c for c in cases if c.kind == kind]
        if not group:
            continue
        lines += [f"## {title}", ""]
        for case in group:
            extra = f", {case.weight_bytes / 1e9:.2f} GB of FP32 weights in external data" if kind == "large" else (
                f", {case.weight_bytes / 1e6:.1f} MB of weights")
            lines += [f"### {case.name} ({case.nodes} nodes{extra})", "", HEADER]
            amp = next((r for r in runs if r.model == case.name and r.tool == "amp-compiler" and r.status == "ok"), None)
            for r in runs:
                if r.model == case.name and r.tool in TOOLS:
                    lines.append(_row(r, amp))
            if kind == "large" and amp is not None:
                lines += ["", f"amp-compiler's peak RSS is {amp.peak_rss / case.weight_bytes:.2f}x the weight bytes "
                          f"({amp.peak_rss / 2**30:.2f} GiB for {case.weight_bytes / 2**30:.2f} GiB)."]
            lines.append("")
    scale = [c for c in cases if c.kind == "generated"]
    if scale:
        lines += ["## Conversion time by graph size", "", "| nodes | " + " | ".join(tools) + " |", "|---" * (len(tools) + 1) + "|"]
        for case in scale:
            cells = []
            for tool in tools:
                r = next((r for r in runs if r.model == case.name and r.tool == tool), None)
                cells.append("-" if r is None else (f"{r.seconds:.2f} s" if r.status == "ok" else f"{r.status} ({r.detail})"))
            lines.append(f"| {case.nodes} | " + " | ".join(cells) + " |")
        lines.append("")
    if lat_runs:
        lines += _latency_section(cases, lat_runs)
    lines += ["## Notes", ""]
    if unavailable:
        for tool, why in unavailable.items():
            lines.append(f"- {tool} did not run: {why}.")
    if not lat_runs:
        lines.append(
            "- GPU latency (onnxruntime CUDA EP, FP32 vs each tool's output, batch 1 and 8, nodes not on the GPU) "
            "was not measured: onnxruntime here has no CUDA provider (`benchmarks/latency.py` measures it where "
            "it does, or on the provider given with `--latency-provider`)."
        )
    lines += [
        "- ModelOpt AutoCast is installed without its dependencies (`pip install --no-deps nvidia-modelopt`, then "
        "`pip install --no-deps onnx-graphsurgeon onnxslim polygraphy lief nvidia-ml-py`; its `[onnx]` extra "
        "would bring `cupy-cuda12x` and `onnxruntime-gpu`). It runs on the CPU onnxruntime and the CPU torch.",
    ]
    text = "\n".join(lines) + "\n"
    # Sections other benchmarks write (the cold processes', the deployment graphs', FP8's, the accuracy
    # comparison's) sit between <!-- name:begin ... --> and <!-- name:end --> markers: kept as they are.
    old = path.read_text() if path.exists() else ""
    for section in re.finditer(r"<!-- ([\w-]+):begin.*?-->.*?<!-- \1:end -->", old, re.DOTALL):
        text += "\n" + section.group(0) + "\n"
    path.write_text(text)
    return text


def _latency_section(cases: list[Case], runs: list[Run]) -> list[str]:
    provider = next(r.placement.provider for r in runs if r.placement is not None)
    lines = [
        f"## Latency on {provider}", "",
        f"onnxruntime `{provider}` (`benchmarks/latency.py`): median of 20 runs after 3 warm-up runs, random "
        "inputs; batch 8 where the model's batch dimension is not fixed. \"elsewhere\": nodes onnxruntime's "
        "profile shows on another provider (a missing kernel falls back to the CPU, with copies around it).",
        "",
        "| model | tool | batch 1 (vs FP32) | batch 8 (vs FP32) | nodes elsewhere |",
        "|---|---|---|---|---|",
    ]
    for case in cases:
        rows = [r for r in runs if r.model == case.name]
        ref = next((r for r in rows if r.tool == "fp32"), None)
        for r in rows:
            cells = []
            for k, lat in enumerate(r.latency):
                base = ref.latency[k].median_ms if ref is not None else None
                if lat.median_ms is None:
                    cells.append(f"- ({lat.note})")
                elif base and r is not ref:
                    cells.append(f"{lat.median_ms:.3f} ms ({lat.median_ms / base:.2f}x)")
                else:
                    cells.append(f"{lat.median_ms:.3f} ms")
            where = r.placement
            elsewhere = "-" if where is None else (
                f"{len(where.elsewhere)} of {where.nodes}" + (f": {', '.join(where.elsewhere[:5])}" if where.elsewhere else ""))
            lines.append(f"| {case.name} | {r.tool} | " + " | ".join(cells) + f" | {elsewhere} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", choices=list(SETTINGS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ", ".join(TOOLS))
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--large-gb", type=float, default=None, help="size of the external-data model (0: none)")
    parser.add_argument("--generated", default=None, help="comma-separated node counts of generated graphs")
    parser.add_argument("--real", default=None,
                        help="comma-separated full-size catalog architectures (default for small: bert-base,gpt2)")
    parser.add_argument("--latency-provider", default=None,
                        help="measure latency on this onnxruntime provider (default: CUDA where available; "
                             "CPUExecutionProvider exercises the code path, its times say nothing of GPUs)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        try:
            report = _worker(json.loads(args.worker))
        except Exception as exc:  # noqa: BLE001 - reported to the parent as this tool's failure
            report = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                      "trace": traceback.format_exc()[-2000:]}
        print(json.dumps(report))
        return 0
    setting = SETTINGS[args.size]
    if args.repeats is not None:
        setting = dataclasses.replace(setting, repeats=args.repeats)
    if args.large_gb is not None:
        setting = dataclasses.replace(setting, large_gb=args.large_gb)
    if args.generated is not None:
        setting = dataclasses.replace(setting, generated=tuple(int(n) for n in args.generated.split(",") if n))
    if args.real is not None:
        setting = dataclasses.replace(setting, real=tuple(n for n in args.real.split(",") if n))
    tools = tuple(t for t in args.tools.split(",") if t)
    unknown = set(tools) - set(TOOLS)
    if unknown:
        parser.error(f"unknown tool(s): {', '.join(sorted(unknown))}")
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f} s] {msg}", file=sys.stderr, flush=True)

    cases, runs, unavailable = run_benchmark(setting, tools, log, latency_provider(args.latency_provider))
    command = "python -m benchmarks.compare " + " ".join(argv if argv is not None else sys.argv[1:])
    text = write_report(Path(args.out), args.size, setting, cases, runs, unavailable, command.strip(), time.perf_counter() - start)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
