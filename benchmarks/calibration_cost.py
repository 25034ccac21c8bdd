"""What calibration costs against running the model: time and peak memory, whole processes as users run them.

    python -m benchmarks.calibration_cost [--samples 4] [--models resnet50-768,ppocr-v4-det,vit-base]
                                          [--repeats 3] [--tolerance 0.01] [--results benchmarks/RESULTS.md]

Per model, each in a fresh process (as ``benchmarks.cold`` spawns them; peak RSS is ``ru_maxrss``
from ``os.wait4``: the largest process of the tree, the runner's child included):

- **plain**: N runs of the FP32 model in onnxruntime (default session options, this process): the
  time of the N runs (the session's creation apart, the goal's measure), the same with the session's
  creation (calibration's time includes loading the model: with few samples its fixed cost counts),
  and the process's peak RSS;
- **calibration**: :func:`amp_compiler.collect_ranges` over the same N samples (the model's loading
  into the runner's child included), its time and the tree's peak RSS; the parent's and the child's
  peaks apart, and the parent's before calibration (the model and the samples loaded, amp_compiler
  imported: what calibration's own memory comes on top of);
- the child's peak is its own (``VmHWM`` in ``/proc``, read before it ends): its ``ru_maxrss`` starts at the
  parent's RSS when it was spawned (Linux keeps the mark across ``exec``), the model's weights on ViT-B;
- plain and calibration ``--repeats`` times each, interleaved (the shared machine's load shifts both
  alike): the times are medians, the memory figures the largest;
- **probe**: the same over 1 and 2 generated samples (:func:`amp_compiler.runtime.samples.random_samples`
  at the same input size): what a range probe costs;
- ``--tolerance T``: :func:`amp_compiler.refine` at tolerance T on the N samples (its default
  hold-out: the last quarter held out) of the detectors (``detect-head-768``, ``ppocr-v4-det``), in a
  fresh process, against its calibration's time (the goal: within 10x): its time, the model runs it
  made, the units it measured and the process tree's peak RSS.

The goals (issue 23): calibration time <= 3x the N plain runs; peak RSS <= the FP32 weights + 2x
the largest set of live activations (computed from the run: each float tensor's size, from the
calibration's value counts, alive from its producer to its last consumer in the graph's order), to
which the table adds the runtime's own floor (a process with numpy and onnxruntime imported, no model);
``child x bound`` holds the child (the process calibration starts) to it, ``x bound`` the larger of the
two processes (the parent holds the model the caller loaded).
Beside it, the calibration's peak over the plain run's (``x plain's``): onnxruntime's own run of a
model can exceed the bound (its arena, its prepacked weights: ViT-B's 437 MB against 412 MB).

Models: ``resnet50-768`` (the catalog's ResNet-50, its input made 768x768: a detector-sized conv
net), ``detect-head-768`` (the catalog's ``detect-head-overflow``, issue 23's first pattern: a conv
backbone and a detection head whose hidden Conv overflows FP16, at the 768x768 of the detector it
was found on), ``ppocr-v4-det`` (the text detector of the PaddleOCR wheel at 1024x736), ``vit-base`` (ViT-B/16,
86M parameters, BERT-base's size, at 224x224: 197 tokens). Before/after figures: the "before" table
in RESULTS.md came from the same measurement with the calibration processes importing an export of
the older checkout (``PYTHONPATH`` alone does not do it: the editable install's finder comes first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from benchmarks.cold import _ENV, _spawn, write_section

ROOT = Path(__file__).resolve().parent.parent
SECTION_BEGIN = "<!-- calibration-cost:begin (python -m benchmarks.calibration_cost --results) -->"
SECTION_END = "<!-- calibration-cost:end -->"

#: name -> (catalog entry, input shape, input values: "image" 0..1 or "normal")
MODELS = {
    "resnet50-768": ("resnet50", (1, 3, 768, 768), "normal"),
    "detect-head-768": ("detect-head-overflow", (1, 3, 768, 768), "image"),
    "ppocr-v4-det": ("ppocr-v4-det", (1, 3, 736, 1024), "image"),
    "vit-base": ("vit-base", (1, 3, 224, 224), "normal"),
}
DEFAULT_MODELS = tuple(MODELS)
TOLERANCE_MODELS = ("detect-head-768", "ppocr-v4-det")

_PLAIN = """
import sys, time, resource, numpy as np, onnxruntime as ort
data = np.load(sys.argv[2])
samples = [{k: data[k] for k in data.files if k.startswith(f"{i}/")} for i in range(int(sys.argv[3]))]
opts = ort.SessionOptions(); opts.log_severity_level = 4
loading = time.perf_counter()
session = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
start = time.perf_counter()
for s in samples:
    session.run(None, {name: next(iter(s.values()))})
