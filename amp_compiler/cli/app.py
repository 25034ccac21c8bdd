"""The ``amp-compiler`` application: the parser built from the commands, and errors turned into one line.

User errors (bad file, bad option, unwritable output, a model over its run budget) print one line on
stderr and exit 2; internal errors print one line and exit 1 (``--debug`` shows the traceback), and
so does a converted model that onnxruntime cannot load. An
:class:`~amp_compiler.errors.OptionError` about an API keyword (``option="block_ops"``) is printed
with the flag that sets it (``--block-op: ...``); a budget overrun names the flag that raises it.
Ctrl-C, SIGTERM and SIGHUP unwind the same way (temporary files removed, child processes stopped)
and exit 128 + the signal's number. Library log records (onnx_ir, onnx) and Python warnings never
reach stderr as they are: a successful command shows the log records as one warning line.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import NoReturn

from amp_compiler.cli.command import Command
from amp_compiler.cli.compare import CompareCommand
from amp_compiler.cli.convert import ConvertCommand
from amp_compiler.cli.report import ReportCommand
from amp_compiler.errors import AmpUserError, OptionError, OutputCheckError, RunBudgetError

__all__ = ["build_parser", "error_text", "main"]

PROG = "amp-compiler"
#: Libraries whose log records would otherwise print raw (names with line breaks and escapes included).
LOGGERS = ("onnx_ir", "onnx", "onnxscript")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too by default)
        raise OptionError(message)


class _VersionAction(argparse.Action):
    """``--version``: the versions, read from the installed packages only when asked for, printed on
    one line as they are (argparse's own action wraps them at the terminal's width)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: object, values: object, option: str | None = None
    ) -> NoReturn:
        print(version_text())
        parser.exit()


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind as for Ctrl-C (a BaseException, so ``except Exception``
    handlers let it through and every ``finally`` runs)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def version_text() -> str:
    """``amp-compiler X (onnx X, onnx-ir X, onnxruntime X, numpy X)``, from the installed packages."""
    from importlib import metadata  # read only for --version (importing it costs start-up time)

    from amp_compiler.runtime import installed_distributions

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    runtimes = installed_distributions() or ("onnxruntime",)  # onnxruntime-gpu, ...: whichever is installed
    deps = ", ".join(f"{name} {version(name)}" for name in ("onnx", "onnx-ir", *runtimes, "numpy"))
    return f"{PROG} {version('amp-compiler')} ({deps})"


def build_parser(commands: Iterable[Command]) -> argparse.ArgumentParser:
    """The parser: global options, then one subparser per command."""
    parser = _Parser(prog=PROG, description="Mixed-precision (FP16/BF16/FP8) compiler for ONNX models.")
    parser.add_argument("--version", action=_VersionAction, help="show the versions and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in commands:
        command.add_to(sub)
    return parser


def error_text(exc: AmpUserError, flags: Mapping[str, str]) -> str:
    """The message of a user error, led by the flag of the option it is about (an OptionError's, or
    another error's ``option``, such as ``strict``), or followed by the flag that raises the budget
    a run went over."""
    option = getattr(exc, "option", None)
    flag = flags.get(option) if option is not None else None
    if flag and isinstance(exc, RunBudgetError):
        return f"{exc} (raise it with {flag})"
    return f"{flag}: {exc}" if flag else str(exc)


def _one_line(text: str, limit: int = 600) -> str:
    """A message as one printable line: line breaks and control characters (from names inside a
    hostile model) never split or garble the error line; very long messages are shortened."""
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` in the main thread while the command runs."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    saved = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            saved[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (an embedding application): leave signals alone
            pass
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[_Collect]:
    """Library log records collected instead of printed, Python warnings dropped, while a command runs."""
    collect = _Collect()
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(collect)
        logger.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield collect
    finally:
        for logger, propagate in zip(loggers, saved, strict=True):
            logger.removeHandler(collect)
            logger.propagate = propagate


def _log_line(records: list[logging.LogRecord]) -> str:
    first = records[0]
    more = f" (and {len(records) - 1} more)" if len(records) > 1 else ""
    return _one_line(f"{PROG}: warning: {first.name}: {first.getMessage()}{more}")


def main(argv: list[str] | None = None) -> int:
    """Run ``amp-compiler`` with ``argv`` (default: the process's arguments); returns the exit status."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    commands: dict[str, Command] = {c.name: c for c in (ConvertCommand(), ReportCommand(), CompareCommand())}
    flags = {key: flag for c in commands.values() for g in c.groups for key, flag in g.flags.items()}
    try:
        with _signals_unwind(), _quiet_libraries() as logs:
            args = build_parser(commands.values()).parse_args(argv)
            code = commands[args.command](args)
        if logs.records:
            print(_log_line(logs.records), file=sys.stderr)
        return code
    except AmpUserError as exc:
        print(f"{PROG}: error: {_one_line(error_text(exc, flags))}", file=sys.stderr)
        return 2
    except OutputCheckError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"{PROG}: terminated ({signal.Signals(exc.signum).name})", file=sys.stderr)
        return 128 + exc.signum
    except Exception as exc:  # an internal bug: say so, in one line
        if debug:
            raise
        print(
            f"{PROG}: internal error: {type(exc).__name__}: {_one_line(str(exc))}"
            " (rerun with --debug for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1
