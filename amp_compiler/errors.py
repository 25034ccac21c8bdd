"""Errors a user can act on (bad input, bad option), kept apart from internal bugs."""

__all__ = [
    "AmpUserError", "ModelCrashError", "ModelLoadError", "ModelRefusedError", "ModelRunError",
    "ModelUnsupportedError", "OptionError", "OutputCheckError", "OutputError", "RunBudgetError",
    "RuntimeMissingError", "UntypedTensorsError",
]


class AmpUserError(Exception):
    """A problem with the user's input or options. The CLI prints it as one line and exits 2."""


class ModelLoadError(AmpUserError):
    """The model file is missing, unreadable, not ONNX, truncated or invalid."""


class OptionError(AmpUserError):
    """An option names something that does not exist or has a bad value. ``option`` is the API
    keyword it is about (the CLI names the matching flag)."""

    def __init__(self, message: str, *, option: str | None = None):
        super().__init__(message)
        self.option = option


class OutputError(AmpUserError):
    """The output cannot be written where asked."""


class RuntimeMissingError(AmpUserError):
    """onnxruntime is needed (an op's schema, a model run) and is not installed, or is installed twice."""


class UntypedTensorsError(AmpUserError):
    """The conversion would leave nodes as they are because their tensors' element types are unknown,
    and the ``strict`` option makes that an error. ``option`` names that keyword (as an OptionError's)."""

    option = "strict"
class ModelRunError(AmpUserError):
    """onnxruntime refused to load or run the model (its own message follows)."""


class ModelRefusedError(ModelRunError):
    """onnxruntime refused to load the model (an op it does not know, an invalid graph): a fault of
    the model file, before any input is fed to it."""


class ModelUnsupportedError(ModelRunError):
    """onnxruntime has no kernel, on the provider it ran with, for an op of the model."""


class RunBudgetError(ModelRunError):
    """Running the model went over its time or memory budget. ``option`` is the API keyword of the
    budget it went over (``run_seconds``, ``run_memory``); the CLI names the matching flag."""

    def __init__(self, message: str, *, option: str):
        super().__init__(message)
        self.option = option


class ModelCrashError(ModelRunError):
    """onnxruntime crashed (killed by a signal) loading or running the model, in the child process
    that ran it. ``how``: the signal's name (``SIGSEGV``), or the exit status."""

    def __init__(self, message: str, *, how: str):
        super().__init__(message)
        self.how = how


class OutputCheckError(Exception):
    """The converted model does not load in onnxruntime while the input does: a fault of the
    conversion (or of onnxruntime), not of the user's input. The CLI prints one line and exits 1."""
