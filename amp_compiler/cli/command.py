"""What a command is: its argument groups, its own options, and what it does with them."""

from __future__ import annotations

import abc
import argparse
from typing import ClassVar

from amp_compiler.cli.args.group import ArgGroup

__all__ = ["Command"]


class Command(abc.ABC):
    """One subcommand of ``amp-compiler``, made of argument groups (``groups``, in help order)."""

    name: ClassVar[str]
    help: ClassVar[str]
    groups: list[ArgGroup]

    def add_to(self, subparsers: argparse._SubParsersAction) -> None:
        """Add this command's parser: each group's section, then the command's own options."""
        parser = subparsers.add_parser(self.name, help=self.help)
        for group in self.groups:
            group.add_to(parser)
        self.add_arguments(parser)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027 - optional hook
        """The command's own options, beyond its groups' (none by default)."""

    def __call__(self, args: argparse.Namespace) -> int:
        """Read every group's options back, then run; returns the exit status."""
        for group in self.groups:
            group.parse(args)
        return self.run(args)

    @abc.abstractmethod
    def run(self, args: argparse.Namespace) -> int:
        """Do the command's work (its groups already parsed); returns the exit status."""
