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
    _add_conversion_args(conv)
    conv.add_argument(
        "--report", metavar="FILE",
        help="also write the precision report; the format follows the suffix (.json, .csv, .html, else text)",
    )
    conv.add_argument("--force", action="store_true", help="allow the output path to equal the input path")
    conv.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")

    rep = sub.add_parser("report", help="show what a conversion would decide per node, and why")
    rep.add_argument("model", help="input ONNX model (FP32)")
    _add_conversion_args(rep)
    rep.add_argument("--format", default="terminal", choices=list(_FORMATS), help="report format")
    rep.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of stdout")
    rep.add_argument("--sort", default="cost", choices=["cost", "error", "name", "graph"], help="row order")
    rep.add_argument("--op", action="append", default=[], metavar="OP", help="only rows of this op type (repeatable)")
    rep.add_argument(
        "--precision", action="append", default=[], metavar="P",
        help="only rows of this precision: fp16, bf16, fp32, mixed, none, low, high (repeatable)",
    )
    rep.add_argument("-v", "--verbose", action="store_true", help="show each decision's reason")
    rep.add_argument("--limit", type=int, default=None, help="at most this many rows in the terminal table")
    return parser


_FORMATS = ("terminal", "json", "csv", "html")


def _add_conversion_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``convert`` and ``report``: what to convert to, overrides, calibration."""
    p.add_argument("--target", default="fp16", choices=[t.value for t in Target])
    p.add_argument(
        "--provider", default="cuda", choices=[p.value for p in Provider],
        help="execution provider the model is meant for (default: cuda)",
    )
    p.add_argument(
        "--block-op", action="append", default=[], metavar="OP",
        help="keep every node of this op type in FP32 (repeatable)",
    )
    p.add_argument(
        "--block-node", action="append", default=[], metavar="REGEX",
        help="keep nodes whose name matches this regular expression (re.search) in FP32 (repeatable)",
    )
    p.add_argument(
        "--no-keep-io-types", dest="keep_io_types", action="store_false",
        help="let graph inputs and outputs take the low-precision type too",
    )
    p.add_argument(
        "--calibration-data", metavar="PATH",
        help="sample inputs: an .npz keyed by graph input name, or a folder of them",
    )
    p.add_argument(
        "--tolerance", type=float, metavar="REL_L2",
        help="pin nodes to FP32 until every float output is within this relative L2 error of FP32 "
        "(needs --calibration-data)",
    )
    p.add_argument(
        "--input-shape", action="append", default=[], metavar="NAME:DIMS",
        help="fix a graph input's shape, e.g. input:1x3x224x224 (cost estimates, random inputs; repeatable)",
    )
    p.add_argument(
        "--pad-tensor-cores", action="store_true",
        help="pad FP16/BF16 MatMul/Gemm/Conv weights to multiples of 8 with zeros and slice the "
        "outputs back (exact; off by default)",
    )


def _options(args: argparse.Namespace):
    from amp_compiler.convert import ConvertOptions

    return ConvertOptions(
        target=Target.parse(args.target),
        provider=Provider.parse(args.provider),
        keep_io_types=args.keep_io_types,
        block_ops=frozenset(args.block_op),
        block_nodes=tuple(args.block_node),
        pad_tensor_cores=args.pad_tensor_cores,
        input_shapes=tuple((_input_shapes(args) or {}).items()),
    )


def _input_shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]] | None:
    from amp_compiler.costs import parse_input_shape

    shapes = {}
    for text in args.input_shape:
        try:
            name, shape = parse_input_shape(text)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        shapes[name] = shape
    return shapes or None


def _analyze(args: argparse.Namespace, model, src: Path):
    from amp_compiler.analyze import analyze

    shapes = _input_shapes(args)
    if shapes:
        known = {i.name for i in model.graph.input}
        unknown = sorted(set(shapes) - known)
        if unknown:
            raise OptionError(f"--input-shape: {', '.join(unknown)} is not a graph input (inputs: {', '.join(sorted(known))})")
    return analyze(
        model,
        _options(args),
        model_name=src.name,
        calibration_data=args.calibration_data,
        tolerance=args.tolerance,
        input_shapes=shapes,
    )


def _format_for(path: Path) -> str:
    return {".json": "json", ".csv": "csv", ".html": "html", ".htm": "html"}.get(path.suffix.lower(), "terminal")


def _write_text(path: Path, text: str) -> None:
    """Write a report atomically (temporary file, then rename)."""
    import os
    import tempfile

    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"{path}: the folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _report(args: argparse.Namespace) -> int:
    from amp_compiler.onnx.files import load_model
    from amp_compiler.report.render import render

    src = Path(args.model)
    model = load_model(src)
    analysis = _analyze(args, model, src)
    to_tty = args.output is None and sys.stdout.isatty()
    text = render(
        analysis.report,
        args.format,
        sort=args.sort,
        op=args.op or None,
        precision=args.precision or None,
        color=to_tty and args.format == "terminal",
        verbose=args.verbose,
        limit=args.limit,
    )
    if args.output:
        _write_text(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from amp_compiler.convert import convert
    from amp_compiler.onnx.files import load_model_deferred
    from amp_compiler.onnx.save import InputOverwriteError, check_output_path, save_model

    src, dst = Path(args.model), Path(args.output)
    try:
        check_output_path(dst, [src], force=args.force)  # fail before the work, not after it
    except InputOverwriteError as exc:
        raise OutputError(f"{exc} (use --force to allow)") from None
    start = time.perf_counter()
    # Large external-data weights stay on disk (validated), read one at a time by the conversion.
    # A plain conversion checks the model itself, while it builds the IR (in parallel for large ones).
    explain = args.report or args.calibration_data or args.tolerance is not None or args.input_shape
    loaded = load_model_deferred(src, check=bool(explain))
    input_files = loaded.files
    check_output_path(dst, input_files, force=args.force)  # nor over the input's external data
    analysis = _analyze(args, loaded.load(), src) if explain else None
    result = analysis.result if analysis else convert(loaded, _options(args))
    if args.report:
        from amp_compiler.report.render import render

        report_path = Path(args.report)
        _write_text(report_path, render(analysis.report, _format_for(report_path)))
    output_files = [dst]
    if result.output is not None:  # converted from external data: written with external data
        data_file = result.save(dst, input_files=input_files, force=args.force)
        output_files += [data_file] if data_file is not None else []
    else:
        save_model(result.model, dst, input_path=None if args.force else src)
    if not args.quiet:
        _print_summary(result, input_files, output_files, time.perf_counter() - start)
        if analysis and analysis.refinement:
            r = analysis.refinement
            worst = max(r.output_errors.values(), default=0.0)
            print(
                f"--tolerance {args.tolerance:g}: {'met' if r.met else 'NOT met'} (worst output "
                f"relative L2 {worst:.3g}) after {r.rounds} conversions, {r.model_runs} model runs; "
                f"{len(r.pinned)} node(s) pinned to FP32"
            )
    return 0


def _print_summary(result, input_files: list[Path], output_files: list[Path], seconds: float) -> None:
    """One line: where the model went, its nodes by precision, Tensor Core ops, Casts, and the size
    (model file plus external data files, before and after)."""
    dst = output_files[0]
    decisions = result.decisions
    target = result.options.target.value
    heavy = [d for d in decisions if d.op_type in LOW_PRECISION_OPS]
    heavy_low = sum(1 for d in heavy if d.precision == target)
    by_precision = Counter(d.precision for d in decisions if d.rule != "lowering.cast")
    size_in = sum(Path(f).stat().st_size for f in input_files)
    size_out = sum(Path(f).stat().st_size for f in output_files)
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
        if args.command == "report":
            return _report(args)
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
