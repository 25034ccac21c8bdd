"""A new user's rough edges: --version, ``python -m amp_compiler``, help for every option, what
``report -o`` says, PyTorch files, spreadsheets, file modes, stderr in one line, signals, start-up."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import amp_compiler
from amp_compiler.cli import main
from amp_compiler.cli.app import build_parser
from amp_compiler.cli.convert import ConvertCommand
from amp_compiler.cli.report import ReportCommand
from amp_compiler.report.csv_render import neutralise
from tests.support.onnx_builders import F32, model, tensor, vi, weights

EVIL = "n\n\x1b[31mamp-compiler: error: fake\x1b[0m\r\n"


def _run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def small(tmp_path) -> Path:
    m = model([helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"), helper.make_node("Relu", ["t"], ["y"], name="relu")],
              [vi("x", F32, [2, 16])], [vi("y", F32, [2, 3])], [tensor("w", weights((16, 3)))])  # K = 16
    path = tmp_path / "small.onnx"
    onnx.save(m, path)
    return path


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_option_of_every_command_has_help():
    parser = build_parser([ConvertCommand(), ReportCommand()])
    missing = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    for name, sub in _subparsers(parser).items():
        missing += [(name, a.option_strings or a.dest) for a in sub._actions if not a.help]
    assert missing == []


def test_version_and_python_dash_m(tmp_path, small):
    proc = subprocess.run([sys.executable, "-m", "amp_compiler", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(f"amp-compiler {amp_compiler.__version__} (onnx ") and "onnxruntime" in proc.stdout
    assert proc.stdout.count("\n") == 1 and proc.stdout.rstrip().endswith(")")  # one line, never wrapped
    proc = subprocess.run([sys.executable, "-m", "amp_compiler", "convert", str(small), "-o", str(tmp_path / "o.onnx"),
                           "-q", "--no-load-check"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "" and (tmp_path / "o.onnx").exists()


def test_report_dash_o_says_where_the_report_went_and_honours_the_umask(tmp_path, small):
    old = os.umask(0o022)
    try:
        code, out, err = _run(["report", small, "--format", "html", "-o", tmp_path / "r.html"])
        code2, _, err2 = _run(["convert", small, "-o", tmp_path / "o.onnx", "--report", tmp_path / "r.csv"])
    finally:
        os.umask(old)
    assert code == 0 and code2 == 0 and err == err2 == ""
    assert out == f"{tmp_path / 'r.html'}: html report written (4 rows)\n"
    for name in ("r.html", "r.csv", "o.onnx"):  # reports as model outputs: 0666 & ~umask
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_a_report_never_overwrites_its_model(small):
    before = small.read_bytes()
    code, _, err = _run(["report", small, "-o", small])
    assert code == 2 and "the output would overwrite the input model" in err and small.read_bytes() == before


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
def test_a_pytorch_checkpoint_gets_a_hint(tmp_path, legacy):
    torch = pytest.importorskip("torch")
    path = tmp_path / ("w.pth" if legacy else "w.pt")
    torch.save(torch.nn.Linear(2, 2).state_dict(), path, _use_new_zipfile_serialization=not legacy)
    code, _, err = _run(["convert", path, "-o", tmp_path / "o.onnx"])
    assert code == 2 and err == (
        f"amp-compiler: error: {path}: not ONNX: looks like a PyTorch checkpoint; export it with torch.onnx.export "
        "or use amp_compiler.fx\n"
    )


def test_csv_cells_that_spreadsheets_would_run_are_neutralised(tmp_path):
    names = ['=HYPERLINK("http://x","click")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=n) for i, n in enumerate(names)]
    path = tmp_path / "evil.onnx"
    onnx.save(model(nodes, [vi("t0", F32, [2])], [vi(f"t{len(names)}", F32, [2])]), path)
    code, out, err = _run(["report", path, "--format", "csv", "--sort", "graph"])
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["name"] for r in rows] == ["'" + n for n in names]
    assert [neutralise(v) for v in ("-0.5", "-inf", "1e-05", "plain", "- 1")] == ["-0.5", "-inf", "1e-05", "plain", "'- 1"]


def test_library_log_records_and_invalid_names_make_one_line(tmp_path, small, monkeypatch):
    bad = model([helper.make_node("MatMul", ["x" + EVIL, "w"], ["t"], name="mm" + EVIL)],
                [vi("x" + EVIL, F32, [2, 16])], [vi("t", F32, [2, 3])], [tensor("w", weights((16, 3)))])
    bad.graph.node.append(helper.make_node("Relu", ["missing" + EVIL], ["y"], name="relu" + EVIL))
    bad.graph.output[0].name = "y"
    onnx.save(bad, tmp_path / "bad.onnx")
    code, _, err = _run(["convert", tmp_path / "bad.onnx", "-o", tmp_path / "o.onnx"])
    assert code == 2 and err.count("\n") == 1 and "\x1b" not in err and "invalid ONNX model" in err
    # A record logged while a command succeeds is one warning line (here: injected into the conversion).
    convert_module = sys.modules["amp_compiler.onnx.convert"]
    real = convert_module.densify

    def noisy(*args, **kwargs):
        logging.getLogger("onnx_ir.serde").warning("first\nsecond" + EVIL)
        logging.getLogger("onnx_ir.serde").warning("again")
        return real(*args, **kwargs)

    monkeypatch.setattr(convert_module, "densify", noisy)
    code, out, err = _run(["convert", small, "-o", tmp_path / "o.onnx"])
    assert code == 0 and "model written" in out
    assert err.count("\n") == 1 and err.startswith("amp-compiler: warning: onnx_ir.serde: first second") and "\x1b" not in err
    assert err.rstrip().endswith("(and 1 more)")


def test_a_model_onnxruntime_cannot_run_reports_without_onnxruntime_logs(tmp_path):
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], [vi("x", F32, ["n"])],
              [vi("y", F32, [3])], [tensor("shape", np.array([3], np.int64))])
    onnx.save(m, tmp_path / "m.onnx")
    code, out, err = _run(["report", tmp_path / "m.onnx"])  # random input of 1 element: Reshape to 3 fails
    assert code == 0 and err == "" and "output accuracy not measured" in out
    code, _, err = _run(["report", tmp_path / "m.onnx", "--input-shape", "x:2"])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("amp-compiler: error: --input-shape: x:2: the model does not run with these shapes (")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_writing_unwinds_like_ctrl_c(tmp_path, small, monkeypatch, sig):
    import amp_compiler.onnx.write.save as onnx_save

    def signalled(fd):
        os.kill(os.getpid(), sig)

    monkeypatch.setattr(onnx_save.os, "fsync", signalled)
    before = signal.getsignal(sig)
    code, out, err = _run(["convert", small, "-o", tmp_path / "o.onnx"])
    assert code == 128 + sig and out == "" and err == f"amp-compiler: terminated ({sig.name})\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.onnx"]  # no output, no temporary file
    assert signal.getsignal(sig) is before  # the handler is the command's only


def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path, small):
    script = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'onnx_ir':\n"
        "            raise KeyboardInterrupt\n"
        "import amp_compiler.cli\n"
        "assert 'onnx' not in sys.modules and 'numpy' not in sys.modules, 'the entry point imports nothing heavy'\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.exit(amp_compiler.cli.main(sys.argv[1:]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, "convert", str(small), "-o", str(tmp_path / "o.onnx")],
                          capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "amp-compiler: interrupted\n")


def test_amp_compiler_fx_without_torch_is_one_clear_error():
    script = "import sys; sys.modules['torch'] = None\nimport amp_compiler.fx\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ImportError: amp_compiler.fx needs PyTorch, which is not installed: pip install 'amp-compiler[torch]' "
        "(or convert an ONNX model with amp_compiler.convert)"
    )


def test_without_onnxruntime_the_load_check_is_skipped_with_one_warning(tmp_path, small, monkeypatch, capsys):
    """The base install has no onnxruntime: convert still writes the model and says, in one line,
    that it was not checked (it starts no runner)."""
    from amp_compiler import runtime
    from amp_compiler.runtime import runner as runner_module

    monkeypatch.setattr(runtime, "is_installed", lambda: False)
    monkeypatch.setattr(runner_module.ChildRunner, "__init__", lambda *a, **k: pytest.fail("no runner expected"))
    out = tmp_path / "o.onnx"
    assert main(["convert", str(small), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.exists() and err.count("\n") == 1
    assert "not checked: onnxruntime is not installed" in err and "amp-compiler[cpu]" in err
