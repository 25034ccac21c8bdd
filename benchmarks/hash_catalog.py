"""Fingerprints of conversions: one hash per (model, target) over the output model's bytes and the
per-node decisions, for the catalog's models and two generated transformer graphs. A performance
change must leave every fingerprint as it was (run it before and after, diff the outputs).

    python -m benchmarks.hash_catalog [--size small] > hashes.txt
    python -m benchmarks.hash_catalog --from-files > hashes.txt   # must print the same fingerprints

The conversions decide from the graph alone (``probe=False``): the range probe's ranges come from
onnxruntime runs, whose last bits may differ between CPUs, and a fingerprint must not.

``--from-files`` converts each model from a file (written to a temporary folder) with its weights of
1 KiB or more left in the file (skimmed: amp_compiler.onnx.load.inline_weights), the path large model
files take: its fingerprints must be those of the in-memory conversions.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

import onnx

from amp_compiler import convert
from amp_compiler.onnx.load.files import load_model_deferred
from benchmarks.generate import transformer_model
from models import catalog


def fingerprint(model, target: str, folder: Path | None = None) -> str:
    if folder is not None:  # from a file, its weights left in it
        path = folder / "model.onnx"
        onnx.save(model, path)
        model = load_model_deferred(path, min_bytes=1024, check=False, skim_file_bytes=0)
    result = convert(model, target=target, probe=False)
    h = hashlib.sha256(result.model.SerializeToString(deterministic=True))
    h.update(json.dumps([dataclasses.asdict(d) for d in result.decisions], sort_keys=True).encode())
    h.update(f"{result.casts_inserted}/{result.constants_converted}".encode())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="small")
    parser.add_argument("--from-files", action="store_true", help="convert from files, weights left in them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="amp-hash-") as tmp:
        folder = Path(tmp) if args.from_files else None
        for entry in catalog.entries(args.size):
            model = catalog.load(entry)
            for target in ("fp16", "bf16"):
                print(f"{entry.name} {target} {fingerprint(model, target, folder)}", flush=True)
        for n in (1000, 3000):
            model = transformer_model(n)
            for target in ("fp16", "bf16"):
                print(f"generated-{n} {target} {fingerprint(model, target, folder)}", flush=True)


if __name__ == "__main__":
    main()
