"""Fingerprints of conversions: one hash per (model, target) over the output model's bytes and the
per-node decisions, for the catalog's models and two generated transformer graphs. A performance
change must leave every fingerprint as it was (run it before and after, diff the outputs).

    python -m benchmarks.hash_catalog [--size small] > hashes.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json

from amp_compiler import convert
from benchmarks.generate import transformer_model
from models import catalog


def fingerprint(model, target: str) -> str:
    result = convert(model, target=target)
    h = hashlib.sha256(result.model.SerializeToString(deterministic=True))
    h.update(json.dumps([dataclasses.asdict(d) for d in result.decisions], sort_keys=True).encode())
    h.update(f"{result.casts_inserted}/{result.constants_converted}".encode())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="small")
    args = parser.parse_args()
    for entry in catalog.entries(args.size):
        model = catalog.load(entry)
        for target in ("fp16", "bf16"):
            print(f"{entry.name} {target} {fingerprint(model, target)}", flush=True)
    for n in (1000, 3000):
        model = transformer_model(n)
        for target in ("fp16", "bf16"):
            print(f"generated-{n} {target} {fingerprint(model, target)}", flush=True)


if __name__ == "__main__":
    main()
