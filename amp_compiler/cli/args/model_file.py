"""The model files of a command: the input model read safely, the output path checked once, the
output written atomically.

The output path is checked before any work (a bad one fails at once), against the input model file;
the input's external data files are known only once the model is read, and the output path is then
checked against those files alone. Writing does not check again: it goes through the checked
:class:`~amp_compiler.onnx.write.save.OutputPath`.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from amp_compiler.cli.args.group import ArgGroup
from amp_compiler.errors import OutputError

if TYPE_CHECKING:  # imported when a command runs, not to build the parser (--help stays fast)
    import onnx

    from amp_compiler import ConversionResult
    from amp_compiler.onnx.load.deferred import DeferredModel
    from amp_compiler.onnx.write.save import OutputPath, Verify

__all__ = ["ModelFile", "ModelFileArgs"]


@dataclasses.dataclass
class ModelFile:
    """One command's model files. ``files``: those read so far (the model, then its external data);
    ``output``: the checked output path (None for a command that writes no model)."""

    source: Path
    output: OutputPath | None = None
    files: list[Path] = dataclasses.field(default_factory=list)

    def load(self) -> onnx.ModelProto:
        """The input model, checked, with every weight in memory."""
        from amp_compiler.onnx.load import files as onnx_files  # through the module: tests intercept the loaders

        model, files = onnx_files.load_model_and_files(self.source)
        self._read(files)
        return model

    def load_deferred(self, *, check: bool) -> DeferredModel:
        """The input model with its large external weights left on disk (validated, read when needed);
        ``check=False`` leaves the model checks to the conversion, which does them while it builds its IR."""
        from amp_compiler.onnx.load import files as onnx_files

        loaded = onnx_files.load_model_deferred(self.source, check=check)
        self._read(loaded.files)
        return loaded

    def _read(self, files: list[Path]) -> None:
        self.files = list(files)
        if self.output is not None and self.files[1:]:
            self.output = self.output.with_external_data(self.files[1:])

    def save(self, result: ConversionResult, verify: Verify | None = None) -> list[Path]:
        """Write the converted model to the checked output path; returns the files written (the model,
        then its data file when the input's weights stayed on disk and go to ``<output>.data``).
        ``verify`` sees the complete temporary model before it is renamed into place."""
        if self.output is None:
            raise ValueError("this command writes no model")
        if result.output is None:
            self.output.write_model(result.model, verify)
            return [self.output.path]
        data_file = result.output.write(self.output, verify)
        return [self.output.path] if data_file is None else [self.output.path, data_file]


class ModelFileArgs(ArgGroup):
    """The input model, and for ``convert`` the output model (``-o``) and ``--force``. Depends on nothing."""

    title = "model files"

    def __init__(self, *, output: bool):
        self.writes_model = output
        self.source = Path()
        self.output: Path | None = None
        self.force = False

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("model", help="input ONNX model (FP32)")
        if self.writes_model:
            group.add_argument("-o", "--output", required=True, help="output ONNX model path")
            group.add_argument("--force", action="store_true", help="allow the output path to equal the input path")

    def parse(self, args: argparse.Namespace) -> None:
        self.source = Path(args.model)
        if self.writes_model:
            self.output, self.force = Path(args.output), args.force

    def open(self) -> ModelFile:
        """The model files, the output path checked (a refused one fails here, before any work)."""
        if self.output is None:
            return ModelFile(self.source)
        from amp_compiler.onnx.write.save import InputOverwriteError, check_output_path

        try:
            output = check_output_path(self.output, [self.source], force=self.force)
        except InputOverwriteError as exc:
            raise OutputError(f"{exc} (use --force to allow)") from None
        return ModelFile(self.source, output)
