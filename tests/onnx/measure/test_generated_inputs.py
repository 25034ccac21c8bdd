"""Random inputs at dims the model runs with (amp_compiler.onnx.measure.generated_inputs), and what ``report``
does with them: every dynamic dim 1 first, then typical sizes the model's shape inference does not rule out,
batch dims kept at 1; the report says which dims it used, or why accuracy was not measured.
"""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler.analysis import analyze
from amp_compiler.cli import main
from amp_compiler.errors import ModelRunError, OptionError
from amp_compiler.onnx.measure import generated_inputs
from amp_compiler.onnx.measure.generated_inputs import MAX_REFUSED, Generated, dynamic_dims, runnable_inputs, shapes_for
from amp_compiler.options import ConvertOptions
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _audio_front_end(batch: str = "batch", name: str = "audio", samples: str = "samples") -> onnx.ModelProto:
    """audio [batch, samples] -> a 400-tap filterbank as a Conv with stride 160 (an STFT's shape):
    onnxruntime refuses fewer than 400 samples ("Invalid input shape: {1}"). ``name``, ``samples``: the
    input's and its length's (one named like audio by neither is sized by the generic search alone, the
    range probe's included)."""
    return model(
        [helper.make_node("Unsqueeze", [name, "axis"], ["a3"], name="unsqueeze"),
         helper.make_node("Conv", ["a3", "filters"], ["spec"], name="stft", strides=[160]),
         helper.make_node("Relu", ["spec"], ["y"], name="relu")],
        [vi(name, F32, [batch, samples])], [vi("y", F32, [batch, 64, "frames"])],
        [tensor("axis", np.array([1], np.int64)), tensor("filters", weights((64, 1, 400)))],
    )


def _encoder() -> onnx.ModelProto:
    """x [batch, sequence, 8] -> MatMul: runs at any size, 1 included."""
    return model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, ["batch", "sequence", 8])], [vi("y", F32, ["batch", "sequence", 8])],
        [tensor("w", weights((8, 8)))],
    )


class _Counting(InProcessRunner):
    """Counts the runs of every session it loads."""

    def __init__(self):
        super().__init__()
        self.runs = 0

    def load(self, model, **kwargs):
        session = super().load(model, **kwargs)
        run = session._run

        def counted(feeds):
            self.runs += 1
            return run(feeds)

        session._run = counted  # type: ignore[method-assign]
        return session


def test_dims_that_run_at_1_stay_1():
    with _Counting() as runner:
        generated = runnable_inputs(_encoder(), runner)
        assert runner.runs == 1
    assert generated.dims == {"batch": 1, "sequence": 1} and not generated.refused
    assert generated.samples[0]["x"].shape == (1, 1, 8) and generated.outputs[0][0].shape == (1, 1, 8)


def test_an_audio_front_end_gets_the_first_size_it_runs_with_and_batch_stays_1():
    with _Counting() as runner:
        generated = runnable_inputs(_audio_front_end(), runner)
        # 1 is refused; 2..128 are ruled out by shape inference (the Conv's output would be empty);
        # 256 passes onnx's inference (it truncates toward zero) and is refused; 512 runs
        assert runner.runs == 3
    assert generated.dims == {"batch": 1, "samples": 512}
    assert [size for size, _ in generated.refused] == [1, 256]
    assert "Invalid input shape" in generated.refused[0][1]
    assert generated.describe().startswith("batch=1, samples=512 (sizes 1, 256 did not run: onnxruntime could not")


def test_an_unnamed_first_dim_counts_as_a_batch():
    m = _audio_front_end(batch="unk__0")
    assert dynamic_dims(m) == ["unk__0", "samples"]
    with InProcessRunner() as runner:
        assert runnable_inputs(m, runner).dims == {"unk__0": 1, "samples": 512}


def test_fixed_shapes_are_not_searched_and_their_named_dims_follow():
    m = _audio_front_end()
    assert dynamic_dims(m, {"audio": (2, 800)}) == []
    assert shapes_for(m, {}, {"audio": (2, 800)}) == {"audio": (2, 800)}
    assert shapes_for(m, {"batch": 1, "samples": 7}) == {"audio": (1, 7)}


def test_the_search_stops_after_a_few_refused_runs(monkeypatch):
    """Reshape to 3 elements: no size of the ladder is 3; with inference ruling nothing out, at most
    1 + MAX_REFUSED runs are refused before the search gives up with onnxruntime's first refusal."""
    monkeypatch.setattr(generated_inputs._Inference, "allows", lambda self, shapes: True)
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], [vi("x", F32, ["length"])],
              [vi("y", F32, [3])], [tensor("shape", np.array([3], np.int64))])
    with _Counting() as runner, pytest.raises(ModelRunError, match="onnxruntime could not run the model"):
        runnable_inputs(m, runner)
    assert runner.runs == 1 + MAX_REFUSED  # size 1, then MAX_REFUSED sizes after it


