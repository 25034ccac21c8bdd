"""The FX part: training steps and inference latency of amp-compiler's PyTorch path against autocast.

Training (``fx-train``), per model at ``fx_train_batch``: ``fp32``; ``autocast-fp16`` (``torch.autocast``
with ``GradScaler``); ``autocast-bf16`` (no scaler); ``ampfx-fp16`` and ``ampfx-bf16``
(``amp_compiler.fx.prepare_training``, its loss scaling ``auto``). Each step: forward, cross-entropy
of the first output over its last dimension against fixed random labels, backward, AdamW. The time
is the median (and p90) of ``fx_steps`` steps after ``fx_warmup``; memory is torch's peak allocated
CUDA memory over them; ``seconds`` is the preparation (capture and conversion).

Inference (``fx-infer``) at ``fx_infer_batch``, under ``torch.no_grad``: ``fp32``; ``autocast-fp16``,
``autocast-bf16``; ``ampfx.convert-fp16``/``-bf16`` (the converted GraphModule); ``ampfx.compile-fp16``
/``-bf16`` (the compile backend, inner backend ``fx_inner``; ``seconds`` is the first call, which
compiles). On a GPU runs are timed with CUDA events; on the CPU (``--provider cpu``) the same code
times them with the wall clock and memory is not measured.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.gpu.cases import at_batch
from benchmarks.gpu.rows import Row, Step, Timing
from benchmarks.gpu.settings import Settings

__all__ = ["INFER", "TRAIN", "fx_step"]

TRAIN = ("fp32", "autocast-fp16", "autocast-bf16", "ampfx-fp16", "ampfx-bf16")
INFER = ("fp32", "autocast-fp16", "autocast-bf16", "ampfx.convert-fp16", "ampfx.convert-bf16",
         "ampfx.compile-fp16", "ampfx.compile-bf16")


def _device(settings: Settings) -> str:
    return "cpu" if settings.provider == "cpu" else "cuda"


def _model(name: str, batch: int, device: str):
    """The architecture's torch module on ``device`` (positional inputs) and its inputs at ``batch``."""
    import torch

    from models.architectures import ARCHS, positional_module, to_torch

    arch = next(a for a in ARCHS if a.name == name)
    torch.manual_seed(0)
    module = positional_module(arch.torch_module(), list(arch.inputs)).to(device)
    feeds = at_batch(arch.make_inputs(np.random.default_rng(0)), batch, {n: ["batch"] for n in arch.inputs})
    assert not isinstance(feeds, str)  # every input's batch dimension is symbolic here
    return module, tuple(t.to(device) for t in to_torch(feeds).values())


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def loss_fn(out, labels):
    """Cross-entropy of the first output over its last dimension (FP32)."""
    import torch.nn.functional as F

    logits = _first(out).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _dtype(variant: str):
    import torch

    return torch.bfloat16 if variant.endswith("bf16") else torch.float16


def _timed(run: Callable[[], Any], device: str, warmup: int, steps: int) -> tuple[list[float], Any]:
    """Milliseconds of each of ``steps`` calls of ``run`` after ``warmup`` calls, and the last result."""
    import torch

    result = None
    for _ in range(warmup):
        result = run()
    if device == "cuda":
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in events:
            start.record()
            result = run()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in events], result
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        result = run()
        times.append((time.perf_counter() - began) * 1e3)
    return times, result


def _timing(batch: int, times: list[float]) -> Timing:
    return Timing(batch, statistics.median(times), float(np.percentile(times, 90)), len(times))


def _train(step: Step, settings: Settings, device: str, row: Row) -> None:
    import torch

    import amp_compiler.fx as ampfx

    module, inputs = _model(step.model, settings.fx_train_batch, device)
    with torch.no_grad():
        shape = _first(module.eval()(*inputs)).shape
    labels = torch.randint(0, shape[-1], tuple(shape[:-1]), generator=torch.Generator().manual_seed(1)).to(device)
    module.train()
    opt = torch.optim.AdamW(module.parameters(), lr=1e-5)
    start = time.perf_counter()
    if step.variant.startswith("ampfx-"):
        train = ampfx.prepare_training(module, loss_fn, (inputs, labels), target=step.variant.removeprefix("ampfx-"))

        def run():
            return train(inputs, labels, opt)
    else:
        autocast = step.variant.startswith("autocast-")
        dtype = _dtype(step.variant)
        scaler = torch.amp.GradScaler(device, enabled=autocast and dtype == torch.float16)

        def run():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=dtype, enabled=autocast):
                loss = loss_fn(module(*inputs), labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.detach()
    row.seconds = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, loss = _timed(run, device, settings.fx_warmup, settings.fx_steps)
    row.latency = [_timing(settings.fx_train_batch, times)]
    row.loss = float(loss)
    if step.variant.startswith("ampfx-"):
        row.skipped_steps = train.skipped
    _memory(row, device)


def _infer(step: Step, settings: Settings, device: str, row: Row) -> None:
    import torch

    import amp_compiler.fx as ampfx

    module, inputs = _model(step.model, settings.fx_infer_batch, device)
    module.eval()
    target = step.variant.rpartition("-")[2]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    start = time.perf_counter()
    fn: Callable[..., Any]
    if step.variant.startswith("ampfx.convert-"):
        fn = ampfx.convert(module, inputs, target=target)
    elif step.variant.startswith("ampfx.compile-"):
        fn = ampfx.compile(module, target=target, inner=settings.fx_inner)
        with torch.no_grad():
            fn(*inputs)  # the first call compiles
        row.note = f"inner backend {settings.fx_inner}"
    else:
        fn = module
        if step.variant.startswith("autocast-"):
            def context():
                return torch.autocast(device, dtype=_dtype(step.variant))
    row.seconds = time.perf_counter() - start

    def run():
        with torch.no_grad(), context():
            return fn(*inputs)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, _ = _timed(run, device, settings.fx_warmup, settings.fx_steps)
    row.latency = [_timing(settings.fx_infer_batch, times)]
    _memory(row, device)


def _memory(row: Row, device: str) -> None:
    if device == "cuda":
        import torch

        row.memory_bytes = int(torch.cuda.max_memory_allocated())
        row.memory_how = "torch's peak allocated CUDA memory over the timed runs"
    else:
        row.memory_how = "not measured on the CPU"


def fx_step(step: Step, settings: Settings) -> Row:
    """One training or inference variant of one model (``step.part`` fx-train or fx-infer)."""
    row = Row(step.part, step.model, step.variant)
    known = TRAIN if step.part == "fx-train" else INFER
    if step.variant not in known:
        row.status, row.error = "skipped", f"unknown {step.part} variant {step.variant!r}"
        return row
    try:
        (_train if step.part == "fx-train" else _infer)(step, settings, _device(settings), row)
    except Exception as exc:  # noqa: BLE001 - a variant that fails is a row
        text = str(exc).strip().splitlines()
        row.status, row.error = "failed", f"{type(exc).__name__}: {text[0][:300] if text else ''}"
    return row
