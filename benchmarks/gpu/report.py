"""The GPU benchmark's outputs: the environment it ran in, ``gpu.json`` and ``gpu.md``, and the
section of ``benchmarks/RESULTS.md`` between ``<!-- gpu:begin -->`` and ``<!-- gpu:end -->``."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata as md
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.gpu.rows import SCHEMA_VERSION, Accuracy, Row, Timing

__all__ = ["SECTION_BEGIN", "SECTION_END", "environment", "markdown", "read", "write"]

ROOT = Path(__file__).resolve().parents[2]
SECTION_BEGIN = "<!-- gpu:begin (python -m benchmarks.gpu --results benchmarks/RESULTS.md) -->"
SECTION_END = "<!-- gpu:end -->"
_PACKAGES = ("onnxruntime-gpu", "onnxruntime", "tensorrt", "torch", "onnx", "onnx-ir", "numpy", "transformers",
             "onnxconverter-common", "nvidia-modelopt", "onnxruntime-genai")


def _run(cmd: list[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    return ""


def _gpus() -> list[str]:
    text = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    return [line.strip() for line in text.splitlines() if line.strip()]


def _cuda() -> str:
    found = re.search(r"CUDA Version:\s*([\d.]+)", _run(["nvidia-smi"]))
    return found.group(1) if found else ""


def _cpu() -> str:
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {os.cpu_count()} cores"


def environment(command: str, provider: str) -> dict[str, Any]:
    """Where and with what the run was made: the device, its driver and CUDA, the versions, the command."""
    versions = {"python": platform.python_version()}
    for package in _PACKAGES:
        with contextlib.suppress(md.PackageNotFoundError):
            versions[package] = md.version(package)
    runtime: dict[str, Any] = {}
    try:
        import onnxruntime as ort

        runtime = {"onnxruntime": ort.__version__, "available providers": ort.get_available_providers()}
    except Exception as exc:  # noqa: BLE001 - said in the report
        runtime = {"onnxruntime": f"does not import: {exc}"}
    with contextlib.suppress(Exception):
        import torch

        runtime["torch CUDA"] = torch.version.cuda or "none (a CPU build)"
    rev = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    return {
        "command": command,
        "provider": provider,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpus": _gpus() or ["none"],
        "cuda driver API": _cuda() or "-",
        "cpu": _cpu(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "amp-compiler commit": rev + (" (with uncommitted changes)" if dirty else ""),
        "versions": versions,
        "runtime": runtime,
    }


def read(folder: Path) -> dict[str, Any] | None:
    path = folder / "gpu.json"
    return json.loads(path.read_text()) if path.exists() else None


def write(folder: Path, env: dict[str, Any], settings: dict[str, Any], rows: list[Row]) -> str:
    """Write ``gpu.json`` and ``gpu.md`` into ``folder`` (each replaced whole); the Markdown."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"schema": SCHEMA_VERSION, "environment": env, "settings": settings, "rows": [r.to_dict() for r in rows]}
    text = markdown(env, settings, rows)
    for name, content in (("gpu.json", json.dumps(doc, indent=1) + "\n"), ("gpu.md", text)):
        tmp = folder / (name + ".tmp")
        tmp.write_text(content)
        tmp.replace(folder / name)
    return text


# ------------------------------------------------------------------------------------ Markdown


def _ms(t: Timing | None, base: Timing | None = None) -> str:
    if t is None:
        return "-"
    if t.median_ms is None:
        return f"- ({t.note})" if t.note else "-"
    text = f"{t.median_ms:.3f} / {t.p90_ms:.3f} ms"
    if base is not None and base.median_ms:
        text += f" ({base.median_ms / t.median_ms:.2f}x)"
    return text


def _speedup(t: Timing | None, base: Timing | None) -> str:
    if t is None or base is None or not t.median_ms or not base.median_ms:
        return "-"
    return f"{base.median_ms / t.median_ms:.2f}x"


