"""What ``amp_compiler.fx.convert`` returns keeps the model's mode and output names; sizes print with units."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import pytest
import torch

import amp_compiler.fx as ampfx
from amp_compiler.sizes import format_bytes, parse_bytes
from tests.support.fx_helpers import one_thread  # noqa: F401 - autouse: torch on one thread


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_the_converted_module_keeps_the_models_mode(training):
    model = _mlp().train(training)
    gm = ampfx.convert(model, (torch.randn(2, 16),))
    assert {m.training for m in gm.modules()} == {training}


def test_the_report_names_the_outputs_as_captured_for_the_onnx_export():
    """torch.onnx.export re-traces the module and names an output after its op (the Cast back to
    FP32: "_to_copy_1"); the report keeps the captured names, which the export takes."""
    model, x = _mlp().eval(), torch.randn(2, 16)
    captured = ampfx.capture(model, (x,))
    gm = ampfx.convert(model, (x,))
    names = ampfx.report(gm).output_names
    assert names == [a.name for a in captured.graph.output_node().args[0]] == ["linear_1"]
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        program = torch.onnx.export(gm, (x,), dynamo=True, output_names=names)
    assert [o.name for o in program.model_proto.graph.output] == ["linear_1"]
    assert not [w for w in caught if "training mode" in str(w.message)]  # the module says eval


def test_sizes_print_with_units():
    summary = ampfx.report(ampfx.convert(_mlp().eval(), (torch.randn(2, 16),))).summary()
    assert "| parameters 2.70 kB -> 1.35 kB (50%) |" in summary  # 676 FP32 values, then FP16
    assert [format_bytes(n) for n in (0, 999, 1000, 999_600, 12_345_678, 2 * 10**9)] == [
        "0 B", "999 B", "1.00 kB", "1.00 MB", "12.3 MB", "2.00 GB"]
    assert [parse_bytes(t) for t in ("4G", "512MiB", "1.5k", "100")] == [4 * 10**9, 512 * 2**20, 1500, 100]
    with pytest.raises(ValueError):
        parse_bytes("lots")
