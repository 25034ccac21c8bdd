"""Does a converted model load in onnxruntime? Checked in a budgeted child process before it is written.

A converted model can crash onnxruntime itself (a SIGSEGV in one of its graph optimizers, at
session creation): checked in this process, that would kill the tool; unchecked, it would kill
whoever loads the output. :class:`OutputLoadCheck` loads the output in a
:class:`~amp_compiler.runner.ChildRunner` (CPU provider, default optimisations: what people run
first) before it is renamed into place. A model the CPU provider has no kernel for (BF16 MatMul, an
op meant for CUDA) passes: onnxruntime says so only once every graph optimizer ran.

A large output is loaded in pieces (:mod:`amp_compiler.onnx.check_pieces`: onnxruntime's session
creation grows with the square of an FP16 graph's size; each distinct piece is loaded once), and an
output held in memory has its pieces loaded while it is written. When a piece fails, the whole
output is loaded to confirm it (a cut can make a piece fail where the whole model loads). When the
output fails, the input model is loaded the same way, to tell whose fault it is:

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
from amp_compiler.onnx.check_pieces import TypeTable, load_pieces
from amp_compiler.onnx.files import DEFER_MIN_BYTES
from amp_compiler.onnx.inline_weights import skim
from amp_compiler.runner import ChildRunner, RunBudget, Runner

if TYPE_CHECKING:
    from amp_compiler.result import ConversionResult


@dataclasses.dataclass(frozen=True)
class Failure:
    """onnxruntime's refusal or crash loading a model, and which onnxruntime it was ("onnxruntime 1.32.0")."""

    error: ModelRunError
    onnxruntime: str


def check_output_loads(
    output: str | os.PathLike, input_model: str | os.PathLike, budget: RunBudget, runner: ChildRunner | None = None,
    pieces: Sequence[onnx.ModelProto] | None = None, data_folder: Path | None = None,
) -> str | None:
    """Raise :class:`OutputCheckError` when onnxruntime cannot load the converted model at ``output``
    (a file, its external data beside it) while it loads ``input_model`` (see the module doc).
    Returns None when the output loads, or a warning when neither does. ``runner``: a child already
    started (its import of onnxruntime overlapped the conversion), else one is started here.
    ``pieces``: load these instead of the whole output (a failure is confirmed on the whole), their
    external data in ``data_folder``."""
    first = runner or ChildRunner(budget)
    try:
        failure = first_failure(pieces if pieces is not None else [Path(output)], first, data_folder)
    finally:
        if runner is None:
            first.close()
    return judge(failure, output, input_model, budget, confirm=pieces is not None)


def first_failure(
    models: Sequence[onnx.ModelProto | Path], runner: Runner, data_folder: Path | None = None
) -> Failure | None:
    """The first refusal or crash of onnxruntime loading ``models`` in order (None when all load;
    a model it has no CPU kernel for loads; a ModelProto's external data is in ``data_folder``). A
    load over the budget raises :class:`RunBudgetError`."""
    for model in models:
        try:
            folder = data_folder if isinstance(model, onnx.ModelProto) else None
            runner.load(model, threads=1, data_folder=folder).close()  # only created: one thread is enough
        except ModelUnsupportedError:  # no CPU kernel (BF16 MatMul): raised after every graph optimizer ran
            continue
        except RunBudgetError:
            raise
        except ModelRunError as exc:
            return Failure(exc, f"onnxruntime {runner.onnxruntime_version}".strip())
    return None


def judge(
    failure: Failure | None, output: str | os.PathLike, input_model: str | os.PathLike, budget: RunBudget,
    *, confirm: bool,
) -> str | None:
    """What a failure to load the output (None: it loaded) means, as :func:`check_output_loads` says;
    ``confirm``: the failure was a piece's, and the whole output is loaded first."""
    if failure is not None and confirm:
        with ChildRunner(budget) as whole:
            failure = first_failure([Path(output)], whole)
    if failure is None:
        return None
    try:
        with ChildRunner(budget) as second:  # a fresh child: the first one may have crashed
            second.load(Path(input_model)).close()
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

    :meth:`start` begins loading the pieces of an output held in memory in a thread (the child
    process works while this process writes the file); the check itself (calling the object with
    the written temporary file) waits for them, or loads the file's pieces (an output with external
    data) or the whole file (a small one). ``warnings`` collects what the check could not judge."""

    def __init__(self, input_model: str | os.PathLike, budget: RunBudget, runner: ChildRunner):
        self.input_model, self.budget, self.runner = input_model, budget, runner
        self.warnings: list[str] = []
        self._types: TypeTable = {}
        self._thread: threading.Thread | None = None
        self._outcome: tuple[bool, Failure | None] = (False, None)  # (pieces were loaded, failure)
        self._error: BaseException | None = None

    def start(self, result: ConversionResult) -> None:
        """Load the pieces of ``result``'s in-memory output in the background (an output with external
        data has its pieces read from the written file)."""
        self._types = result.value_types
        if result.output is None and self._types:
            self._thread = threading.Thread(target=self._background, args=(result.model,), daemon=True)
            self._thread.start()

    def _background(self, model: onnx.ModelProto) -> None:  # runs in the thread
        try:
            pieces = load_pieces(model, self._types)
            self._outcome = (pieces is not None, first_failure(pieces, self.runner) if pieces else None)
        except BaseException as exc:  # re-raised by the check, in the calling thread
            self._error = exc

    def __call__(self, tmp: Path) -> None:
        """Check the complete temporary output ``tmp`` (raises :class:`OutputCheckError` to refuse it)."""
        pieces = None
        if self._thread is not None:
            self._thread.join()
            if self._error is not None:
                raise self._error
            loaded, failure = self._outcome
            if loaded:
                self._warn(judge(failure, tmp, self.input_model, self.budget, confirm=True))
                return
        elif self._types:  # an output with external data, or one file with its weights streamed into it
            skimmed = skim(tmp, DEFER_MIN_BYTES)  # weights left in the file: onnxruntime reads each piece's
            skeleton = onnx.load(tmp, load_external_data=False) if skimmed is None else onnx.load_from_string(skimmed)
            pieces = load_pieces(skeleton, self._types)
        self._warn(check_output_loads(tmp, self.input_model, self.budget, self.runner, pieces, tmp.parent))

    def _warn(self, warning: str | None) -> None:
        if warning:
            self.warnings.append(warning)
