"""What the range probe costs a default conversion: time and peak RSS of whole ``convert`` processes.

    python -m benchmarks.probe_cost [--nodes 3000,10000,20000] [--model deep64b.onnx ...] [--timeout 900]

Per model, ``python -m amp_compiler convert MODEL -o OUT`` runs twice in fresh processes, with the probe
(the default) and with ``--no-probe``: wall time and the peak RSS of the largest process of the tree
(``ru_maxrss`` from ``os.wait4``: the parent or the runner's child, whichever is larger; not their sum),
then the probe's share (with / without). ``--nodes``: generated transformer graphs
(:func:`benchmarks.generate.transformer_model`) of about that many nodes; ``--model``: ONNX files as they
are (a 64-layer Llama export, a 673 MB model). The probe's node limit
(:data:`amp_compiler.onnx.measure.range_probe.PROBE_MAX_NODES`) is lifted in both processes, so that
graphs past it are measured too. The figures in ``range_probe``'s docstring and ``docs/large-models.md``
came from this benchmark on a 2-core machine shared with other work (its times vary by about 1.5x).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx

from benchmarks.cold import _spawn
from benchmarks.generate import transformer_model

#: The CLI with the probe's node limit lifted (``-c``: no file of ours to import from the benchmark's cwd).
_LIFTED = (
    "import runpy, sys; import amp_compiler.onnx.convert as c; c.PROBE_MAX_NODES = 10**9; "
    "sys.argv = ['amp-compiler'] + sys.argv[1:]; runpy.run_module('amp_compiler', run_name='__main__')"
)


def measure(path: Path, out: Path, timeout_s: float) -> tuple[tuple[float, int], tuple[float, int]]:
    """((seconds, peak bytes) with the probe, the same with ``--no-probe``) of converting ``path``."""
    runs = []
    for extra in ([], ["--no-probe"]):
        sample = _spawn([sys.executable, "-c", _LIFTED, "convert", str(path), "-o", str(out), *extra], timeout_s)
        runs.append((sample.seconds, sample.peak_rss))
    return runs[0], runs[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="3000,10000,20000", help="generated graphs' node counts, comma-separated")
    parser.add_argument("--model", action="append", default=[], help="an ONNX model to measure as it is")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one conversion may take")
    args = parser.parse_args()
    print("| model | nodes | with probe | --no-probe | probe's share |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(p) for p in args.model]
        for n in (int(x) for x in args.nodes.split(",") if x):
            path = Path(tmp) / f"generated-{n}.onnx"
            onnx.save(transformer_model(n), path)
            paths.append(path)
        for path in paths:
            nodes = len(onnx.load(path, load_external_data=False).graph.node)
            (t1, m1), (t0, m0) = measure(path, Path(tmp) / "out.onnx", args.timeout)
            print(f"| {path.name} | {nodes:,} | {t1:.1f} s, {m1 / 2**20:,.0f} MB | {t0:.1f} s, {m0 / 2**20:,.0f} MB "
                  f"| {t1 / t0:.1f}x time, {m1 / m0:.1f}x memory |", flush=True)


if __name__ == "__main__":
    main()
