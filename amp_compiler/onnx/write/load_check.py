"""Does a converted model load in onnxruntime? Checked in a budgeted child process before it is written.

A converted model can crash onnxruntime itself (a SIGSEGV in one of its graph optimizers, at
session creation): checked in this process, that would kill the tool; unchecked, it would kill
whoever loads the output. :class:`OutputLoadCheck` loads the output in a
:class:`~amp_compiler.runtime.runner.ChildRunner` (CPU provider, default optimisations: what people run
first) before it is renamed into place. The CPU provider stands in for the provider the output is
for, and does what that one does not: it casts an FP16 MatMul's inputs to FP32 itself. An optimizer
that trips only on such a Cast (``MatmulTransposeFusion``,
:func:`amp_compiler.passes.analysis.hazards.stand_in_skips`) is turned off for the check of an output
meant for the CUDA or TensorRT provider (``ConversionResult.load_check_skips``; the command line
says so). The sessions are only created, never run: one thread, and no weight prepacking (the
kernels' copies of their weights in their own layout, made after every graph transformation: half
of GPT-2's load time). A model the CPU provider has no kernel for (BF16 MatMul, an
op meant for CUDA) passes: onnxruntime says so only once every graph optimizer ran.

A large output is loaded in pieces (:mod:`amp_compiler.onnx.write.check_pieces`: onnxruntime's session
creation grows with the square of an FP16 graph's size; each distinct piece is loaded once, its
large weights stand-ins), made from the output's graph and loaded while its weights are converted
and written. When a piece fails, the whole output is loaded to confirm it (a cut can make a piece
fail where the whole model loads). When the output fails, the input model is loaded the same way,
to tell whose fault it is:

- the input loads: the conversion made a model onnxruntime cannot load: :class:`OutputCheckError`
  (nothing is written);
- the input does not load either (custom ops, a model meant for another runtime, or it crashes
  onnxruntime too): the check says nothing about the conversion; the output is written, with a
  warning that it was not checked;
- a load over the time or memory budget: :class:`~amp_compiler.errors.RunBudgetError` (a user error:
  raise the budget, or skip the check).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from amp_compiler.errors import (
    ModelCrashError,
    ModelRunError,
    ModelUnsupportedError,
    OutputCheckError,
    RunBudgetError,
)
from amp_compiler.onnx.write.check_pieces import TypeTable, load_pieces, write_stand_in
from amp_compiler.runtime.budget import RunBudget
from amp_compiler.runtime.runner import ChildRunner, Runner

if TYPE_CHECKING:
    from amp_compiler.onnx.write.result import ConversionResult

__all__ = ["OutputLoadCheck", "check_output_loads"]


@dataclasses.dataclass(frozen=True)
class Failure:
    """onnxruntime's refusal or crash loading a model, and which onnxruntime it was ("onnxruntime 1.32.0")."""

    error: ModelRunError
    onnxruntime: str


def check_output_loads(
    output: str | os.PathLike, input_model: str | os.PathLike, budget: RunBudget, runner: ChildRunner | None = None,
    pieces: Sequence[onnx.ModelProto] | None = None, disabled: Sequence[str] = (),
) -> str | None:
    """Raise :class:`OutputCheckError` when onnxruntime cannot load the converted model at ``output``
    (a file, its external data beside it) while it loads ``input_model`` (see the module doc).
    Returns None when the output loads, or a warning when neither does. ``runner``: a child already
    started (its import of onnxruntime overlapped the conversion), else one is started here.
    ``pieces``: load these (:func:`~amp_compiler.onnx.write.check_pieces.load_pieces`) instead of the whole
    output (a failure is confirmed on the whole). ``disabled``: onnxruntime optimizers the output's
    loads turn off (see the module doc)."""
    first = runner or ChildRunner(budget)
    try:
        failure = (
            first_failure([Path(output)], first, disabled=disabled) if pieces is None
            else first_piece_failure(pieces, first, disabled)
        )
    finally:
        if runner is None:
            first.close()
    return judge(failure, output, input_model, budget, confirm=pieces is not None, disabled=disabled)


