"""What a user waits for: a cold ``amp-compiler convert`` process per conversion, and its peak memory.

    python -m benchmarks.cold [--runs 3] [--models demo,10k,100k,bert-base,gpt2,2.5gb] [--results FILE]

Each conversion is a fresh process, as a user runs it: Python's start-up, the imports, reading the
file, converting, writing the output, and (for amp-compiler) the output load check that ``convert``
runs by default in a child process (bytecode compiled once, by a first run that is not measured,
as an installed package's is). A cell is the median wall time over ``--runs`` processes and the
largest peak RSS among them (``ru_maxrss`` from ``os.wait4``: the largest process of the tree, the
load check's child included), also as a multiple of the input's size. Side by side, in its own cold
process per run: ``onnxconverter-common``'s ``float16.convert_float_to_float16(onnx.load(path),
keep_io_types=True)`` then ``onnx.save``; ``cp`` of the input files and ``sync`` of the copies (the
physical floor: reading and writing the bytes once, as durably as amp-compiler's output, which is
fsynced before it is renamed into place; without the sync, a copy that fits in the page cache's
dirty budget "ends" before its bytes reach the disk). Second columns: amp-compiler without the load check
(``--no-load-check``), and the in-process time of the conversion alone (``amp_compiler.convert`` and
``save`` in a warm process, imports done: the figure ``benchmarks.compare`` reports).

Models (default: all but ``2.5gb``): ``models/demo.onnx``; generated transformer graphs of 10,000 and
100,000 nodes (``benchmarks/generate.py``, written to a temporary folder, seconds); BERT-base and
GPT-2 at full size with their weights inside the file (``models/catalog.py``: a torch export of a few
minutes the first time, then read from ``AMP_MODELS_CACHE``); ``2.5gb``: a generated model of 2.5 GB
of weights in an external data file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = {"10k": 10_000, "100k": 100_000}
REAL = {"bert-base": "bert-base", "gpt2": "gpt2"}
LARGE = {"2.5gb": 2.5e9}  # weights in an external data file
DEFAULT_MODELS = ("demo", "10k", "100k", "bert-base", "gpt2")
SECTION_BEGIN = "<!-- cold-processes:begin (python -m benchmarks.cold --results) -->"
SECTION_END = "<!-- cold-processes:end -->"

_ONNXCONVERTER = """
import sys, onnx
from onnxconverter_common import float16
model = onnx.load(sys.argv[1])
onnx.save(float16.convert_float_to_float16(model, keep_io_types=True), sys.argv[2])
"""

_IN_PROCESS = """
import sys, time
import amp_compiler.onnx.convert, amp_compiler.onnx.write.result
from amp_compiler import convert
start = time.perf_counter()
convert(sys.argv[1], probe=False).save(sys.argv[2])
print(time.perf_counter() - start)
"""


@dataclasses.dataclass(frozen=True)
class Sample:
    seconds: float
    peak_rss: int  # bytes
    stdout: str


def _spawn(argv: list[str], timeout_s: float) -> Sample:
    """A fresh process: wall time, the largest process's peak RSS (``ru_maxrss``), its stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, text=True, env=_ENV)
        deadline = start + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise TimeoutError(f"{' '.join(argv[:3])}: over {timeout_s:.0f} s")
            time.sleep(0.005)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])} exited {proc.returncode}: {err.read().strip()[-400:]}")
        return Sample(seconds, usage.ru_maxrss * 1024, out.read())


#: Children compile to bytecode once, as an installed package is (PYTHONDONTWRITEBYTECODE would make
#: every process compile every module of ours again); the cache lives outside the source tree.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
_ENV.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "amp-cold-pycache"))


def _cli() -> list[str]:
    return [sys.executable, "-m", "amp_compiler", "convert", "-q", "--force"]


