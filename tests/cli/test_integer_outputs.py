"""`amp-compiler convert`: an integer output's changed values in the summary line, the warning and the report."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx

from amp_compiler.cli import main
from tests.support.onnx_builders import CLEAR_WEIGHTS, NEAR_TIE_WEIGHTS, label_model


def _convert(tmp_path, weights, capsys, *extra):
    src, dst = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(label_model(weights), src)
    code = main([str(a) for a in ["convert", src, "-o", dst, *extra]])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def test_convert_states_and_warns_of_changed_labels_on_calibration_data(tmp_path, capsys):
    """Before: the summary stated nothing of the label output, and no warning came."""
    data = tmp_path / "x.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((64, 2)).astype(np.float32))
    report = tmp_path / "r.json"
    out, err = _convert(tmp_path, NEAR_TIE_WEIGHTS, capsys, "--calibration-data", data, "--report", report)
    changed = int((np.load(data)["x"][:, 0] > 0).sum())  # every row with x[:, 0] > 0 ties in FP16
    assert f"output error vs fp32 on the calibration data: {changed} of 64 values ({changed / 64:.1%}) changed" in out
    assert re.search(r"warning: output 'label' changes \d+ of 64 values .* past 1% of its values changed", err)
    (label,) = json.loads(report.read_text())["summary"]["accuracy"]
    assert label["changed"] == changed and label["values"] == 64 and label["changed_share"] == changed / 64


def test_convert_states_changed_labels_on_the_probes_inputs(tmp_path, capsys):
    out, err = _convert(tmp_path, NEAR_TIE_WEIGHTS, capsys)
    assert re.search(r"output error vs fp32 on generated inputs: [1-9]\d* of 64 values \(.*\) changed", out)
    assert "warning: output 'label' changes" in err


def test_convert_states_zero_changed_labels_and_does_not_warn(tmp_path, capsys):
    out, err = _convert(tmp_path, CLEAR_WEIGHTS, capsys)
    assert "output error vs fp32 on generated inputs: 0 of 64 values (0%) changed" in out
    assert "warning: output" not in err
