"""ModelOpt's FP8 output on catalog models, measured with the FP8 table's protocol; writes the numbers
into ``benchmarks/fp8_anchor.json`` (the FP8 table reads them there and never needs ModelOpt).

    python -m benchmarks.fp8_modelopt --models bert-fused-small,ppocr-cls [--anchor benchmarks/fp8_anchor.json]

Needs ModelOpt (``pip install --no-deps nvidia-modelopt==0.47.0`` and its dependencies). Per model:
the FP32 model and its 8 calibration batches (:mod:`benchmarks.fp8_protocol`) concatenated along
the batch axis into an ``.npz``, then

    python -m modelopt.onnx.quantization --onnx_path model.onnx --quantize_mode fp8
        --calibration_method max --calibration_data_path calib.npz --calibration_shapes <one batch>
        --calibration_eps cpu --high_precision_dtype fp16 --output_path model.fp8.onnx

(max calibration, as its FP8 default for TensorRT; FP16 for everything else), and its output measured
on the 8 held-out batches as ours is. A model ModelOpt fails on gets its first error line instead.
Entries of other models in the anchor file are kept; measured ones are replaced.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from amp_compiler.onnx.measure.emulate import emulate
from benchmarks import fp8_protocol as protocol

ANCHOR = Path(__file__).with_name("fp8_anchor.json")


def _command(folder: Path, sample: dict[str, np.ndarray]) -> list[str]:
    shapes = ",".join(f"{k}:{'x'.join(map(str, v.shape))}" for k, v in sample.items())
    return [
        sys.executable, "-m", "modelopt.onnx.quantization", "--onnx_path", str(folder / "model.onnx"),
        "--quantize_mode", "fp8", "--calibration_method", "max", "--calibration_data_path",
        str(folder / "calib.npz"), "--calibration_shapes", shapes, "--calibration_eps", "cpu",
        "--high_precision_dtype", "fp16", "--output_path", str(folder / "model.fp8.onnx"),
    ]


def measure(name: str) -> dict:
    """ModelOpt's FP8 output of ``name`` measured (see module doc), as an anchor entry."""
    fp32, calib, held = protocol.batches(name)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        onnx.save(fp32, folder / "model.onnx")
        inputs = {i.name for i in fp32.graph.input}
        np.savez(folder / "calib.npz", **{k: np.concatenate([b[k] for b in calib]) for k in calib[0] if k in inputs})
        start = time.perf_counter()
        done = subprocess.run(_command(folder, {k: v for k, v in calib[0].items() if k in inputs}),
                              capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        out = folder / "model.fp8.onnx"
        if done.returncode != 0 or not out.exists():
            lines = [x for x in (done.stderr + done.stdout).splitlines() if "Error" in x or "error" in x]
            return {"model": name, "error": (lines[-1] if lines else f"exit status {done.returncode}")[:300],
                    "protocol": "benchmarks.fp8_modelopt", "made_by": f"python -m benchmarks.fp8_modelopt --models {name}"}
        quantized = onnx.load(out)
    got = protocol.accuracy(protocol.run(fp32, held), protocol.run(emulate(quantized), held))
    all_gemms = protocol.gemms(fp32, calib[0])
    fp8 = protocol.fp8_outputs(quantized)
    return {
        "model": name, "modelopt_seconds": seconds, "opset": max(o.version for o in quantized.opset_import
                                                                  if o.domain in ("", "ai.onnx")),
        "worst": {k: v for k, v in got.items() if k != "top1"}, "top1_agreement": got["top1"],
        "gemms": [{"op": g.op, "node": g.node, "output": g.output, "flops": g.flops, "fp8": protocol.is_fp8(g, fp8)}
                  for g in all_gemms],
        "fp8_flop_share": protocol.flop_share(all_gemms, fp8), **protocol.counts(quantized),
        "size_fp32": fp32.ByteSize(), "protocol": "benchmarks.fp8_modelopt",
        "made_by": f"python -m benchmarks.fp8_modelopt --models {name}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--anchor", type=Path, default=ANCHOR)
    args = parser.parse_args()
    data = json.loads(args.anchor.read_text()) if args.anchor.exists() else {"results": []}
    by_model = {r["model"]: r for r in data["results"]}
    for name in args.models.split(","):
        entry = measure(name)
        print(json.dumps({k: v for k, v in entry.items() if k != "gemms"}), flush=True)
        by_model[name] = entry
    data["results"] = list(by_model.values())
    data["versions_fp8_modelopt"] = {  # of the entries with "protocol": "benchmarks.fp8_modelopt"
        p: importlib.metadata.version(p) for p in ("nvidia-modelopt", "onnxruntime", "onnx", "numpy")
    }
    args.anchor.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
