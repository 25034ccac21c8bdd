"""onnxruntime latency on one execution provider, and the nodes it did not place there.

    python -m benchmarks.latency model.onnx [--provider CUDAExecutionProvider] [--batch 1 8]

``benchmarks.compare`` calls :func:`measure` for every model and tool output when onnxruntime lists
the CUDA provider (``onnxruntime-gpu`` on a machine with a GPU): the median latency at each batch
size, and the nodes onnxruntime's profile shows on another provider (a node without a kernel for its
types on CUDA falls back to the CPU, with copies around it). Batch sizes a model cannot take (a static
batch dimension other than the one asked for) are reported as such, not faked. Inputs are random
normal floats and zero integers (valid indices), other symbolic dimensions 1.

The code is the same for every provider: the tests run it on the CPU provider.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


@dataclasses.dataclass
class Latency:
    batch: int
    median_ms: float | None  # None: not measured (see note)
    note: str = ""


@dataclasses.dataclass
class Placement:
    provider: str
    nodes: int  # nodes in onnxruntime's profile
    elsewhere: list[str]  # "OpType name (provider)" of the nodes not on ``provider``


def _session(path: Path, provider: str, profile_prefix: str | None = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), opts, providers=[provider])


def feeds_for(session, batch: int, seed: int = 0) -> dict[str, np.ndarray] | None:
    """Random inputs with a leading batch dimension of ``batch``; None when an input's batch
    dimension is fixed to another size."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        dims = list(info.shape)
        if dims:
            lead = dims[0]
            if isinstance(lead, int) and lead != batch:
                return None
            dims[0] = batch
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in dims]
        dtype = _NUMPY.get(info.type)
        if dtype is None:
            return None
        if np.issubdtype(dtype, np.floating):
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[info.name] = np.zeros(shape, dtype)
    return feeds


def median_latency_ms(session, feeds: dict[str, np.ndarray], repeats: int = 20, warmup: int = 3) -> float:
    """The median wall time of ``session.run`` over ``repeats`` runs, after ``warmup`` runs."""
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def nodes_elsewhere(events: list[dict], provider: str) -> tuple[int, list[str]]:
    """From onnxruntime profile events: how many nodes ran, and those that ran on another provider."""
    seen: dict[str, str] = {}
    for event in events:
        args = event.get("args") or {}
        if event.get("cat") != "Node" or "provider" not in args:
            continue
        name = event.get("name", "").removesuffix("_kernel_time")
        if name and name not in seen:
            seen[name] = f"{args.get('op_name', '?')} {name} ({args['provider']})"
    other = sorted(text for text in seen.values() if not text.endswith(f"({provider})"))
    return len(seen), other


def placement(path: Path, provider: str, feeds: dict[str, np.ndarray]) -> Placement:
    """Where onnxruntime ran each node of one inference (from its profile)."""
    with tempfile.TemporaryDirectory(prefix="amp-profile-") as tmp:
        session = _session(path, provider, os.path.join(tmp, "run"))
        session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    count, other = nodes_elsewhere(events, provider)
    return Placement(provider, count, other)


def measure(path: Path, provider: str, batches: tuple[int, ...] = (1, 8), repeats: int = 20) -> tuple[list[Latency], Placement | None]:
    """Latency at each batch size, and the placement of the nodes at the first size that runs."""
    session = _session(path, provider)
    latencies, where = [], None
    for batch in batches:
        feeds = feeds_for(session, batch)
        if feeds is None:
            latencies.append(Latency(batch, None, "the model's batch dimension is fixed to another size"))
            continue
        latencies.append(Latency(batch, median_latency_ms(session, feeds, repeats)))
        if where is None:
            where = placement(path, provider, feeds)
    return latencies, where


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--provider", default="CUDAExecutionProvider")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    latencies, where = measure(Path(args.model), args.provider, tuple(args.batch), args.repeats)
    for lat in latencies:
        shown = f"{lat.median_ms:.3f} ms" if lat.median_ms is not None else f"not measured: {lat.note}"
        print(f"batch {lat.batch}: {shown}")
    if where is not None:
        print(f"{where.nodes} nodes, {len(where.elsewhere)} not on {where.provider}")
        for text in where.elsewhere:
            print(f"  {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
