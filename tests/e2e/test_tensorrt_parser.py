"""The parser check: every catalog model's ``--provider tensorrt`` output, built by TensorRT itself.

Each small catalog model is converted for TensorRT (FP16, graph inputs and outputs FP32), parsed by
TensorRT's ONNX parser into a strongly typed network (every precision is the file's), built for the
catalog's input shapes, run on the GPU, and compared with the FP32 model run on onnxruntime's CPU
provider: per float output, the catalog entry's tolerance (the cosine and the max error as a share
of the range that the exactly emulated FP16 output meets in ``test_convert_catalog``). A model with
ops TensorRT does not import (onnxruntime contrib ops, ONNX ops missing from its table: the
conversion warns about them) must be refused by the parser, as the warning says.

Needs the ``tensorrt`` package and a CUDA device (torch's): skipped with the reason elsewhere (CI
never has them). Engines are built and run by :mod:`benchmarks.gpu.tensorrt`, the repository's one
engine build, which the GPU benchmark shares.
"""

from __future__ import annotations

import numpy as np
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime
from models import catalog

pytest.importorskip("tensorrt", reason="TensorRT's Python package is not installed: the parser check needs a GPU machine")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("the parser check runs TensorRT engines on a CUDA device: none here", allow_module_level=True)

from benchmarks.gpu.tensorrt import Engine, build_engine  # noqa: E402 - needs tensorrt and CUDA

SMALL = catalog.entries("small")


@pytest.mark.parametrize("entry", SMALL, ids=lambda e: e.name)
def test_tensorrt_builds_and_runs_the_strongly_typed_output(entry, tmp_path):
    fp32 = catalog.load(entry)
    result = convert(fp32, target="fp16", provider="tensorrt", probe=False)
    path = tmp_path / f"{entry.name}.onnx"
    result.save(path)
    feeds = entry.make_inputs(np.random.default_rng(0))
    profile = {k: (v.shape, v.shape, v.shape) for k, v in feeds.items()}
    unimported = [w for w in result.provider_warnings if not w.startswith("custom ops")]
    if unimported:  # contrib ops, or ONNX ops its table does not list: the parser must refuse them
        with pytest.raises(RuntimeError, match="parser refused"):
            build_engine(path, profile)
        return
    plan, _ = build_engine(path, profile)
    got = Engine(plan).run(feeds)
    reference = run_onnxruntime(fp32, feeds)
    for info, ref in zip(fp32.graph.output, reference, strict=True):
        out = got[info.name]
        assert out.shape == ref.shape, (info.name, out.shape, ref.shape)
        if not np.issubdtype(ref.dtype, np.floating):
            np.testing.assert_array_equal(out, ref, err_msg=f"non-float output {info.name} differs")
            continue
        acc = compare(info.name, ref, out.astype(np.float32))
        assert acc.finite, f"{info.name}: NaN/Inf where FP32 is finite"
        assert acc.cosine >= entry.tolerance.min_cosine, f"{info.name}: cosine {acc.cosine:.6f}"
        assert acc.error_of_range <= entry.tolerance.max_error_of_range, (
            f"{info.name}: max error {acc.error_of_range:.2%} of the range"
        )
