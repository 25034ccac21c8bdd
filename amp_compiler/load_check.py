"""Does a converted model load in onnxruntime? Checked in a budgeted child process before it is written.

A converted model can crash onnxruntime itself (a SIGSEGV in one of its graph optimizers, at
session creation): checked in this process, that would kill the tool; unchecked, it would kill
whoever loads the output. :func:`check_output_loads` loads the written-but-not-yet-renamed output
in a :class:`~amp_compiler.runner.ChildRunner` (CPU provider, default optimisations: what people
run first). A model the CPU provider has no kernel for (BF16 MatMul, an op meant for CUDA) passes:
onnxruntime says so only once every graph optimizer ran. When it fails otherwise, the input model
is loaded the same way, to tell whose fault it is:

- the input loads: the conversion made a model onnxruntime cannot load: :class:`OutputCheckError`
  (nothing is written);
- the input does not load either (custom ops, a model meant for another runtime, or it crashes
  onnxruntime too): the check says nothing about the conversion; the output is written, with a
  warning that it was not checked;
- a load over the time or memory budget: :class:`~amp_compiler.errors.RunBudgetError` (a user error:
  raise the budget, or skip the check).
"""

from __future__ import annotations

import os
from pathlib import Path

from amp_compiler.errors import (
    ModelCrashError,
    ModelRunError,
    ModelUnsupportedError,
    OutputCheckError,
    RunBudgetError,
)
from amp_compiler.runner import ChildRunner, RunBudget, check_loads


def check_output_loads(
    output: str | os.PathLike, input_model: str | os.PathLike, budget: RunBudget, runner: ChildRunner | None = None
) -> str | None:
    """Raise :class:`OutputCheckError` when onnxruntime cannot load the converted model at ``output``
    (a file, its external data beside it) while it loads ``input_model`` (see the module doc).
    Returns None when the output loads, or a warning when neither does. ``runner``: a child already
    started (its import of onnxruntime overlapped the conversion), else one is started here."""
    first = runner or ChildRunner(budget)
    try:
        check_loads(output, first)
        return None
    except ModelUnsupportedError:  # no CPU kernel (BF16 MatMul): raised after every graph optimizer ran
        return None
    except RunBudgetError:
        raise
    except ModelRunError as exc:
        failure = exc
    finally:
        if runner is None:
            first.close()
    try:
        with ChildRunner(budget) as second:  # a fresh child: the first one may have crashed
            check_loads(Path(input_model), second)
    except RunBudgetError:
        raise
    except ModelRunError as exc:
        return f"the converted model was not checked: onnxruntime cannot load the input model either ({exc})"
    version = f"onnxruntime {first.onnxruntime_version}".strip()
    if isinstance(failure, ModelCrashError):
        raise OutputCheckError(
            f"the converted model crashes {version} ({failure.how} while loading it; the input model loads); "
            "not written"
        )
    raise OutputCheckError(f"{version} refuses the converted model, the input model loads ({failure}); not written")
