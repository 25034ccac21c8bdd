"""The long fuzzing campaign: ``python -m tests.fuzz_long --examples 10000 [--jobs 2] [--out DIR]``.

Runs the checks of tests/e2e/test_fuzz.py on many random graphs, in chunks of examples that each have
their own hypothesis seed (so any chunk can be replayed), on several processes. It does not stop at
the first failure: every failure is recorded with its signature (exception type and first line),
the failing model is saved to ``--out`` with its options and input seed, and at the end one
hypothesis-shrunk example per new signature is printed (``--shrink``). Prints a summary: examples
run, converted, refused with a user error, failures by signature, generator errors, and how tight
the tolerance was.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.support and models

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.support import fuzz_strategies as fz  # noqa: E402


def _signature(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    for noisy in ("max error", "output '", "Required inputs"):
        if noisy in text:
            text = text.split(noisy)[0] + noisy
    return f"{type(exc).__name__}: {text[:120]}"


def run_chunk(args: tuple[int, int, str | None, bool]) -> dict:
    """Run ``n`` examples with hypothesis seed ``chunk_seed``; never raises."""
    chunk_seed, n, out, avoid = args
    if not avoid:
        fz.AVOID.clear()
    counts: Counter = Counter()
    failures: list[dict] = []
    tight: list[tuple[float, float, float]] = []

    @seed(chunk_seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=fz.fuzz_cases())
    def one(case):
        counts["examples"] += 1
        try:
            counts[fz.check_case(case, tight)] += 1
        except fz.GeneratorBug as exc:
            counts["generator errors"] += 1
            failures.append({"kind": "generator", "signature": _signature(exc), "chunk": chunk_seed})
        except Exception as exc:
            counts["failures"] += 1
            record = {
                "kind": "converter", "signature": _signature(exc), "chunk": chunk_seed,
                "options": case.options(), "seed": case.seed, "ops": case.ops,
                "traceback": traceback.format_exc(limit=-3),
            }
            if out:
                name = f"fail-{chunk_seed}-{counts['examples']}"
                Path(out, f"{name}.onnx").write_bytes(case.model.SerializeToString())
                Path(out, f"{name}.json").write_text(json.dumps(
                    {**record, "inputs": [vars(s) for s in case.inputs], "bounds": case.bounds}, indent=1,
                    default=str,
                ))
                record["file"] = f"{name}.onnx"
            failures.append(record)

    one()
    return {"counts": counts, "failures": failures, "tight": tight}


def shrink(chunk_seed: int, n: int, signature: str) -> str:
    """Replay a chunk, raising on the first example with ``signature`` so hypothesis shrinks it."""

    @seed(chunk_seed)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False, print_blob=False)
    @given(case=fz.fuzz_cases())
    def replay(case):
        try:
            fz.check_case(case)
        except Exception as exc:
            if _signature(exc) == signature:
                raise

    try:
        replay()
    except Exception as exc:
        notes = "\n".join(getattr(exc, "__notes__", []))
        return f"{_signature(exc)}\n{notes}"
    return "(did not reproduce)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz_long", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=max(1, multiprocessing.cpu_count()))
    parser.add_argument("--chunk", type=int, default=250, help="examples per hypothesis seed")
    parser.add_argument("--seed", type=int, default=0, help="first chunk seed")
    parser.add_argument("--out", default=None, help="folder for failing models")
    parser.add_argument("--shrink", action="store_true", help="print a shrunk example per failure signature")
    parser.add_argument(
        "--no-avoid", action="store_true",
        help="also generate the patterns of known, still open converter bugs (fuzz_strategies.AVOID)",
    )
    args = parser.parse_args(argv)
    if args.no_avoid:
        fz.AVOID.clear()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    chunks = []
    left, k = args.examples, 0
    while left > 0:
        chunks.append((args.seed + k, min(args.chunk, left), args.out, not args.no_avoid))
        left -= args.chunk
        k += 1
    start = time.time()
    totals: Counter = Counter()
    failures: list[dict] = []
    tight: list = []
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for i, res in enumerate(pool.imap_unordered(run_chunk, chunks), 1):
            totals.update(res["counts"])
            failures.extend(res["failures"])
            tight.extend(res["tight"])
            print(f"[{i}/{len(chunks)} chunks, {time.time() - start:.0f} s] {dict(totals)}", flush=True)
    elapsed = time.time() - start
    print(f"\n{totals['examples']} examples in {elapsed:.0f} s on {args.jobs} process(es): "
          f"{totals['converted']} converted and checked, {totals['refused']} refused with a user error, "
          f"{totals['failures']} failures, {totals['generator errors']} generator errors")
    if tight:
        import numpy as np

        t = np.array(tight)
        ratio = t[:, 0] / t[:, 1]
        print(f"float outputs checked: {len(t)}; error / tolerance: median {np.median(ratio):.3g}, "
              f"99th percentile {np.quantile(ratio, 0.99):.3g}, max {ratio.max():.3g}")
    by_sig = Counter(f["signature"] for f in failures)
    for sig, count in by_sig.most_common():
        example = next(f for f in failures if f["signature"] == sig)
        print(f"  {count:5d} x {sig}  (chunk {example['chunk']}, {example.get('file', '')})")
        if args.shrink and example["kind"] == "converter":
            print("        shrunk:", shrink(example["chunk"], args.chunk, sig).replace("\n", "\n        "))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
