"""The command line with models that are hostile to run: one line, the right exit status, nothing written.

Budgets (``--max-run-seconds``, ``--max-run-memory``) bound every onnxruntime run of the user's
model (report, ``--calibration-data``, ``--tolerance``); ``convert`` loads its output in the child
before renaming it into place (``--no-load-check`` skips that).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.cli import main
from tests.support.onnx_builders import (
    F32,
    huge_constant_model,
    loop_forever_model,
    model,
    tensor,
    transpose_cast_matmul_model,
    vi,
    weights,
)


def _run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amp-compiler: error: "), err
    return lines[0]


@pytest.fixture
def loop(tmp_path) -> Path:
    path = tmp_path / "loop.onnx"
    onnx.save(loop_forever_model(), path)
    return path


@pytest.fixture
def huge(tmp_path) -> Path:
    path = tmp_path / "huge.onnx"
    onnx.save(huge_constant_model(40_000), path)
    return path


def test_report_of_a_model_that_never_ends_stops_at_the_time_budget_and_is_written_unmeasured(loop):
    """The accuracy run only measures: stopped at the budget, the report is written without it, saying why."""
    code, out, err = _run(["report", loop, "--max-run-seconds", "1", "--format", "json"])
    assert code == 0 and err == "", err
    report = json.loads(out)
    assert report["summary"]["accuracy"] == []
    assert "took longer than its time budget of 1 s" in report["summary"]["accuracy_not_measured"]
    assert any(w.startswith("output accuracy not measured: running the model") for w in report["warnings"])


def test_convert_report_of_a_model_that_never_ends_checks_its_output_in_a_fresh_child(loop, tmp_path):
    """The time budget killed the child that ran the accuracy (the range probe's run first: one warning
    line); the load check runs in another one."""
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    code, stdout, err = _run(["convert", loop, "-o", out, "--report", report, "--max-run-seconds", "2"])
    assert code == 0 and "fp16 model written" in stdout, err
    assert err.strip().splitlines() == [
        "amp-compiler: warning: converted without the range probe: its run exceeds the run budget (running the "
        "model in onnxruntime took longer than its time budget of 2 s; stopped)"
    ]
    assert "time budget" in json.loads(report.read_text())["summary"]["accuracy_not_measured"]


def test_convert_calibration_on_a_memory_bomb_stops_at_the_memory_budget(huge, tmp_path):
    """Calibration runs are what the conversion needs: over the budget, nothing is written."""
    np.savez(tmp_path / "x.npz", x=np.ones(1, np.float32))
    out = tmp_path / "o.onnx"
    code, _, err = _run(["convert", huge, "-o", out, "--max-run-memory", "1GiB", "--calibration-data",
                         tmp_path / "x.npz", "--report", tmp_path / "r.json"])
    assert code == 2
    line = _one_error_line(err)
    assert "memory budget of 1.07 GB" in line and line.endswith("(raise it with --max-run-memory)")
    assert not out.exists() and not (tmp_path / "r.json").exists()


def test_convert_report_of_a_memory_bomb_stops_its_accuracy_run_at_the_memory_budget(huge, tmp_path):
    """The accuracy run is over the budget (and stopped there); the conversion and its report are written."""
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    code, _, err = _run(["convert", huge, "-o", out, "--max-run-memory", "1GiB", "--report", report])
    assert code == 0, err
    assert out.exists() and "memory budget of 1.07 GB" in json.loads(report.read_text())["summary"][
        "accuracy_not_measured"]


@pytest.mark.parametrize("value, needle", [("lots", "is not a size"), ("1M", "too little"), ("0", "too little")])
def test_bad_memory_budgets_name_their_flag(huge, value, needle):
    code, _, err = _run(["report", huge, "--max-run-memory", value])
    assert code == 2 and _one_error_line(err).startswith("amp-compiler: error: --max-run-memory: ") and needle in err


def test_a_plain_convert_runs_nothing_and_needs_no_budget(loop, tmp_path):
    """Without the range probe only the output's load check runs onnxruntime: a model that would run
    for ever converts; with it (the default), the probe's run stops at the budget and says so in one line."""
    code, out, err = _run(["convert", loop, "-o", tmp_path / "o.onnx", "--max-run-seconds", "5", "--no-probe"])
    assert code == 0 and err == "" and "fp16 model written" in out
    code, out, err = _run(["convert", loop, "-o", tmp_path / "o2.onnx", "--max-run-seconds", "2"])
    assert code == 0 and "fp16 model written" in out
    assert len(err.strip().splitlines()) == 1 and "without the range probe: its run exceeds the run budget" in err


def _good(tmp_path: Path) -> Path:
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", F32, [2, 16])], [vi("y", F32, [2, 4])],
              [tensor("w", weights((16, 4)))])  # K = 16: a shorter product of x stays FP32 (raw-small-product)
    path = tmp_path / "good.onnx"
    onnx.save(m, path)
    return path


@pytest.fixture
def crashing_output(monkeypatch):
    """The conversion gives a model that crashes onnxruntime 1.32 at session creation."""
    command = importlib.import_module("amp_compiler.onnx.convert")  # the module the command's convert comes from
    real = command.convert

    def crashing(*args, **kwargs):
        result = real(*args, **kwargs)
        result.model = transpose_cast_matmul_model()
        return result

    monkeypatch.setattr(command, "convert", crashing)


def test_an_output_that_crashes_onnxruntime_is_not_written(tmp_path, crashing_output):
    out = tmp_path / "o.onnx"
    code, stdout, err = _run(["convert", _good(tmp_path), "-o", out])
    assert code == 1 and stdout == ""
    line = _one_error_line(err)
    assert "the converted model crashes onnxruntime" in line and "SIGSEGV while loading it" in line
    assert line.endswith("not written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.onnx"]  # no output, no temporary file
    code, _, err = _run(["convert", _good(tmp_path), "-o", out, "--no-load-check"])
    assert code == 0 and err == "" and out.exists()


def test_an_input_that_crashes_onnxruntime_too_is_converted_with_a_warning(tmp_path):
    """onnxruntime's MatmulTransposeFusion crashes on it at the default optimization level, which the load
    check uses (as the provider would); the range probe's sessions run once each, with basic optimizations
    only, so the probe runs it (it was skipped with a second warning while it loaded them fully)."""
    src, out = tmp_path / "crash.onnx", tmp_path / "o.onnx"
    onnx.save(transpose_cast_matmul_model(), src)  # its own Cast (int32 -> float) stays
    code, stdout, err = _run(["convert", src, "-o", out])
    assert code == 0 and out.exists() and "model written" in stdout and "ranges from generated inputs" in stdout
    assert err.strip().splitlines() == [
        "amp-compiler: warning: the converted model was not checked: onnxruntime cannot load the input model "
        "either (onnxruntime crashed (SIGSEGV) loading the model)",
    ]


def test_an_output_with_external_data_is_checked_with_its_data(tmp_path):
    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", F32, ["B", 160])],
              [vi("y", F32, ["B", 160])], [tensor("w", weights((160, 160)))])
    onnx.save_model(m, src, save_as_external_data=True, location="w.bin", size_threshold=1024)
    out = tmp_path / "o.onnx"
    code, _, err = _run(["convert", src, "-o", out])
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "o.onnx", "o.onnx.data"]
    assert convert(out, probe=False).decisions  # and it reads back
