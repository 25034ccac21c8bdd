"""`amp-compiler report` and `convert --report/--calibration-data/--tolerance`, end to end."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from amp_compiler.analysis import analyze
from amp_compiler.cli import main
from amp_compiler.onnx.convert import ConvertOptions
from amp_compiler.report import SCHEMA_VERSION, PrecisionReport
from amp_compiler.runtime.runner import InProcessRunner
from models import catalog
from tests.support.onnx_builders import ffn_overflow_model


@pytest.fixture
def ffn(tmp_path) -> tuple[Path, Path]:
    """The FFN-overflow model and a folder of three calibration samples for it."""
    m = ffn_overflow_model()
    path = tmp_path / "ffn.onnx"
    onnx.save(m, path)
    samples = tmp_path / "samples"
    samples.mkdir()
    for i in range(3):
        x = np.random.default_rng(10 + i).standard_normal((8, 64)).astype(np.float32)
        np.savez(samples / f"{i}.npz", x=x)
    return path, samples


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_terminal_summary_first(ffn, capsys):
    path, _ = ffn
    code, out, err = _run(["report", path], capsys)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("ffn.onnx: fp16 on cuda")
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "proj_in" in out and "policy.low" in out


def test_report_json_round_trips_and_lists_every_node(ffn, tmp_path, capsys):
    path, samples = ffn
    out = tmp_path / "r.json"
    code, _, err = _run(["report", path, "--calibration-data", samples, "--format", "json", "-o", out], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["summary"]["accuracy"] and all(
        {"error_of_range", "value_range", "max_abs_error"} <= set(a) for a in data["summary"]["accuracy"]
    )
    report = PrecisionReport.from_dict(data)
    assert report.to_dict() == data
    assert [n.name for n in report.nodes if not n.inserted] == [n.name for n in ffn_overflow_model().graph.node]
    ffn_out = next(n for n in report.nodes if n.name == "ffn_out")
    assert ffn_out.rule == "calibration.overflow" and ffn_out.range.absmax > 65504
    assert ffn_out.error is not None and report.summary.calibration_samples == 3


def test_convert_with_calibration_tolerance_and_report(ffn, tmp_path, capsys):
    path, samples = ffn
    out, rep = tmp_path / "out.onnx", tmp_path / "report.html"
    code, stdout, err = _run(
        ["convert", path, "-o", out, "--calibration-data", samples, "--tolerance", "1e-3", "--report", rep],
        capsys,
    )
    assert code == 0, err
    assert "--tolerance 0.001: met" in stdout
    onnx.checker.check_model(onnx.load(out), full_check=True)
    html = rep.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "<svg" in html


def test_convert_tolerance_line_says_what_it_kept_and_what_could_be(tmp_path, capsys):
    entry = catalog.get("decomposed-activations")
    path, out, data = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "cal"
    onnx.save(catalog.load(entry), path)
    data.mkdir()
    for k in range(2):
        np.savez(data / f"{k}.npz", **entry.make_inputs(np.random.default_rng(k)))
    # half of plain FP16's error here: units are measured and chosen
    code, stdout, err = _run(["convert", path, "-o", out, "--calibration-data", data, "--tolerance", "5e-4",
                              "--no-load-check"], capsys)
    assert code == 0, err
    line = next(x for x in stdout.splitlines() if x.startswith("--tolerance 0.0005: met"))
    match = re.search(r"pinned to FP32, ([\d.]+)% of their Tensor Core FLOPs kept fp16 or lower "
                      r"\(at most ([\d.]+)% could be\)$", line)
    assert match, line
    share, ceiling = map(float, match.groups())
    # the classifier Gemm, a few FLOPs, is pinned: the share rounds down, it does not claim 100%
    assert 99.0 <= share <= ceiling < 100.0


def test_convert_tolerance_reports_held_out_samples_the_metric_and_why_nothing_stays_low(tmp_path, capsys):
    entry = catalog.get("mlp-softmax")
    path, out, data = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "cal"
    onnx.save(catalog.load(entry), path)
    data.mkdir()
    for k in range(4):
        np.savez(data / f"{k}.npz", **entry.make_inputs(np.random.default_rng(k)))
    args = ["convert", path, "-o", out, "--calibration-data", data, "--no-load-check", "--tolerance", "1e-12"]
    code, stdout, err = _run([*args, "--metric", "max-range"], capsys)
    assert code == 0, err
    line = next(x for x in stdout.splitlines() if x.startswith("--tolerance 1e-12: "))
    assert re.search(r"\(worst output max-range [\d.e+-]+, [\d.e+-]+ on 2 held-out sample\(s\)\)", line), line
    warning = [x for x in err.splitlines() if "no unit can stay fp16 within --tolerance 1e-12" in x]
    assert len(warning) == 1 and warning[0].startswith("amp-compiler: warning: ") and "output 'y' by " in warning[0]
    code, stdout, err = _run([*args, "--holdout", "0"], capsys)
    assert code == 0 and "held-out" not in stdout and "(worst output relative L2 " in stdout
    code, _, err = _run([*args, "--holdout", "1.5"], capsys)
    assert code == 2 and err.strip() == "amp-compiler: error: --holdout: expected a share in [0, 1), got 1.5"


def test_report_csv_single_file_calibration(ffn, tmp_path, capsys):
    path, samples = ffn
    one = samples / "0.npz"
    code, out, err = _run(["report", path, "--calibration-data", one, "--format", "csv"], capsys)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["name"] for r in rows} >= {"ffn_in", "ffn_out", "proj_out"}


@pytest.mark.parametrize(
    "arrays, needle",
    [
        ({"wrong": np.zeros((8, 64), np.float32)}, "'wrong' is not an input"),
        ({"x": np.zeros((8, 3), np.float32)}, "has shape 8x3"),
        ({"x": np.zeros((8, 64), np.int32)}, "is int32"),
    ],
)
def test_calibration_data_mismatch_is_one_line_exit_2(ffn, tmp_path, capsys, arrays, needle):
    path, _ = ffn
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    out = tmp_path / "o.onnx"
    code, _, err = _run(["convert", path, "-o", out, "--calibration-data", bad], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--tolerance", "1e-3"], "needs calibration data"),
        (["--calibration-data", "/nonexistent/samples"], "no such file or folder"),
        (["--input-shape", "x:8by64"], "expected NAME:DIMxDIM"),
        (["--input-shape", "nope:8x64"], "is not a graph input"),
    ],
)
def test_bad_report_options_are_one_line_exit_2(ffn, capsys, extra, needle):
    path, _ = ffn
    code, _, err = _run(["report", path, *extra], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize("entry", catalog.entries("small"), ids=lambda e: e.name)
def test_every_node_of_every_catalog_model_is_in_the_report(entry):
    m = catalog.load(entry)
    # The catalog's own models: run in this process (the CLI tests cover the budgeted child).
    report = analyze(m, ConvertOptions(), model_name=entry.name, runner=InProcessRunner()).report
    from amp_compiler.onnx.costs.costs import iter_nodes

    converted = [n for n in report.nodes if not n.inserted]
    assert len(converted) == sum(1 for _ in iter_nodes(m)) - sum(
        1 for n in iter_nodes(m) if n.op_type == "Cast" and n.name not in {r.name for r in report.nodes}
    )
    assert all(n.rule and "." in n.rule or n.rule in ("constant", "nonfloat", "fixed") for n in report.nodes)
    assert report.summary.flops_total > 0
