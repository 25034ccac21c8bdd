"""The ``amp-compiler`` command line: a thin layer over :func:`amp_compiler.convert`.

User errors (bad file, bad option, unwritable output) print one line on stderr and exit 2; internal
errors print one line and exit 1 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from amp_compiler.errors import AmpUserError, OptionError, OutputError
from amp_compiler.targets import Provider, Target

PROG = "amp-compiler"
LOW_PRECISION_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN"})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too by default)
        raise OptionError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Mixed-precision (FP16/BF16) compiler for ONNX models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    conv = sub.add_parser("convert", help="convert an FP32 ONNX model to mixed precision")
    conv.add_argument("model", help="input ONNX model (FP32)")
    conv.add_argument("-o", "--output", required=True, help="output ONNX model path")
    conv.add_argument("--target", default="fp16", choices=[t.value for t in Target])
    conv.add_argument(
        "--provider", default="cuda", choices=[p.value for p in Provider],
        help="execution provider the model is meant for (default: cuda)",
    )
    conv.add_argument(
        "--block-op", action="append", default=[], metavar="OP",
        help="keep every node of this op type in FP32 (repeatable)",
    )
    conv.add_argument(
        "--block-node", action="append", default=[], metavar="REGEX",
        help="keep nodes whose name matches this regular expression (re.search) in FP32 (repeatable)",
    )
    conv.add_argument(
        "--no-keep-io-types", dest="keep_io_types", action="store_false",
        help="let graph inputs and outputs take the low-precision type too",
    )
    conv.add_argument("--force", action="store_true", help="allow the output path to equal the input path")
    conv.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    return parser


def _convert(args: argparse.Namespace) -> int:
    from amp_compiler.convert import convert
    from amp_compiler.onnx_io import check_output_path, load_model_and_files, save_model

    src, dst = Path(args.model), Path(args.output)
    check_output_path(dst, [src], force=args.force)  # fail before the work, not after it
    start = time.perf_counter()
    model, input_files = load_model_and_files(src)
    check_output_path(dst, input_files, force=args.force)  # nor over the input's external data
    result = convert(
        model,
        target=Target.parse(args.target),
        provider=Provider.parse(args.provider),
        keep_io_types=args.keep_io_types,
        block_ops=args.block_op,
        block_nodes=args.block_node,
    )
    save_model(result.model, dst, input_path=None if args.force else src)
    if not args.quiet:
        _print_summary(result, src, dst, time.perf_counter() - start)
    return 0


def _print_summary(result, src: Path, dst: Path, seconds: float) -> None:
    decisions = result.decisions
    target = result.options.target.value
    heavy = [d for d in decisions if d.op_type in LOW_PRECISION_OPS]
    heavy_low = sum(1 for d in heavy if d.precision == target)
    by_precision = Counter(d.precision for d in decisions if d.rule != "lowering.cast")
    size_in, size_out = src.stat().st_size, dst.stat().st_size
    print(
        f"{dst}: {target} model written in {seconds:.2f} s | nodes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_precision.items()))
        + f" | Tensor Core ops in {target}: {heavy_low}/{len(heavy)}"
        + f" | casts inserted: {result.casts_inserted}"
        + f" | size {size_in / 1e6:.2f} MB -> {size_out / 1e6:.2f} MB"
    )


def _one_line(text: str, limit: int = 600) -> str:
    """A message as one printable line: line breaks and control characters (from names inside a
    hostile model) never split or garble the error line; very long messages are shortened."""
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        args = _parser().parse_args(argv)
        if args.command == "convert":
            return _convert(args)
        raise OptionError(f"unknown command {args.command!r}")
    except AmpUserError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