print(time.perf_counter() - loading, time.perf_counter() - start)
"""

_CALIBRATE = """
import sys, time, json, resource, numpy as np, onnx
from amp_compiler import collect_ranges
from amp_compiler.runtime.runner import ChildRunner
model = onnx.load(sys.argv[1])
name = model.graph.input[0].name
if sys.argv[2] == "random":
    rng = np.random.default_rng(0)
    shape = tuple(json.loads(sys.argv[3]))
    samples = [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(int(sys.argv[4]))]
else:
    data = np.load(sys.argv[2])
    samples = [{name: data[f"{i}/{name}"]} for i in range(int(sys.argv[3]))]
kib = 1024
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib
start = time.perf_counter()
child = 0
with ChildRunner() as runner:
    ranges = collect_ranges(model, samples, runner=runner)
    try:  # the child's own peak: its ru_maxrss starts at this process's RSS when it was spawned (kept across exec)
        with open(f"/proc/{runner._proc.pid}/status") as f:
            child = next(int(line.split()[1]) * kib for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        pass
seconds = time.perf_counter() - start  # the /proc read within: a tenth of a millisecond
runner._proc.wait()  # closed, it is reaped on a thread: its ru_maxrss counts once it is
print(json.dumps({"seconds": seconds, "self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib,
                  "before": before, "child": child or resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib,
                  "counts": {k: r.count for k, r in ranges.items()}}))
"""

_TOLERANCE = """
import sys, time, json, numpy as np, onnx
from amp_compiler import refine
model = onnx.load(sys.argv[1])
name = model.graph.input[0].name
data = np.load(sys.argv[2])
samples = [{name: data[f"{i}/{name}"]} for i in range(int(sys.argv[3]))]
start = time.perf_counter()
r = refine(model, samples, float(sys.argv[4]))
print(json.dumps({"seconds": time.perf_counter() - start, "met": r.met, "runs": r.model_runs, "fp32_runs": r.fp32_runs,
                  "rounds": r.rounds, "units": r.units, "pinned": len(r.pinned), "low": r.low_flops_share}))
"""

_FLOOR = "import numpy, onnxruntime"


def prepare(name: str, folder: Path, n: int) -> tuple[Path, Path]:
    """The model's file, its weights in an external data file beside it (dims of its image input
    made free where they were fixed), and N samples in one npz. In a child process: Linux keeps a
    process's peak RSS across ``exec``, and the measured processes must not start as a large copy of this one."""
    code = f"from benchmarks.calibration_cost import _prepare; _prepare({name!r}, {str(folder)!r}, {n})"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env=_ENV)
    return folder / f"{name}.onnx", folder / f"{name}.npz"


