"""The command line of ``python -m benchmarks.gpu`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu import report
from benchmarks.gpu.cases import FULL, FX_FULL, FX_QUICK, QUICK
from benchmarks.gpu.fx import INFER, TRAIN
from benchmarks.gpu.rows import FINAL, Row, Step
from benchmarks.gpu.runner import run_steps
from benchmarks.gpu.settings import Settings, full, quick
from benchmarks.gpu.variants import DEFAULT

PARTS = ("onnx", "tensorrt", "fx")


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def plan(models: list[str], variants: list[str], parts: list[str], fx_models: list[str]) -> list[Step]:
    """Every step of the run, model by model: the ONNX variants, then the TensorRT engines (one
    strongly typed engine per variant, FP32's first: the others' reference; weak typing's FP16 flag
    on the FP32 model last), then the FX part's training and inference variants."""
    steps = []
    for model in models:
        if "onnx" in parts:
            steps += [Step("onnx", model, v) for v in variants]
        if "tensorrt" in parts:
            steps += [Step("tensorrt", model, f"strong:{v}") for v in ["fp32", *(v for v in variants if v != "fp32")]]
            steps.append(Step("tensorrt", model, "fp16-flag:fp32"))
    if "fx" in parts:
        for model in fx_models:
            steps += [Step("fx-train", model, v) for v in TRAIN] + [Step("fx-infer", model, v) for v in INFER]
    return steps


def parse(argv: list[str] | None) -> argparse.Namespace:
    import benchmarks.gpu as package

    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=(package.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--provider", choices=("cuda", "tensorrt", "cpu"), default="cuda")
    parser.add_argument("--models", type=_names, default=None, help="catalog names, comma-separated (default: all of the mode's)")
    parser.add_argument("--variants", type=_names, default=list(DEFAULT), help=f"comma-separated subset of {', '.join(DEFAULT)}")
    parser.add_argument("--parts", type=_names, default=list(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    parser.add_argument("--fx-models", type=_names, default=None, help="the FX part's architectures (default: resnet50,bert-base)")
    parser.add_argument("--quick", action="store_true", help="the reduced -small models, few runs: the code path in minutes on a CPU")
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu.json and gpu.md")
    parser.add_argument("--results", type=Path, default=None, help="also write the Markdown into this file's gpu section")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in OUT/gpu.json, measure the rest")
    parser.add_argument("--workdir", type=Path, default=None, help="models, variants and references (default: a temporary folder)")
    parser.add_argument("--deadline-min", type=float, default=None, help="start no step after this many minutes")
    parser.add_argument("--step-timeout", type=float, default=None, help="seconds one variant may take")
    parser.add_argument("--render", type=Path, default=None,
                        help="measure nothing: write OUT/gpu.md (and --results) from this gpu.json")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    args = parser.parse_args(argv)
    from models import catalog

    known = {e.name for e in catalog.entries(None)}
    args.models = args.models if args.models is not None else list(QUICK if args.quick else FULL)
    args.fx_models = args.fx_models if args.fx_models is not None else list(FX_QUICK if args.quick else FX_FULL)
    for flag, given, allowed in (("--models", args.models, known), ("--variants", args.variants, set(DEFAULT)),
                                 ("--parts", args.parts, set(PARTS)), ("--fx-models", args.fx_models, known)):
        unknown = [g for g in given if g not in allowed]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
    return args


def settings_of(args: argparse.Namespace, workdir: Path) -> Settings:
    base = (quick if args.quick else full)(args.provider, str(workdir))
    changes: dict = {}
    if args.repeats is not None:
        changes["repeats"] = args.repeats
    if args.warmup is not None:
        changes["warmup"] = args.warmup
    if args.step_timeout is not None:
        changes["step_timeout_s"] = args.step_timeout
    if args.deadline_min is not None:
        changes["deadline"] = time.time() + 60 * args.deadline_min
    return Settings(**{**base.to_dict(), **changes})


def render(source: Path, out: Path, results: Path | None) -> int:
    """Write the Markdown of a ``gpu.json`` (a run made elsewhere, on the lent GPU machine)."""
    import json

    doc = json.loads(source.read_text())
    text = report.write(out, doc["environment"], doc["settings"], [Row.from_dict(r) for r in doc["rows"]])
    if results is not None:
        from benchmarks.cold import write_section

        write_section(results, text, report.SECTION_BEGIN, report.SECTION_END)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.render is not None:
        return render(args.render, args.out, args.results)
    command = "python -m benchmarks.gpu " + " ".join(sys.argv[1:] if argv is None else argv)
    start = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f} s] {message}", file=sys.stderr, flush=True)

    previous = report.read(args.out) if args.resume else None
    kept = [Row.from_dict(r) for r in (previous or {}).get("rows", []) if r["status"] in FINAL]
    if previous:
        command = previous["environment"]["command"] + " && " + command
    steps = plan(args.models, args.variants, args.parts, args.fx_models)
    done = {r.step for r in kept}
    todo = [s for s in steps if s not in done]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="amp-gpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    settings = settings_of(args, workdir)
    env = report.environment(command, args.provider)
    measured: dict[Step, Row] = {}

    def ordered() -> list[Row]:
        by_step = {r.step: r for r in kept} | measured
        ours = [by_step[s] for s in steps if s in by_step]
        return ours + [r for r in kept if r.step not in set(steps)]

    say(f"{len(todo)} steps to measure ({len(steps) - len(todo)} kept from {args.out / 'gpu.json'})")
    log = args.out / "gpu.log"
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for row in run_steps(todo, settings, log=log, say=say):
            measured[row.step] = row
            say(f"  {row.status}" + (f": {row.error}" if row.error else ""))
            report.write(args.out, env, settings.to_dict(), ordered())
            if row.part != "fx-train" and row.part != "fx-infer" and _last_of_model(row.step, todo):
                shutil.rmtree(workdir / row.model, ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    text = report.write(args.out, env, settings.to_dict(), ordered())
    if args.results is not None:
        from benchmarks.cold import write_section

        write_section(args.results, text, report.SECTION_BEGIN, report.SECTION_END)
    say(f"done: {args.out / 'gpu.md'}")
    return 0


def _last_of_model(step: Step, todo: list[Step]) -> bool:
    """Whether ``step`` is the last ONNX or TensorRT step of its model (its work folder can go)."""
    later = todo[todo.index(step) + 1:]
    return not any(s.model == step.model and s.part in ("onnx", "tensorrt") for s in later)


if __name__ == "__main__":
    sys.exit(main())
