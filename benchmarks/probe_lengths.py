"""The range probe on the catalog's transformers and streaming models: the sizes it runs them at, how
close its tensor ranges come to the catalog's own inputs', and what it costs.

    python -m benchmarks.probe_lengths [--models bert-base-small,gpt2-small,...]

Per model, the probe as it is (dims at the sizes the graph states: ``amp_compiler.onnx.measure.
probe_dims``) and as it was (the generic search alone: every dynamic dim at 1 first), each through
the budgeted child runner as ``convert`` runs it: the dims taken, the share of float tensors whose
peak |x| is within 2x of their peak on the catalog's own inputs (two samples, seeds 100 and 101), the
worst underestimate among tensors reaching 1e3 on real inputs, the largest attention probability
(the smallest over Softmax outputs of their max: 1 when attention is one token wide), and the
probe's wall time (the child's start and onnxruntime's import in it included).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

__all__ = ["main"]

_MODELS = ("bert-base-small,gpt2-small,llama-massive-activations-small,t5-small-encoder-small,t5-small-decoder-small,"
           "llama-torch-kv-small,bert-fused-small,gpt2-fused-small,t5-encoder-fused-small,llama-genai-fp32-small,"
           "llama-genai-int4-small,"
           "silero-vad")


def main(argv: list[str] | None = None) -> None:
    from amp_compiler.onnx.measure import range_probe
    from amp_compiler.onnx.measure.calibrate import collect_ranges
    from amp_compiler.runtime.runner import ChildRunner, InProcessRunner
    from models import catalog

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=_MODELS)
    args = parser.parse_args(argv)
    print("| model | probe | dims | peaks within 2x of real | worst real/probe (real >= 1e3) | largest attention "
          "probability (real) | time |")
    print("|---|---|---|---|---|---|---|")
    sized = range_probe.probe_dims
    for name in args.models.split(","):
        entry = catalog.get(name)
        model = catalog.load(entry)
        real = collect_ranges(model, [entry.make_inputs(np.random.default_rng(s)) for s in (100, 101)],
                              runner=InProcessRunner())
        softmax = [n.output[0] for n in model.graph.node if n.op_type == "Softmax"]
        for label, dims in (("before (generic search)", lambda *a, **k: []), ("after", sized)):
            range_probe.probe_dims = dims
            start = time.perf_counter()
            try:
                with ChildRunner() as runner:
                    probe = range_probe.probe_ranges(model, runner)
            except range_probe.ProbeSkipped as exc:
                print(f"| {name} | {label} | skipped: {str(exc)[:90]} | | | | |", flush=True)
                continue
            finally:
                range_probe.probe_dims = sized
            seconds = time.perf_counter() - start
            keys = [k for k, r in real.items() if k in probe.ranges and 0 < r.absmax < 1e30
                    and probe.ranges[k].absmax > 0]
            within = np.mean([max(probe.ranges[k].absmax, real[k].absmax) / min(probe.ranges[k].absmax,
                             real[k].absmax) <= 2 for k in keys])
            big = [real[k].absmax / probe.ranges[k].absmax for k in keys if real[k].absmax >= 1e3]
            attention = (f"{min(probe.ranges[o].max for o in softmax if o in probe.ranges):.3g} "
                         f"({min(real[o].max for o in softmax if o in real):.3g})" if softmax else "-")
            dims_text = ", ".join(f"{k}={v}" for k, v in probe.dims.items())
            worst = f"{max(big):.3g}x" if big else "-"
            print(f"| {name} | {label} | {dims_text} | {100 * within:.0f}% of {len(keys)} | {worst} | {attention} "
                  f"| {seconds:.1f} s |", flush=True)

if __name__ == "__main__":
    main()
