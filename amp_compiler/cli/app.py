"""The ``amp-compiler`` application: the parser built from the commands, and errors turned into one line.

User errors (bad file, bad option, unwritable output) print one line on stderr and exit 2; internal
errors print one line and exit 1 (``--debug`` shows the traceback). An
:class:`~amp_compiler.errors.OptionError` about an API keyword (``option="block_ops"``) is printed
with the flag that sets it (``--block-op: ...``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import NoReturn

from amp_compiler.cli.command import Command
from amp_compiler.cli.compare import CompareCommand
from amp_compiler.cli.convert import ConvertCommand
from amp_compiler.cli.report import ReportCommand
from amp_compiler.errors import AmpUserError, OptionError

PROG = "amp-compiler"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too by default)
        raise OptionError(message)


def build_parser(commands: Iterable[Command]) -> argparse.ArgumentParser:
    """The parser: global options, then one subparser per command."""
    parser = _Parser(prog=PROG, description="Mixed-precision (FP16/BF16) compiler for ONNX models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in commands:
        command.add_to(sub)
    return parser


def error_text(exc: AmpUserError, flags: Mapping[str, str]) -> str:
    """The message of a user error, led by the flag an OptionError is about (when it has one)."""
    option = exc.option if isinstance(exc, OptionError) else None
    flag = flags.get(option) if option is not None else None
    return f"{flag}: {exc}" if flag else str(exc)


def _one_line(text: str, limit: int = 600) -> str:
    """A message as one printable line: line breaks and control characters (from names inside a
    hostile model) never split or garble the error line; very long messages are shortened."""
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    """Run ``amp-compiler`` with ``argv`` (default: the process's arguments); returns the exit status."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    commands: dict[str, Command] = {c.name: c for c in (ConvertCommand(), ReportCommand(), CompareCommand())}
    flags = {key: flag for c in commands.values() for g in c.groups for key, flag in g.flags.items()}
    try:
        args = build_parser(commands.values()).parse_args(argv)
        return commands[args.command](args)
    except AmpUserError as exc:
        print(f"{PROG}: error: {_one_line(error_text(exc, flags))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an internal bug: say so, in one line
        if debug:
            raise
        print(
            f"{PROG}: internal error: {type(exc).__name__}: {_one_line(str(exc))}"
            " (rerun with --debug for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1