# ---------------------------------------------------------------------------------- what report does


def test_report_measures_an_audio_front_end_and_says_at_which_dims():
    with InProcessRunner() as runner:
        report = analyze(_audio_front_end(), ConvertOptions(probe=False), runner=runner).report  # random inputs, no probe
    s = report.summary
    assert s.accuracy and not s.accuracy_not_measured and s.generated_dims == {"batch": 1, "samples": 512}
    assert any(w.startswith("output accuracy measured on random inputs (dynamic dims: batch=1, samples=512 (sizes 1,")
               for w in report.warnings)
    stft = next(n for n in report.nodes if n.name == "stft")
    assert stft.flops and stft.flops > 0  # costs at the sizes it ran with (at 1 the Conv has no output)


def test_report_without_a_run_that_works_is_written_unmeasured():
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], [vi("x", F32, ["n"])],
              [vi("y", F32, [3])], [tensor("shape", np.array([3], np.int64))])
    with InProcessRunner() as runner:
        s = analyze(m, ConvertOptions(), runner=runner).report.summary
    assert s.accuracy == [] and "onnxruntime could not run the model" in s.accuracy_not_measured


def test_report_of_a_model_onnxruntime_cannot_load_is_written_unmeasured():
    m = model([helper.make_node("Frobnicate", ["x"], ["y"], name="custom", domain="example.custom"),
               helper.make_node("Relu", ["x"], ["z"], name="relu")],
              [vi("x", F32, [2])], [vi("y", F32, [2]), vi("z", F32, [2])],
              extra_opsets=[helper.make_opsetid("example.custom", 1)])
    with InProcessRunner() as runner:
        s = analyze(m, ConvertOptions(), runner=runner).report.summary
    assert s.accuracy == [] and "onnxruntime could not load the model" in s.accuracy_not_measured


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "shape, needle",
    [
        ("audio:100000000000x100000000000", "--input-shape: audio:100000000000x100000000000: random inputs of these "
                                            "shapes take 40000000000000 GB, more than the 4.29 GB"),
        ("audio:1x10", "--input-shape: audio:1x10: the model does not run with these shapes (onnxruntime could not run"),
    ],
)
def test_report_input_shapes_that_cannot_work_are_one_line(tmp_path, shape, needle):
    path = tmp_path / "audio.onnx"
    onnx.save(_audio_front_end(), path)
    code, out, err = _cli("report", path, "--input-shape", shape)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_report_on_the_command_line_shows_the_dims_and_keeps_them_in_json(tmp_path):
    path = tmp_path / "audio.onnx"
    onnx.save(_audio_front_end(name="signal", samples="duration"), path)
    code, out, err = _cli("report", path)
    assert code == 0 and err == ""
    text = " ".join(out.split())  # the terminal report wraps its lines
    # the probe tries a dim it does not know at 16 and 4 first (probe_dims.SET_SIZE), then the search's 1 up
    assert "worst output cosine" in text and "duration=512" in text and "Invalid input shape: {16}" in text
    assert "sizes 16, 4, 1, 256 did not run" in text
    code, out, _ = _cli("report", path, "--format", "json")
    assert json.loads(out)["summary"]["generated_dims"] == {"batch": 1, "duration": 512}


def test_the_given_shapes_keep_their_option_error_through_the_api():
    with InProcessRunner() as runner, pytest.raises(OptionError) as caught:
        analyze(_audio_front_end(), ConvertOptions(), input_shapes={"audio": (1, 10)}, runner=runner)
    assert caught.value.option == "input_shapes"


def test_a_refusal_from_inside_a_subgraph_is_told_by_the_node_that_holds_it():
    """onnxruntime nests a failing node's message in each enclosing If's: the summary keeps the outer If and the message."""
    nested = ("onnxruntime could not run the model: Non-zero status code returned while running If node. "
              "Name:'If_0' Status Message: Non-zero status code returned while running If node. Name:'inner' "
              "Status Message: bad shape")
    generated = Generated(samples=[], dims={"n": 512}, outputs=[], refused=[(16000, nested)])
    assert generated.describe() == (
        "n=512 (sizes 16000 did not run: onnxruntime could not run the model: Non-zero status code returned "
        "while running If node. Name:'If_0' Status Message: bad shape)")