def first_failure(
    models: Sequence[onnx.ModelProto | Path], runner: Runner, data_folder: Path | None = None,
    disabled: Sequence[str] = (),
) -> Failure | None:
    """The first refusal or crash of onnxruntime loading ``models`` in order (None when all load;
    a model it has no CPU kernel for loads; a ModelProto's external data is in ``data_folder``;
    ``disabled``: optimizers turned off). A load over the budget raises :class:`RunBudgetError`."""
    for model in models:
        try:
            folder = data_folder if isinstance(model, onnx.ModelProto) else None
            runner.load(model, threads=1, data_folder=folder, prepack=False, disabled=disabled).close()
        except ModelUnsupportedError:  # no CPU kernel (BF16 MatMul): raised after every graph optimizer ran
            continue
        except RunBudgetError:
            raise
        except ModelRunError as exc:
            return Failure(exc, f"onnxruntime {runner.onnxruntime_version}".strip())
    return None


def first_piece_failure(
    pieces: Sequence[onnx.ModelProto], runner: Runner, disabled: Sequence[str] = ()
) -> Failure | None:
    """:func:`first_failure` of the ``pieces`` of a model, their stand-in weights read from a file of
    zeros made for them."""
    with tempfile.TemporaryDirectory(prefix="amp-compiler-check-") as folder:
        write_stand_in(pieces, folder)
        return first_failure(pieces, runner, Path(folder), disabled)


def judge(
    failure: Failure | None, output: str | os.PathLike, input_model: str | os.PathLike, budget: RunBudget,
    *, confirm: bool, disabled: Sequence[str] = (),
) -> str | None:
    """What a failure to load the output (None: it loaded) means, as :func:`check_output_loads` says;
    ``confirm``: the failure was a piece's, and the whole output is loaded first (``disabled``:
    optimizers the output's loads turn off)."""
    if failure is not None and confirm:
        with ChildRunner(budget) as whole:
            failure = first_failure([Path(output)], whole, disabled=disabled)
    if failure is None:
        return None
    try:
        with ChildRunner(budget) as second:  # a fresh child: the first one may have crashed
            second.load(Path(input_model), threads=1, prepack=False).close()
    except RunBudgetError:
        raise
    except ModelRunError as exc:
        return f"the converted model was not checked: onnxruntime cannot load the input model either ({exc})"
    error, version = failure.error, failure.onnxruntime
    if isinstance(error, ModelCrashError):
        raise OutputCheckError(
            f"the converted model crashes {version} ({error.how} while loading it; the input model loads); "
            "not written"
        )
    raise OutputCheckError(f"{version} refuses the converted model, the input model loads ({error}); not written")


class OutputLoadCheck:
    """The load check of one conversion's output, as :meth:`ConversionResult.save`'s ``verify``.

    :meth:`start` makes the output's pieces from its graph (large weights stand-ins: nothing is read,
    converted or copied) and loads them in a thread, so the child process works while this process
    converts the weights and writes the file; the check itself (calling the object with the written
    temporary file) waits for them, or loads the whole file (a small output, or one whose pieces
    cannot be made). ``warnings`` collects what the check could not judge."""

    def __init__(self, input_model: str | os.PathLike, budget: RunBudget, runner: ChildRunner):
        self.input_model, self.budget, self.runner = input_model, budget, runner
        self.warnings: list[str] = []
        self.disabled: tuple[str, ...] = ()  # the output's load_check_skips, once started
        self._thread: threading.Thread | None = None
        self._outcome: tuple[bool, Failure | None] = (False, None)  # (pieces were loaded, failure)
        self._error: BaseException | None = None

    def start(self, result: ConversionResult) -> None:
        """Load the pieces of ``result``'s output in the background (see the class doc)."""
        self.disabled = result.load_check_skips
        if not result.value_types:
            return
        skeleton = result.model if result.output is None else result.output.skeleton()
        self._thread = threading.Thread(target=self._background, args=(skeleton, result.value_types), daemon=True)
        self._thread.start()

    def _background(self, skeleton: onnx.ModelProto, types: TypeTable) -> None:  # runs in the thread
        try:
            pieces = load_pieces(skeleton, types)
            if pieces:
                self._outcome = (True, first_piece_failure(pieces, self.runner, self.disabled))
        except BaseException as exc:  # re-raised by the check, in the calling thread
            self._error = exc

    def __call__(self, tmp: Path) -> None:
        """Check the complete temporary output ``tmp`` (raises :class:`OutputCheckError` to refuse it)."""
        if self._thread is not None:
            self._thread.join()
            if self._error is not None:
                raise self._error
            loaded, failure = self._outcome
            if loaded:
                self._warn(judge(failure, tmp, self.input_model, self.budget, confirm=True, disabled=self.disabled))
                return
        self._warn(check_output_loads(tmp, self.input_model, self.budget, self.runner, disabled=self.disabled))

    def _warn(self, warning: str | None) -> None:
        if warning:
            self.warnings.append(warning)
