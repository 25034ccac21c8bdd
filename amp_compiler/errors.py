"""Errors a user can act on (bad input, bad option), kept apart from internal bugs."""


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


class ModelRunError(AmpUserError):
    """A model that onnxruntime cannot load or run here (custom ops, kernels missing, a broken file
    written by another tool)."""