def tools(src: Path, out: Path) -> dict[str, list[str]]:
    """The command line of each column, converting ``src`` to ``out``."""
    files = [str(f) for f in _input_files(src)]
    return {
        "amp-compiler": [*_cli(), str(src), "-o", str(out)],
        "amp (no load check)": [*_cli(), "--no-load-check", str(src), "-o", str(out)],
        "onnxconverter-common": [sys.executable, "-c", _ONNXCONVERTER, str(src), str(out)],
        # amp-compiler fsyncs its output before renaming it into place: the copy is made as durable
        "cp": ["sh", "-c", 'cp "$@" && sync "$0"/*', str(out.parent), *files, str(out.parent)],
        "amp in-process": [sys.executable, "-c", _IN_PROCESS, str(src), str(out)],
    }


def _input_files(src: Path) -> list[Path]:
    """The model file and its external data file, if it has one beside it."""
    data = src.with_name(src.name + ".data")
    return [src, data] if data.exists() else [src]


def model_path(name: str, folder: Path) -> Path:
    """The input file of a benchmark model, generated or built on first use in a child process (this
    process stays small: each measured process starts as a copy of it, which counts in its peak RSS)."""
    if name == "demo":
        return ROOT / "models" / "demo.onnx"
    if name in GENERATED:
        path = folder / f"generated-{name}.onnx"
        code = f"import onnx; from benchmarks.generate import transformer_model as t; onnx.save(t({GENERATED[name]}), {str(path)!r})"
    elif name in LARGE:
        path = folder / name / "model.onnx"
        code = f"from benchmarks.generate import large_model as m; m({str(path)!r}, {LARGE[name]!r})"
        path.parent.mkdir(exist_ok=True)
    elif name in REAL:
        code = (
            "from models import catalog\n"
            f"entry = next(e for e in catalog.entries(None) if e.name == {REAL[name]!r})\n"
            "catalog.load(entry)\n"
            "print(sorted(catalog.CACHE_DIR.glob(f'{entry.name}.*.onnx'), key=lambda p: p.stat().st_mtime)[-1])"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
        return Path(proc.stdout.strip().splitlines()[-1])
    else:
        raise ValueError(f"unknown model {name!r} (demo, {', '.join([*GENERATED, *REAL, *LARGE])})")
    if not path.exists():
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    return path


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"


def measure(names: list[str], runs: int, timeout_s: float, log=print) -> list[str]:
    """The Markdown table of cold conversions (one row per model)."""
    header = ("| model | input | amp-compiler | peak RSS (x input) | no load check | peak RSS (x input) | "
              "onnxconverter-common | peak RSS | speed-up | cp | amp in-process |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    with tempfile.TemporaryDirectory(prefix="amp-cold-") as tmp:
        folder = Path(tmp)
        for argv in tools(model_path("demo", folder), folder / "warm.onnx").values():
            _spawn(argv, timeout_s)  # not measured: fills the bytecode cache
        for name in names:
            src = model_path(name, folder)
            size = sum(f.stat().st_size for f in _input_files(src))
            out_dir = folder / "out"
            out_dir.mkdir(exist_ok=True)
            cells: dict[str, tuple[float, int] | None] = {}
            for tool, argv in tools(src, out_dir / "out.onnx").items():
                samples = []
                for _ in range(runs):
                    try:
                        samples.append(_spawn(argv, timeout_s))
                    except (TimeoutError, RuntimeError) as exc:
                        log(f"  {name} / {tool}: {exc}")
                        break
                    finally:
                        for f in out_dir.iterdir():
                            f.unlink()
                if not samples:
                    cells[tool] = None
                    continue
                if tool == "amp in-process":
                    secs = statistics.median(float(s.stdout.split()[-1]) for s in samples)
                else:
                    secs = statistics.median(s.seconds for s in samples)
                cells[tool] = (secs, max(s.peak_rss for s in samples))
                log(f"  {name} / {tool}: {secs:.2f} s, {_mb(cells[tool][1])}")

            rows.append(_row(name, size, cells))
    return rows


def _row(name: str, size: int, cells: dict[str, tuple[float, int] | None]) -> str:
    def t(tool: str) -> str:
        c = cells[tool]
        return "failed" if c is None else f"{c[0]:.2f} s"

    def m(tool: str, ratio: bool = False) -> str:
        c = cells[tool]
        return "" if c is None else _mb(c[1]) + (f" ({c[1] / size:.2f}x)" if ratio else "")

    amp, peer = cells["amp-compiler"], cells["onnxconverter-common"]
    speedup = f"{peer[0] / amp[0]:.1f}x" if amp and peer else ""
    return (f"| {name} | {_mb(size)} | {t('amp-compiler')} | {m('amp-compiler', True)} | "
            f"{t('amp (no load check)')} | {m('amp (no load check)', True)} | "
            f"{t('onnxconverter-common')} | {m('onnxconverter-common')} | {speedup} | {t('cp')} | "
            f"{t('amp in-process')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="cold processes per (tool, model); the median is reported")
    ap.add_argument("--models", default=None,
                    help="comma-separated, of demo,10k,100k,bert-base,gpt2,2.5gb (default: all but 2.5gb)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per process")
    ap.add_argument("--results", type=Path, default=None,
                    help="also write the table into this file's cold-process section (benchmarks/RESULTS.md)")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else list(DEFAULT_MODELS)
    load_before = os.getloadavg()[0]
    rows = measure(names, args.runs, args.timeout, log=lambda s: print(s, file=sys.stderr, flush=True))
    conditions = _conditions(load_before, os.getloadavg()[0])
    print("\n".join([*rows, "", conditions]))
    if args.results is not None:
        command = "python -m benchmarks.cold " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(args.results, section(command.strip(), conditions, rows))
    return 0


#: What the table's cells are, for the results file.
MEASURED = (
    "Each cell is the median wall time of fresh processes, as a user runs them, and the "
    "largest peak RSS among them: the largest process of the tree, the load check's onnxruntime child "
    "included, also as a multiple of the input's bytes. \"no load check\" adds `--no-load-check`; "
    "onnxconverter-common is `onnx.load`, `convert_float_to_float16(keep_io_types=True)`, `onnx.save` in a "
    "process of its own (speed-up: its time over amp-compiler's); `cp` copies the input files and syncs the "
    "copies (reading and writing their bytes once, as durably as amp-compiler's fsynced output: the physical "
    "floor); \"amp in-process\" is `convert(path, probe=False).save(out)` in a "
    "warm process, imports done (the figure `benchmarks.compare` reports)."
)


def section(command: str, conditions: str, rows: list[str]) -> str:
    """The results file's section: the command, the machine, what is measured, the table."""
    return "\n".join([f"## Cold processes\n\nCommand: `{command}`. {conditions}\n\n{MEASURED}\n", *rows])


def _conditions(load_before: float, load_after: float) -> str:
    """The machine and its load (other work on it moves the numbers), and what was measured."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return (
        f"Machine: {os.cpu_count()} cores, load average {load_before:.1f} before and {load_after:.1f} after; "
        f"python {sys.version.split()[0]}, amp-compiler commit {commit.stdout.strip() or 'unknown'}."
    )


def write_section(path: Path, text: str, begin: str = SECTION_BEGIN, end: str = SECTION_END) -> None:
    """Put ``text`` between the markers ``begin`` and ``end`` (this benchmark's by default) in
    ``path``: in place of the section it has, else after its first paragraphs (before the first
    ``## `` heading that no other benchmark's markers enclose)."""
    old = path.read_text() if path.exists() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        path.write_text(head + block + "\n" + rest.split(end, 1)[1].lstrip("\n"))
    elif (at := _free_heading(old)) is not None:
        path.write_text(old[: at + 1] + block + "\n" + old[at + 1 :])
    else:
        path.write_text(old + ("\n" if old else "") + block)


def _free_heading(text: str) -> int | None:
    """The position of the newline before the first ``## `` heading outside every marked section
    (``<!-- name:begin ...`` ... ``<!-- name:end -->``), or None."""
    at = text.find("\n## ")
    while at >= 0:
        before = text[:at]
        if before.count(":begin") == before.count(":end -->"):
            return at
        at = text.find("\n## ", at + 1)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
