"""The one place models run: onnxruntime in a child process with a time and memory budget.

A model that loops, allocates tens of GB or crashes onnxruntime is a clear error (a user error with
the budget it went over, or a crash), never a hung or dead process; the child gives the same
outputs as a session in this process.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler.errors import ModelCrashError, ModelRunError, OptionError, RunBudgetError
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.runtime.budget import MIN_MEMORY, RunBudget
from amp_compiler.runtime.runner import ChildRunner, InProcessRunner
from tests.support.onnx_builders import (
    F16,
    F32,
    huge_constant_model,
    loop_forever_model,
    model,
    tensor,
    transpose_cast_matmul_model,
    vi,
    weights,
)

SMALL = RunBudget(seconds=30, memory=1 << 30)


def _mixed_model() -> onnx.ModelProto:
    """Float, FP16, int64 and bool outputs, from float and int64 inputs."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Cast", ["y"], ["h"], to=F16),
        helper.make_node("Add", ["i", "i"], ["j"]),
        helper.make_node("Greater", ["y", "zero"], ["b"]),
    ]
    inits = [tensor("w", weights((4, 3))), tensor("zero", np.zeros((), np.float32))]
    outputs = [vi("y", F32, [2, 3]), vi("h", F16, [2, 3]), vi("j", TensorProto.INT64, [5]), vi("b", TensorProto.BOOL, [2, 3])]
    return model(nodes, [vi("x", F32, [2, 4]), vi("i", TensorProto.INT64, [5])], outputs, inits)


def test_the_child_gives_what_this_process_gives():
    m = _mixed_model()
    feeds = {"x": weights((2, 4), seed=1), "i": np.arange(5, dtype=np.int64), "ignored": np.ones(1)}
    here = run_onnxruntime(m, feeds)
    with ChildRunner(SMALL) as runner:
        session = runner.load(m)
        assert session.input_names == ["x", "i"] and session.output_names == ["y", "h", "j", "b"]
        for _ in range(2):  # one session, several runs
            there = session.run(feeds)
            assert [a.dtype for a in there] == [a.dtype for a in here]
            for a, b in zip(here, there):
                np.testing.assert_array_equal(a, b)
        assert run_onnxruntime(m, feeds, runner=runner)[2].tolist() == [0, 2, 4, 6, 8]


def test_sessions_without_weight_prepacking_run_the_same():
    """The load check creates sessions with ``prepack=False``: onnxruntime is told to skip prepacking
    (its config entry), in this process and in the child, and such a session still computes the model."""
    import onnxruntime as ort

    from amp_compiler.runtime import child as runner_child

    assert runner_child.session_options(ort, prepack=False).get_session_config_entry("session.disable_prepacking") == "1"
    with pytest.raises(Exception, match="disable_prepacking"):  # not set: onnxruntime's default
        runner_child.session_options(ort).get_session_config_entry("session.disable_prepacking")
    m = _mixed_model()
    feeds = {"x": weights((2, 4), seed=1), "i": np.arange(5, dtype=np.int64)}
    here = InProcessRunner().load(m, prepack=False).run(feeds)
    with ChildRunner(SMALL) as runner:
        there = runner.load(m, threads=1, prepack=False).run(feeds)
    for a, b, c in zip(run_onnxruntime(m, feeds), here, there):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_a_model_that_runs_for_ever_is_stopped_at_the_time_budget():
    with ChildRunner(RunBudget(seconds=1, memory=1 << 30)) as runner:
        session = runner.load(loop_forever_model())
        with pytest.raises(RunBudgetError, match="longer than its time budget of 1 s") as info:
            session.run({"x": np.ones(1, np.float32)})
        assert info.value.option == "run_seconds"
        with pytest.raises(RunBudgetError):  # the child was killed: the runner says so again
            runner.load(_mixed_model())


def test_a_model_that_allocates_gigabytes_is_stopped_at_the_memory_budget():
    with ChildRunner(RunBudget(seconds=30, memory=1 << 30)) as runner:
        session = runner.load(huge_constant_model(40_000))  # 6.4 GB to run, 1.07 GB allowed
        with pytest.raises(RunBudgetError, match="memory budget of 1.07 GB") as info:
            session.run({"x": np.ones(1, np.float32)})
        assert info.value.option == "run_memory"
        # An allocation that failed leaves the child working.
        assert runner.load(huge_constant_model(100)).run({"x": np.ones(1, np.float32)})[0] == [10_000]