def _prepare(name: str, folder: str, n: int) -> None:
    from models import catalog

    entry, shape, kind = MODELS[name]
    model = catalog.load(entry)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for d, size in zip(dims, shape, strict=True):
        if d.HasField("dim_value") and d.dim_value != size:
            d.dim_param = f"d{size}"
    del model.graph.value_info[:]
    for out in model.graph.output:  # their spatial dims follow the input's
        for k, d in enumerate(out.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and k >= 2:
                d.dim_param = f"{out.name}_{k}"
    onnx.save(model, Path(folder) / f"{name}.onnx", save_as_external_data=True, location=f"{name}.onnx.data")
    rng = np.random.default_rng(1)
    sample = {}
    for i in range(n):
        x = rng.uniform(0, 1, shape) if kind == "image" else rng.standard_normal(shape)
        sample[f"{i}/{model.graph.input[0].name}"] = x.astype(np.float32)
    np.savez(Path(folder) / f"{name}.npz", **sample)


def live_bytes(model: onnx.ModelProto, counts: dict[str, int], n: int) -> int:
    """The largest sum of float tensors alive at once in one run (main graph, its order; a tensor is
    alive from its producer to its last consumer; sizes from the calibration's counts over n samples)."""
    size = {k: c * 4 // n for k, c in counts.items()}
    last: dict[str, int] = {}
    for i, node in enumerate(model.graph.node):
        for x in node.input:
            last[x] = i
    for out in model.graph.output:
        last[out.name] = len(model.graph.node)
    alive = {i.name: size.get(i.name, 0) for i in model.graph.input}
    peak = sum(alive.values())
    for i, node in enumerate(model.graph.node):
        for o in node.output:
            if o in size:
                alive[o] = size[o]
        peak = max(peak, sum(alive.values()))
        for k in [k for k in alive if last.get(k, -1) <= i]:
            del alive[k]
    return peak


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the FP32 weights: initializers and Constant nodes' tensors (the graph only is loaded:
    large values lie in the external data file, their dims say their size)."""
    tensors = [*model.graph.initializer]
    tensors += [a.t for node in model.graph.node if node.op_type == "Constant" for a in node.attribute if a.name == "value"]
    return sum(int(np.prod(t.dims)) * 4 for t in tensors if t.data_type == onnx.TensorProto.FLOAT)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def measure(
    names: list[str], n: int, tolerance: float | None, timeout_s: float, log=print, repeats: int = 3,
) -> list[str]:
    py = sys.executable
    header = ("| model | input | FP32 weights | live activations (max) | N | N plain runs (with the session's creation) "
              "| calibration | x plain (with the session) | "
              "probe 1 / 2 samples | peak RSS plain | peak RSS calibration: parent (before it) / child | x plain's | "
              "bound: weights + 2x live + runtime floor | child x bound | x bound |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    lines: list[str] = []  # --tolerance, per detector
    with tempfile.TemporaryDirectory(prefix="amp-calib-cost-") as tmp:
        folder = Path(tmp)
        floor = _spawn([py, "-c", _FLOOR], timeout_s).peak_rss
        log(f"runtime floor (numpy + onnxruntime imported): {_mb(floor)}")
        for name in names:
            path, data = prepare(name, folder, n)
            model = onnx.load(path, load_external_data=False)
            shape = MODELS[name][1]
            _spawn([py, "-c", _CALIBRATE, str(path), "random", json.dumps(shape), "1"], timeout_s)  # bytecode, page cache
            plains, cals = [], []
            for _ in range(repeats):  # interleaved: the machine's load shifts both alike
                plains.append(_spawn([py, "-c", _PLAIN, str(path), str(data), str(n)], timeout_s))
                cals.append(_spawn([py, "-c", _CALIBRATE, str(path), str(data), str(n)], timeout_s))
            loaded_s = statistics.median(float(p.stdout.split()[-2]) for p in plains)
            plain_s = statistics.median(float(p.stdout.split()[-1]) for p in plains)
            infos = [json.loads(c.stdout.strip().splitlines()[-1]) for c in cals]
            seconds = statistics.median(i["seconds"] for i in infos)
            info = max(infos, key=lambda i: i["child"])  # the memory figures: the largest of the runs
            plain_rss = max(p.peak_rss for p in plains)
            cal_rss = max(max(i["self"], i["child"]) for i in infos)  # not wait4's: the child's starts at the parent's
            probes = []
            for k in (1, 2):
                p = _spawn([py, "-c", _CALIBRATE, str(path), "random", json.dumps(shape), str(k)], timeout_s)
                probes.append(json.loads(p.stdout.strip().splitlines()[-1])["seconds"])
            weights, live = weight_bytes(model), live_bytes(model, info["counts"], n)
            bound = weights + 2 * live + floor
            log(f"  {name}: plain {plain_s:.2f} s ({loaded_s:.2f} s with the session), calibration {seconds:.2f} s "
                f"(medians of {repeats}), peak {_mb(cal_rss)} (parent {_mb(info['self'])}, {_mb(info['before'])} before "
                f"it; child {_mb(info['child'])}), bound {_mb(bound)}")
            rows.append(
                f"| {name} | {'x'.join(map(str, shape))} | {_mb(weights)} | {_mb(live)} | {n} | {plain_s:.2f} s ({loaded_s:.2f} s) | "
                f"{seconds:.2f} s | {seconds / plain_s:.1f}x ({seconds / loaded_s:.1f}x) | "
                f"{probes[0]:.2f} s / {probes[1]:.2f} s | "
                f"{_mb(plain_rss)} | {_mb(info['self'])} ({_mb(info['before'])}) / {_mb(info['child'])} | "
                f"{cal_rss / plain_rss:.2f}x | {_mb(bound)} | {info['child'] / bound:.2f}x | {cal_rss / bound:.2f}x |"
            )
            if tolerance is not None and name in TOLERANCE_MODELS:
                lines.append(_tolerance_line(name, path, data, n, tolerance, seconds, timeout_s))
                log("  " + lines[-1])
    return rows + [""] + [f"- {line}" for line in lines]


def _tolerance_line(name: str, path: Path, data: Path, n: int, tolerance: float, calibration_s: float,
                    timeout_s: float) -> str:
    """``refine`` of the model in a fresh process, against its calibration's time, in one line."""
    what = f"`--tolerance {tolerance}` on {name} ({n} samples)"
    try:
        tol = _spawn([sys.executable, "-c", _TOLERANCE, str(path), str(data), str(n), str(tolerance)], timeout_s)
    except TimeoutError:
        return f"{what}: over {timeout_s:.0f} s (stopped), over {timeout_s / calibration_s:.0f}x its calibration"
    r = json.loads(tol.stdout.strip().splitlines()[-1])
    return (f"{what}: {r['seconds']:.1f} s, **{r['seconds'] / calibration_s:.1f}x its calibration** "
            f"({calibration_s:.1f} s); met {r['met']}, {r['units']} units measured, {r['runs']} converted/probe runs "
            f"+ {r['fp32_runs']} FP32 runs, {r['rounds']} conversions, {r['pinned']} nodes pinned, "
            f"{r['low']:.0%} of the units' Tensor Core FLOPs low; peak RSS {_mb(tol.peak_rss)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--tolerance", type=float, default=None,
                        help=f"also time --tolerance on {', '.join(TOLERANCE_MODELS)}")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    parser.add_argument("--repeats", type=int, default=3, help="plain and calibration runs per model (medians)")
    parser.add_argument("--results", type=Path, default=None,
                        help="also write the table into this file's calibration-cost section (benchmarks/RESULTS.md)")
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    rows = measure(names, args.samples, args.tolerance, args.timeout, log=lambda s: print(s, file=sys.stderr),
                   repeats=args.repeats)
    text = "\n".join([
        "## Calibration cost against running the model (issue 23)",
        "",
        f"`python -m benchmarks.calibration_cost --samples {args.samples}`: whole processes; times exclude "
        "Python's start-up, calibration's include loading the model into the runner's child; peak RSS is "
        "the largest process of the tree. The bound is the FP32 weights + 2x the largest set of live "
        "activations + the runtime's own floor (numpy and onnxruntime imported).",
        "",
        *rows,
    ])
    print(text)
    if args.results:
        write_section(args.results, text, SECTION_BEGIN, SECTION_END)


if __name__ == "__main__":
    main()
