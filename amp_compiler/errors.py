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


class RuntimeMissingError(AmpUserError):
    """onnxruntime is needed (an op's schema, a model run) and is not installed, or is installed twice."""


class UntypedTensorsError(AmpUserError):
    """The conversion would leave nodes as they are because their tensors' element types are unknown,
    and the ``strict`` option makes that an error. ``option`` names that keyword (as an OptionError's)."""

    option = "strict"
