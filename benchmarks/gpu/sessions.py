"""onnxruntime on the benchmark's provider: sessions, latency with I/O bound on the device, memory.

Latency: inputs are copied to the device once (``OrtValue`` on ``cuda``, or ``cpu`` for the CPU
provider) and bound with onnxruntime's I/O binding, outputs are left on the device, so a timed run
is the model's work and no host copy; ``warmup`` runs first, then ``repeats`` timed runs of
``run_with_iobinding`` (which returns once the device is done), median and 90th percentile. Memory:
the device memory held once the runs are done, over what was held before the session was made (the
CUDA provider's arena keeps its peak; NVML's device figure, so the GPU must be otherwise idle), or
on the CPU provider the growth of the process's resident memory. CPU fallback: the nodes onnxruntime's
profile shows on another provider (:mod:`benchmarks.gpu.placement`).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpu.cases import at_batch
from benchmarks.gpu.placement import placement_from_profile
from benchmarks.gpu.rows import Placement, Timing

__all__ = ["PROVIDERS", "device_memory", "latency", "make_session", "placement", "run_outputs", "shapes", "typed"]

#: The onnxruntime providers of each ``--provider``, in order of preference.
PROVIDERS = {
    "cuda": ["CUDAExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider"],
    "cpu": ["CPUExecutionProvider"],
}
#: Options given to each provider: the CUDA arena grows by what is asked for (not by powers of two),
#: so the memory held is what the model needs.
_OPTIONS: dict[str, dict[str, str]] = {
    "CUDAExecutionProvider": {"arena_extend_strategy": "kSameAsRequested"},
    "TensorrtExecutionProvider": {},
    "CPUExecutionProvider": {},
}


_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def make_session(path: Path, provider: str, *, profile_prefix: str | None = None) -> Any:
    """An onnxruntime session of the model at ``path`` on ``provider`` (cuda, tensorrt or cpu).
    Raises RuntimeError when the first provider asked for did not start (onnxruntime falls back to
    the CPU silently)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    names = PROVIDERS[provider]
    session = ort.InferenceSession(str(path), opts, providers=[(n, _OPTIONS[n]) for n in names])
    started = session.get_providers()
    if started[0] != names[0]:
        raise RuntimeError(f"{names[0]} did not start (the session has {', '.join(started)})")
    return session


def device_type(provider: str) -> str:
    return "cpu" if provider == "cpu" else "cuda"


def shapes(session: Any) -> dict[str, list]:
    return {i.name: list(i.shape) for i in session.get_inputs()}


def typed(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` for the inputs the session has, float arrays in its input types (an FP16 KV cache
    for a graph that takes one)."""
    types = {i.name: i.type for i in session.get_inputs()}
    return {
        name: array.astype(_FLOATS[types[name]]) if array.dtype.kind == "f" and types[name] in _FLOATS else array
        for name, array in feeds.items() if name in types
    }


def run_outputs(session: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """One plain run: the outputs, in the session's output order, on the host."""
    return session.run(None, typed(session, feeds))


def _bind(session: Any, feeds: dict[str, np.ndarray], device: str) -> Any:
    import onnxruntime as ort

    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, 0))
    for out in session.get_outputs():
        binding.bind_output(out.name, device, 0)
    return binding


def latency(session: Any, feeds: dict[str, np.ndarray], provider: str, batches: tuple[int, ...],
            warmup: int, repeats: int) -> list[Timing]:
    """Median and p90 latency at each batch size, with inputs and outputs bound on the device."""
    timings = []
    for batch in batches:
        batched = at_batch(typed(session, feeds), batch, shapes(session))
        if isinstance(batched, str):
            timings.append(Timing(batch, note=batched))
            continue
        binding = _bind(session, batched, device_type(provider))
        for _ in range(warmup):
            session.run_with_iobinding(binding)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            session.run_with_iobinding(binding)
            times.append((time.perf_counter() - start) * 1e3)
        timings.append(Timing(batch, statistics.median(times), _percentile(times, 90), repeats))
    return timings


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def device_memory(provider: str) -> tuple[int | None, str]:
    """Memory in use now: the GPU's (NVML) for cuda and tensorrt, this process's resident set for cpu;
    with how it was measured."""
    if provider == "cpu":
        return _rss(), "process resident memory growth"
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("AMP_GPU_INDEX", "0")))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used), "device memory held after the runs (NVML)"
    except Exception as exc:  # noqa: BLE001 - no NVML: memory is not measured, and the row says why
        return None, f"not measured: NVML: {type(exc).__name__}: {exc}"


def _rss() -> int | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def placement(path: Path, provider: str, feeds: dict[str, np.ndarray]) -> Placement:
    """Where onnxruntime ran each node of one inference on ``feeds``, from its profile."""
    with tempfile.TemporaryDirectory(prefix="amp-gpu-profile-") as tmp:
        session = make_session(path, provider, profile_prefix=os.path.join(tmp, "run"))
        session.run(None, typed(session, feeds))
        events = json.loads(Path(session.end_profiling()).read_text())
    return placement_from_profile(events, PROVIDERS[provider][0])