def test_a_model_that_crashes_onnxruntime_is_an_error_not_a_dead_process():
    with ChildRunner(SMALL) as runner:
        with pytest.raises(ModelCrashError, match="crashed .SIGSEGV. loading the model") as info:
            runner.load(transpose_cast_matmul_model())
        assert info.value.how == "SIGSEGV"


def test_a_model_onnxruntime_refuses_is_its_message_and_the_child_goes_on():
    bad = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [2])], [vi("y", F32, [2])])
    bad.graph.node[0].op_type = "NoSuchOp"
    with ChildRunner(SMALL) as runner:
        with pytest.raises(ModelRunError, match="could not load the model: .*NoSuchOp"):
            runner.load(bad)
        runner.load(_mixed_model())
    with pytest.raises(ModelRunError, match="NoSuchOp"):
        InProcessRunner().load(bad)


def _refused() -> onnx.ModelProto:
    bad = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [2])], [vi("y", F32, [2])])
    bad.graph.node[0].op_type = "NoSuchOp"
    return bad


def _closes(monkeypatch, runner) -> list:
    """The sessions of ``runner`` closed from now on (each still closed)."""
    closed: list = []
    session_type = type(runner.load(_mixed_model()))
    close = session_type.close
    monkeypatch.setattr(session_type, "close", lambda self: (closed.append(self), close(self)))
    return closed


@pytest.mark.parametrize("make_runner", [lambda: ChildRunner(SMALL), InProcessRunner])
def test_a_chain_of_models_loads_in_order_and_a_refusal_closes_what_it_loaded(monkeypatch, make_runner):
    feeds = {"x": weights((2, 4), seed=1), "i": np.arange(5, dtype=np.int64)}
    with make_runner() as runner:
        closed = _closes(monkeypatch, runner)
        first, second = runner.load_chain([_mixed_model(), _mixed_model()], basic=True, chained=True)
        np.testing.assert_array_equal(first.run(feeds)[0], second.run(feeds)[0])
        with pytest.raises(ModelRunError, match="NoSuchOp"):
            runner.load_chain([_mixed_model(), _mixed_model(), _refused(), _mixed_model()])
        assert len(closed) == 2  # the two loaded before the refusal
        np.testing.assert_array_equal(runner.load(_mixed_model()).run(feeds)[0], first.run(feeds)[0])


def test_a_chain_whose_models_fail_to_come_leaves_the_child_in_step(monkeypatch):
    """The models' iterator raises while the child makes the session of the one before: that answer is
    read (and the session closed), so the next request gets its own answer."""
    def models():
        yield _mixed_model()
        raise ValueError("no more pieces")

    feeds = {"x": weights((2, 4), seed=1), "i": np.arange(5, dtype=np.int64)}
    with ChildRunner(SMALL) as runner:
        closed = _closes(monkeypatch, runner)
        with pytest.raises(ValueError, match="no more pieces"):
            runner.load_chain(models())
        assert len(closed) == 1
        session = runner.load(_mixed_model())
        assert session.output_names == ["y", "h", "j", "b"]
        assert session.run(feeds)[2].tolist() == [0, 2, 4, 6, 8]


def test_a_model_file_loads_with_its_external_data(tmp_path):
    m = _mixed_model()
    onnx.save_model(m, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    with ChildRunner(SMALL) as runner:
        runner.load(tmp_path / "m.onnx").close()
        (tmp_path / "m.data").unlink()
        with pytest.raises(ModelRunError):
            runner.load(tmp_path / "m.onnx").close()


@pytest.mark.parametrize("seconds, memory, option", [(0, 1 << 30, "run_seconds"), (float("nan"), 1 << 30, "run_seconds"),
                                                      (1, MIN_MEMORY - 1, "run_memory")])
def test_a_budget_must_be_possible(seconds, memory, option):
    with pytest.raises(OptionError) as info:
        RunBudget(seconds=seconds, memory=memory)
    assert info.value.option == option


def test_close_leaves_the_childs_exit_to_a_thread_which_kills_a_child_that_does_not_end(monkeypatch):
    """close returns once the child's stdin is closed, without waiting for the kernel to free its memory;
    the child is reaped on a thread, and one that has not ended in ``_EXIT_SECONDS`` is killed."""
    import os
    import signal
    import time

    from amp_compiler.runtime import runner as runner_module

    monkeypatch.setattr(runner_module, "_EXIT_SECONDS", 0.2)
    runner = ChildRunner()
    runner._wait_ready()
    proc = runner._proc
    os.kill(proc.pid, signal.SIGSTOP)  # a child that cannot end
    runner.close()
    assert proc.returncode is None  # close did not wait for it
    deadline = time.monotonic() + 30
    while proc.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGKILL
    assert not runner.alive
