"""The CLI's argument groups: the analysis path only when asked for, the output path checked once,
option errors printed with their flags.

A plain ``convert`` (``--input-shape`` included) runs no model (onnxruntime only loads the output,
the load check) and never reads the deferred weights into memory; ``--report`` and
``--calibration-data`` choose the analysis path.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import amp_compiler.onnx.write.save as onnx_save
from amp_compiler.cli import main
from amp_compiler.cli.app import build_parser, error_text
from amp_compiler.cli.convert import ConvertCommand
from amp_compiler.cli.report import ReportCommand
from amp_compiler.errors import OptionError
from amp_compiler.onnx.load.deferred import DeferredModel
from amp_compiler.onnx.load.files import DEFER_MIN_BYTES
from amp_compiler.onnx.write.save import InputOverwriteError, check_output_path
from amp_compiler.runtime import runner as runner_module
from tests.support.onnx_builders import F32, model, tensor, vi, weights

#: The conversion module, whose ``convert`` the command calls (the package attribute of that name is the function).
conversion_module = importlib.import_module("amp_compiler.onnx.convert")

_W = (160, 160)  # 100 KiB of FP32: over DEFER_MIN_BYTES, so a plain convert leaves it on disk


def _external_model(folder: Path) -> Path:
    """x (dynamic batch, 160) @ w, with w in ``w.bin`` beside the model."""
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, ["B", 160])], [vi("y", F32, ["B", 160])], [tensor("w", weights(_W))],
    )
    assert weights(_W).nbytes >= DEFER_MIN_BYTES
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="w.bin", size_threshold=1024)
    return path


def _run(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


@pytest.fixture
def watched(monkeypatch):
    """Records the models onnxruntime loads (a model file's path, or a ModelProto) and runs,
    whole-model weight loads and the options convert() is given."""
    seen: dict[str, list] = {"sessions": [], "runs": [], "loads": [], "options": []}
    real_session, real_run = runner_module.ChildRunner.load, runner_module.Session.run
    real_load, real_convert = DeferredModel.load, conversion_module.convert

    def session(self, model, **kw):
        seen["sessions"].append("file" if isinstance(model, (str, Path)) else "proto")
        return real_session(self, model, **kw)

    def run(self, feeds):
        seen["runs"].append(True)
        return real_run(self, feeds)

    def load(self):
        seen["loads"].append(True)
        return real_load(self)

    def convert(loaded, options, **kwargs):
        seen["options"].append(options)
        return real_convert(loaded, options, **kwargs)

    monkeypatch.setattr(runner_module.ChildRunner, "load", session)
    monkeypatch.setattr(runner_module.Session, "run", run)
    monkeypatch.setattr(DeferredModel, "load", load)
    monkeypatch.setattr(conversion_module, "convert", convert)  # the plain path's conversion
    # analyze() converts too, through its own name: kept the real one, so "options" records the plain path only
    monkeypatch.setattr(importlib.import_module("amp_compiler.analysis"), "convert", real_convert)
    return seen


def test_plain_convert_with_input_shape_runs_no_model_and_keeps_weights_on_disk(tmp_path, watched):
    src, out = _external_model(tmp_path / "in"), tmp_path / "out.onnx"
    code, err = _run(["convert", src, "-o", out, "--input-shape", "x:64x160", "--no-probe"])
    assert code == 0, err
    assert [o.input_shapes for o in watched["options"]] == [(("x", (64, 160)),)]  # reached the min-cut cost
    assert watched["sessions"] == ["file"] and watched["runs"] == []  # the output's load check only
    assert watched["loads"] == []
    assert (tmp_path / "out.onnx.data").exists()  # written with external data, as a deferred conversion is


def test_plain_convert_probes_ranges_at_the_input_shape_and_still_writes_external_data(tmp_path, watched):
    """The range probe (the default) runs the FP32 model (weights in memory, in the child) at the
    shapes given; the conversion itself keeps the weights on disk."""
    src, out = _external_model(tmp_path / "in"), tmp_path / "out.onnx"
    code, err = _run(["convert", src, "-o", out, "--input-shape", "x:64x160"])
    assert code == 0, err
    assert [o.probe for o in watched["options"]] == [True]
    assert watched["sessions"][:2] == ["proto", "proto"] and watched["sessions"][-1] == "file"  # probe, then check
    assert len(watched["runs"]) >= 2  # FP32 outputs and the emulated conversion (ranges: the calibration chain)
    assert watched["loads"] == []
    assert (tmp_path / "out.onnx.data").exists()


@pytest.mark.parametrize("ask", ["report", "calibration-data"])
def test_report_or_calibration_data_choose_the_analysis_path(tmp_path, watched, ask):
    src, out = _external_model(tmp_path / "in"), tmp_path / "out.onnx"
    if ask == "report":
        extra = ["--report", tmp_path / "r.json"]
    else:
        np.savez(tmp_path / "s.npz", x=np.ones((2, 160), np.float32))
        extra = ["--calibration-data", tmp_path / "s.npz"]
    code, err = _run(["convert", src, "-o", out, *extra])
    assert code == 0, err
    assert watched["options"] == []  # analyze() converted, not the plain path
    assert watched["runs"] and watched["loads"] == [True]


@pytest.mark.parametrize("command", ["convert", "convert --report", "report"])
def test_input_shapes_are_checked_once_by_the_conversion(tmp_path, watched, monkeypatch, command):
    convert_module = importlib.import_module("amp_compiler.onnx.convert")
    calls, real_bind = [], convert_module.bind_input_shapes

    def bind(model, shapes):
        calls.append(dict(shapes))
        return real_bind(model, shapes)

    monkeypatch.setattr(convert_module, "bind_input_shapes", bind)
    src, out = _external_model(tmp_path / "in"), tmp_path / "out.onnx"
    argv = {"convert": ["convert", src, "-o", out], "report": ["report", src]}[command.split()[0]]
    if "--report" in command:
        argv += ["--report", tmp_path / "r.json"]
    code, err = _run([*argv, "--input-shape", "nope:1x160"])
    assert code == 2 and err.strip() == "amp-compiler: error: --input-shape: nope is not a graph input (inputs: x)"
    assert calls == [{"nope": (1, 160)}] and not out.exists() and watched["runs"] == []
    calls.clear()
    code, err = _run([*argv, "--input-shape", "x:4x160"])
    assert code == 0, err
    assert calls == [{"x": (4, 160)}]


@pytest.mark.parametrize("external", [False, True], ids=["single-file", "external-data"])
def test_the_output_path_is_checked_once(tmp_path, monkeypatch, external):
    if external:
        src = _external_model(tmp_path / "in")
    else:
        src = tmp_path / "m.onnx"
        onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [2])], [vi("y", F32, [2])]), src)
    checks, extra = [], []
    real_check, real_extra = onnx_save.check_output_path, onnx_save.OutputPath.with_external_data

    def check(*args, **kwargs):
        checks.append(args[0])
        return real_check(*args, **kwargs)

    def with_external_data(self, files):
        extra.append(list(files))
        return real_extra(self, files)

    result_module = importlib.import_module("amp_compiler.onnx.write.result")  # ConversionResult.save
    for module in (onnx_save, result_module):  # every caller of check_output_path (the CLI's, through onnx_save)
        monkeypatch.setattr(module, "check_output_path", check)
    monkeypatch.setattr(onnx_save.OutputPath, "with_external_data", with_external_data)
    code, err = _run(["convert", src, "-o", tmp_path / "out.onnx"])
    assert code == 0, err
    assert checks == [tmp_path / "out.onnx"]
    # and, once the model is read, against its external data files only (nothing else is checked again)
    assert [f for f in extra if f] == ([[src.parent / "w.bin"]] if external else [])


def test_overwriting_the_input_is_refused_without_naming_a_flag_in_the_library(tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(b"x")
    with pytest.raises(InputOverwriteError) as info:
        check_output_path(src, [src])
    assert "--" not in str(info.value)
    code, err = _run(["convert", src, "-o", src])
    assert code == 2 and err.strip().endswith("the output would overwrite the input model (use --force to allow)")


@pytest.mark.parametrize("command", [ConvertCommand, ReportCommand])
def test_every_flag_a_group_names_is_an_option_of_its_command(command):
    cmd = command()
    parser = build_parser([cmd])
    sub = next(a for a in parser._actions if a.dest == "command").choices[cmd.name]
    options = {s for action in sub._actions for s in action.option_strings}
    for group in cmd.groups:
        assert set(group.flags.values()) <= options, type(group).__name__


def test_option_errors_are_printed_with_the_flag_of_their_option(tmp_path, monkeypatch):
    flags = {"block_ops": "--block-op"}
    assert error_text(OptionError("unknown op type(s): Foo", option="block_ops"), flags) == (
        "--block-op: unknown op type(s): Foo"
    )
    assert error_text(OptionError("unknown placement 'x'", option="placement"), flags) == "unknown placement 'x'"
    assert error_text(OptionError("bad"), flags) == "bad"

    def refuse(*args, **kwargs):
        raise OptionError("unknown op type(s): Foo", option="block_ops")

    monkeypatch.setattr(conversion_module, "convert", refuse)
    src = tmp_path / "m.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [2])], [vi("y", F32, [2])]), src)
    code, err = _run(["convert", src, "-o", tmp_path / "o.onnx"])
    assert code == 2 and err.strip() == "amp-compiler: error: --block-op: unknown op type(s): Foo"