def _acc(a: Accuracy | None) -> str:
    if a is None:
        return "-"
    if a.nonfinite:
        return "**NaN/Inf**"
    if a.cosine is None:
        return "-"
    return f"{a.cosine:.5f} / {a.error_of_range:.2%}"


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _at(row: Row | None, batch: int) -> Timing | None:
    if row is None:
        return None
    return next((t for t in row.latency if t.batch == batch), None)


def _where(row: Row) -> str:
    p = row.placement
    if p is None:
        return "-"
    text = f"{len(p.fallback)} of {p.nodes}"
    if p.fallback:
        text += ": " + ", ".join(p.fallback[:4]) + (" ..." if len(p.fallback) > 4 else "")
    return text


def _shape_like(row: Row) -> str:
    p = row.placement
    return "-" if p is None else f"{len(p.shape_like)}, {p.copies} copies"


def _status(row: Row) -> str:
    return "ok" if row.status == "ok" else f"**{row.status}**"


def markdown(env: dict[str, Any], settings: dict[str, Any], rows: list[Row]) -> str:
    provider = env["provider"]
    batches = list(settings["batches"])
    lines = [
        f"## GPU benchmark ({provider})", "",
        f"Command: `{env['command']}` ({env['date']}).", "",
        f"Device: {'; '.join(env['gpus'])}; CUDA (driver API) {env['cuda driver API']}; {env['cpu']}; "
        f"{env['platform']}.", "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + f"; onnxruntime providers {', '.join(env['runtime'].get('available providers', []))}; torch CUDA "
        f"{env['runtime'].get('torch CUDA', '-')}; amp-compiler commit {env['amp-compiler commit']}.", "",
        f"Latency: onnxruntime `{provider}`, inputs and outputs bound on the device (I/O binding), "
        f"{settings['warmup']} warm-up then {settings['repeats']} timed runs: median / p90, and the speed-up over "
        "FP32 on the same device. Memory: the device memory a session holds after its runs. Off the provider: "
        "nodes onnxruntime's profile shows elsewhere that read or write float tensors (CPU fallback), then "
        "shape arithmetic it places on the CPU on purpose and the copies it inserted. Accuracy: worst cosine / "
        "max error as a share of the output's range; on the device against FP32 on the device (the fp32 row: "
        "the device's FP32 against the CPU's); the emulator's (`amp_compiler.onnx.measure.emulate` on the "
        "CPU) against FP32 on the CPU; and the device's outputs against the emulator's (how well it predicts "
        "the device).", "",
    ]
    onnx_rows = [r for r in rows if r.part == "onnx"]
    models = list(dict.fromkeys(r.model for r in onnx_rows))
    if onnx_rows:
        variants = list(dict.fromkeys(r.variant for r in onnx_rows if r.variant != "fp32"))
        lines += [f"### Speed-up over FP32 (batch {' / '.join(map(str, batches))})", "",
                  "| model | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
        for model in models:
            ref = next((r for r in onnx_rows if r.model == model and r.variant == "fp32" and r.status == "ok"), None)
            cells = []
            for variant in variants:
                row = next((r for r in onnx_rows if r.model == model and r.variant == variant), None)
                if row is None or row.status != "ok" or ref is None:
                    cells.append("-" if row is None or row.status == "ok" else row.status)
                    continue
                ratios = [_speedup(_at(row, b), _at(ref, b)) for b in batches]
                fallback = f" ({len(row.placement.fallback)} on CPU)" if row.placement and row.placement.fallback else ""
                cells.append(" / ".join(ratios) + fallback)
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines.append("")
    for model in models:
        group = [r for r in onnx_rows if r.model == model]
        ref = next((r for r in group if r.variant == "fp32" and r.status == "ok"), None)
        lines += [f"### {model}", "",
                  "| variant | status | convert | " + " | ".join(f"batch {b}" for b in batches)
                  + " | memory | CPU fallback | shape-like on CPU | device accuracy | emulator | emulator vs device |",
                  "|---" * (9 + len(batches)) + "|"]
        for r in group:
            if r.status != "ok":
                lines.append(f"| {r.variant} | {_status(r)}: {r.error} |" + " |" * (7 + len(batches)))
                continue
            lat = " | ".join(_ms(_at(r, b), None if r is ref else _at(ref, b)) for b in batches)
            seconds = "-" if r.seconds is None else f"{r.seconds:.1f} s"
            lines.append(f"| {r.variant} | ok | {seconds} | {lat} | {_mb(r.memory_bytes)} | {_where(r)} | "
                         f"{_shape_like(r)} | {_acc(r.accuracy_device)} | {_acc(r.accuracy_emulated)} | "
                         f"{_acc(r.emulator_vs_device)} |")
        lines.append("")
    lines += _tensorrt(rows, batches) + _fx(rows) + _failures(rows)
    return "\n".join(lines).rstrip() + "\n"


def _tensorrt(rows: list[Row], batches: list[int]) -> list[str]:
    group = [r for r in rows if r.part == "tensorrt"]
    if not group:
        return []
    lines = ["### TensorRT", "",
             "Engines built with TensorRT's Python API (`benchmarks/gpu/tensorrt.py`, `build_engine`): `strong:` a "
             "strongly typed network of that variant's file; `fp16-flag:fp32` weak typing's FP16 flag on the FP32 "
             "model. Latency with CUDA events; accuracy against the FP32 model's strongly typed engine.", "",
             "| model | engine | status | build | " + " | ".join(f"batch {b}" for b in batches)
             + " | device accuracy | emulator vs device |", "|---" * (6 + len(batches)) + "|"]
    for r in group:
        if r.status != "ok":
            lines.append(f"| {r.model} | {r.variant} | {_status(r)}: {r.error} |" + " |" * (3 + len(batches)))
            continue
        ref = next((x for x in group if x.model == r.model and x.variant == "strong:fp32" and x.status == "ok"), None)
        lat = " | ".join(_ms(_at(r, b), None if r is ref else _at(ref, b)) for b in batches)
        lines.append(f"| {r.model} | {r.variant} | ok | {r.seconds:.1f} s | {lat} | {_acc(r.accuracy_device)} | "
                     f"{_acc(r.emulator_vs_device)} |")
    return lines + [""]


def _fx(rows: list[Row]) -> list[str]:
    lines: list[str] = []
    for part, title, setup in (("fx-train", "FX training step", "prepare"), ("fx-infer", "FX inference", "setup")):
        group = [r for r in rows if r.part == part]
        if not group:
            continue
        lines += [f"### {title}", "",
                  f"| model | variant | status | {setup} | batch | median / p90 (vs FP32) | peak memory | last loss |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in group:
            if r.status != "ok":
                lines.append(f"| {r.model} | {r.variant} | {_status(r)}: {r.error} | | | | | |")
                continue
            ref = next((x for x in group if x.model == r.model and x.variant == "fp32" and x.status == "ok"), None)
            t = r.latency[0] if r.latency else None
            base = ref.latency[0] if ref is not None and ref is not r and ref.latency else None
            loss = "-" if r.loss is None else f"{r.loss:.4f}" + (f" ({r.skipped_steps} skipped)" if r.skipped_steps else "")
            lines.append(f"| {r.model} | {r.variant} | ok | {r.seconds:.1f} s | {t.batch if t else '-'} | "
                         f"{_ms(t, base)} | {_mb(r.memory_bytes)} | {loss} |")
        lines.append("")
    return lines


def _failures(rows: list[Row]) -> list[str]:
    bad = [r for r in rows if r.status != "ok" or r.error]
    if not bad:
        return []
    return ["### Rows that did not measure everything", ""] + [
        f"- {r.part} {r.model} {r.variant}: {r.status}: {r.error}" for r in bad] + [""]
