"""What an argument group is: options added to a parser as one titled section, then read back."""

from __future__ import annotations

import abc
import argparse
from collections.abc import Mapping
from typing import ClassVar

__all__ = ["ArgGroup"]


class ArgGroup(abc.ABC):
    """A set of options that belong together.

    ``title`` heads the group's section in ``--help``. ``flags`` maps the API keywords its options
    set (``ConvertOptions`` fields, ``analyze`` arguments) to the flags, so that an
    :class:`~amp_compiler.errors.OptionError` about ``option="block_ops"`` is printed as ``--block-op: ...``.
    """

    title: ClassVar[str]
    flags: ClassVar[Mapping[str, str]] = {}

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add this group's options to ``parser``, as a section of their own."""
        self.add_arguments(parser.add_argument_group(self.title))

    @abc.abstractmethod
    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        """Declare the options."""

    @abc.abstractmethod
    def parse(self, args: argparse.Namespace) -> None:
        """Read the options back from parsed ``args`` (no file is touched)."""
