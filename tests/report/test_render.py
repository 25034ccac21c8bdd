"""Report renderers: terminal table, JSON, CSV and self-contained HTML, on hand-built reports."""

from __future__ import annotations

import csv
import dataclasses
import html.parser
import io
import json
import re
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from amp_compiler.report import NodeError, NodeReport, OutputAccuracy, PrecisionReport, Summary, TensorRange
from amp_compiler.report.csv_render import csv_columns
from amp_compiler.report.html_plots import COLOURS, MAX_MARKS
from amp_compiler.report.render import FORMATS, render
from amp_compiler.report.terminal import fit_path, fit_rule, strip_ansi

XSS = "<script>alert(1)</script>"
LONG = "/encoder/layer.11/attention/self/very_long_projection_name/query/MatMul_with_a_suffix"


def _node(name, op, precision, rule, reason, flops=None, nbytes=None, tc=None, casts_in=(), casts_out=(),
          graph="main_graph", rng=None, err=None):
    dt = "float32" if precision in ("fp32", "none") else precision.replace("fp", "float").replace("bf", "bfloat")
    return NodeReport(
        graph=graph, name=name, op_type=op, domain="", precision=precision, rule=rule, reason=reason,
        input_dtypes=[dt, dt], output_dtypes=[dt], flops=flops, bytes=nbytes, tensor_core=tc,
        tensor_core_note="K=768, N=768 multiples of 8" if tc else "", casts_in=list(casts_in),
        casts_out=list(casts_out),
        range=TensorRange(*rng, count=4096) if rng else None,
        error=NodeError(*err) if err else None,
    )


def _report(nodes, *, calibrated, target="fp16", model="tiny.onnx", warnings=()):
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.precision] = counts.get(n.precision, 0) + 1
    total = sum(n.flops or 0 for n in nodes)
    low = sum(n.flops or 0 for n in nodes if n.precision == target)
    accuracy = [
        OutputAccuracy("logits", cosine=0.9999876, max_abs_error=3.1e-3, value_range=14.1, finite=True),
        OutputAccuracy("pooled", cosine=0.99999, max_abs_error=1.5e-3, value_range=15.0, finite=True),
    ] if calibrated else []
    summary = Summary(
        target=target, provider="cuda", nodes=len(nodes), nodes_by_precision=counts, flops_total=total,
        flops_low=low, casts=2, cast_bytes=12_345, size_before=820_000, size_after=540_000,
        accuracy=accuracy, calibration_samples=8 if calibrated else 0, model_runs=5 if calibrated else 0,
        pinned_by_tolerance=1 if calibrated else 0,
    )
    return PrecisionReport(model=model, summary=summary, nodes=list(nodes), warnings=list(warnings))


def small_report(calibrated: bool = True) -> PrecisionReport:
    """Five nodes: a MatMul, a Softmax kept in FP32 with casts, an Add, a Shape, and one with a hostile name."""
    c = calibrated
    nodes = [
        _node("mm_q", "MatMul", "fp16", "policy.low", "LOW: MatMul runs on Tensor Cores", 150_994_944,
              1_572_864, True, rng=(-3.5, 4.25, 4.25, 0.001, 0.02) if c else None,
              err=(4e-4, 2e-3, 4e-4) if c else None),
        _node("softmax", "Softmax", "fp32", "policy.high.range", "HIGH: Softmax is range-sensitive", 983_040,
              1_572_864, None, ["softmax_in_cast"], ["softmax_out_cast"],
              rng=(0.0, 1.0, 1.0, 0.0, 0.0) if c else None, err=(1e-5, 1e-6, -3.9e-4) if c else None),
        _node("mm_big", "MatMul", "fp32", "calibration.overflow", "HIGH: output absmax 1.2e5 exceeds FP16 range",
              603_979_776, 5_000_000, False, rng=(-1.2e5, 9e4, 1.2e5, 0.0, 0.0) if c else None,
              err=(2e-6, 0.2, 1e-6) if c else None),
        _node("add_bias", "Add", "fp16", "paint.between-low", "FOLLOW: between low-precision ops", 98_304,
              400_000, rng=(-8.0, 8.0, 8.0, 0.0, 0.0) if c else None, err=(6e-3, 0.05, 5.6e-3) if c else None),
        _node(XSS, "Shape", "none", "policy.nonfloat", "NONFLOAT: integer output", None, 64),
    ]
    return _report(nodes, calibrated=c)


def large_report(n: int = 5000, calibrated: bool = True) -> PrecisionReport:
    rnd = np.random.default_rng(0)
    kinds = [("Conv", "fp16", "policy.low", True), ("Relu", "fp16", "policy.pass", None),
             ("Softmax", "fp32", "policy.high.range", None), ("Reshape", "none", "policy.nonfloat", None),
             ("Concat", "mixed", "paint.pass-spread", None)]
    nodes = []
    for i in range(n):
        op, prec, rule, tc = kinds[int(rnd.integers(len(kinds)))]
        rel = float(10 ** rnd.uniform(-6, -2))
        nodes.append(_node(
            f"/backbone/stage{i // 500}/block{i // 20}/{op.lower()}_{i}", op, prec, rule, f"{rule}: why",
            int(10 ** rnd.uniform(2, 9)), int(10 ** rnd.uniform(2, 7)), tc,
            graph="main_graph" if i < n - 20 else "loop_body",
            rng=(-1.0, 2.0, 2.0, 0.0, 0.0) if calibrated and prec != "none" else None,
            err=(rel, rel, rel / 2) if calibrated and prec != "none" else None,
        ))
    return _report(nodes, calibrated=calibrated, model="big.onnx")


REPORTS = {
    "calibrated": lambda: small_report(True),
    "static": lambda: small_report(False),
    "empty": lambda: _report([], calibrated=False, model=""),
}


# ---------------------------------------------------------------------------------------------- JSON
@pytest.mark.parametrize("kind", sorted(REPORTS))
def test_json_round_trip(kind):
    report = REPORTS[kind]()
    text = render(report, "json")
    data = json.loads(text)
    assert data["schema_version"] == report.schema_version
    assert PrecisionReport.from_dict(data) == report


def test_unknown_format_or_sort_is_an_error():
    with pytest.raises(ValueError, match="format"):
        render(small_report(), "yaml")
    with pytest.raises(ValueError, match="sort"):
        render(small_report(), "terminal", sort="size")
    assert set(FORMATS) == {"terminal", "json", "csv", "html"}


# ---------------------------------------------------------------------------------------------- terminal
def _rows(text: str) -> list[str]:
    """Node rows of a terminal table: the lines between the two dashed rules, without detail lines."""
    lines = text.splitlines()
    rules = [i for i, ln in enumerate(lines) if ln and set(ln) == {"-"}]
    return [ln for ln in lines[rules[0] + 1 : rules[1]] if not ln.startswith("    ")]


def _names(text: str) -> list[str]:
    return [ln.split()[0] for ln in _rows(text)]


def test_terminal_summary_line_first():
    text = render(small_report(), "terminal")
    first = text.splitlines()[0]
    assert first.startswith("tiny.onnx: fp16 on cuda, 2/5 nodes fp16, ")
    assert "% of FLOPs low precision" in first
    head = " ".join(text.splitlines()[:4])
    for needle in ("2 casts (12.3 kB)", "820 kB -> 540 kB", "worst output cosine 0.999988", "8 calibration samples"):
        assert needle in head


@pytest.mark.parametrize("kind", ["calibrated", "static", "empty", "long"])
@pytest.mark.parametrize("verbose", [False, True])
@pytest.mark.parametrize("color", [False, True])
def test_terminal_fits_80_columns(kind, verbose, color):
    if kind == "long":
        report = small_report()
        report.nodes[0].name = LONG
        report.nodes[1].op_type = "SkipSimplifiedLayerNormalization"
        report.nodes[1].reason = "HIGH: " + "a very long reason that goes on " * 8
        report.nodes[1].casts_in = [LONG + "_cast"] * 3
        report.warnings = ["w" * 200, "a warning with spaces " * 10]
        report.model = "some/deep/path/" * 6 + "model.onnx"
    else:
        report = REPORTS[kind]()
    text = render(report, "terminal", width=80, verbose=verbose, color=color)
    for line in text.splitlines():
        assert len(strip_ansi(line)) <= 80, line
    assert ("\x1b[" in text) == color


def test_terminal_columns_and_cells():
    text = render(small_report(), "terminal")
    lines = text.splitlines()
    head = next(ln for ln in lines if ln.startswith("node "))
    for col in ("op", "prec", "rule", "FLOPs", "TC", "casts", "err", "absmax"):
        assert col in head.split()
    row = {ln.split()[0]: ln for ln in _rows(text)}
    assert row["mm_big"].split()[1:5] == ["MatMul", "fp32", "c.overflow", "604M"]  # abbreviated at 80
    wide = {ln.split()[0]: ln for ln in _rows(render(small_report(), "terminal", width=120))}
    assert wide["mm_big"].split()[1:5] == ["MatMul", "fp32", "calibration.overflow", "604M"]
    assert " yes " in row["mm_q"] and " no " in row["mm_big"]
    assert " 1/1 " in row["softmax"]
    assert "1.2e5" in row["mm_big"]  # absmax
    static = render(small_report(False), "terminal")
    assert "err" not in next(ln for ln in static.splitlines() if ln.startswith("node ")).split()


def test_terminal_sorting():
    report = small_report()
    assert _names(render(report, "terminal", sort="cost")) == ["mm_big", "mm_q", "softmax", "add_bias", "<1/script>"]
    # error: the error a node adds first; nodes without error data last
    by_error = _names(render(report, "terminal", sort="error", width=120))
    assert by_error == ["add_bias", "mm_q", "mm_big", "softmax", XSS]
    assert _names(render(report, "terminal", sort="name", width=120)) == sorted(n.name for n in report.nodes)
    assert _names(render(report, "terminal", sort="graph", width=120)) == [n.name for n in report.nodes]


def test_terminal_error_sort_puts_nan_first():
    report = small_report()
    report.nodes[2].error = NodeError(float("nan"), float("nan"), float("nan"))
    assert _names(render(report, "terminal", sort="error"))[0] == "mm_big"


def test_terminal_cost_ties_broken_by_bytes():
    report = small_report()
    report.nodes[0].flops = report.nodes[2].flops
    report.nodes[0].bytes = report.nodes[2].bytes + 1
    assert _names(render(report, "terminal", sort="cost"))[:2] == ["mm_q", "mm_big"]


def test_terminal_filters():
    report = small_report()
    assert _names(render(report, "terminal", op="matmul")) == ["mm_big", "mm_q"]
    assert _names(render(report, "terminal", op=["Softmax", "Add"], sort="graph")) == ["softmax", "add_bias"]
    assert _names(render(report, "terminal", op="Softmax,Add", sort="graph")) == ["softmax", "add_bias"]
    assert _names(render(report, "terminal", precision="fp32")) == ["mm_big", "softmax"]
    assert _names(render(report, "terminal", precision="low", sort="graph")) == ["mm_q", "add_bias"]
    assert _names(render(report, "terminal", op="MatMul", precision="fp16")) == ["mm_q"]
    assert _rows(render(report, "terminal", op="Conv")) == []
    text = render(report, "terminal", op="MatMul", limit=1)
    assert _names(text) == ["mm_big"]
    assert "1 of 5 nodes shown; 1 more match; op MatMul; sorted by cost" in text
    # The summary still describes the whole model.
    assert text.splitlines()[0] == render(report, "terminal").splitlines()[0]


def test_terminal_verbose_shows_reasons_indented():
    report = small_report()
    plain = render(report, "terminal")
    assert "range-sensitive" not in plain
    lines = render(report, "terminal", verbose=True, sort="graph").splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("softmax "))
    assert lines[i + 1] == "    policy.high.range: HIGH: Softmax is range-sensitive"
    details = " ".join(lines[i + 1 : i + 5])
    assert "casts in: softmax_in_cast" in details and "casts out: softmax_out_cast" in details


def test_terminal_colour_only_when_asked():
    report = small_report()
    coloured = render(report, "terminal", color=True)
    assert "\x1b[32m" in coloured  # fp16 in green
    assert strip_ansi(coloured).splitlines()[0] == render(report, "terminal").splitlines()[0]


def test_terminal_strips_control_characters_from_model_strings():
    report = small_report()
    report.nodes[0].name = "evil\x1b[2J\nname"
    text = render(report, "terminal", verbose=True)
    assert "\x1b" not in text and "evil?[2J?name" in text


def test_name_abbreviation_keeps_layer_numbers_and_leaf():
    name = "/encoder/layer.0/attention/self/query/MatMul"
    assert fit_path(name, 60) == name
    short = fit_path(name, 22)
    assert short == "/e/l0/a/s/query/MatMul"
    assert fit_path(name, 12).endswith("MatMul") and len(fit_path(name, 12)) <= 12
    assert len(fit_path("x" * 50, 20)) == 20
    assert fit_rule("policy.high.arithmetic", 14) == "p.h.arithmetic"


def test_terminal_wider_width_keeps_full_names():
    report = small_report()
    report.nodes[0].name = LONG
    assert LONG in render(report, "terminal", width=200)
    assert LONG not in render(report, "terminal", width=80)


def test_terminal_large_report():
    report = large_report(5000)
    text = render(report, "terminal", sort="error", limit=20)
    assert len(_rows(text)) == 20
    assert all(len(ln) <= 80 for ln in text.splitlines())


def test_non_finite_values_render_in_every_format():
    report = small_report()
    report.summary.accuracy[0] = OutputAccuracy("logits", float("nan"), float("inf"), 0.0, False)  # as checks.compare
    report.nodes[0].error = NodeError(float("nan"), float("inf"), float("nan"))
    report.nodes[0].range = TensorRange(float("-inf"), float("inf"), float("inf"), 0.0, 0.0, 10)
    text = render(report, "terminal", verbose=True)
    assert "NON-FINITE output logits" in text.splitlines()[0] + text.splitlines()[1]
    assert "worst output cosine nan" in text.replace("\n  ", " ")
    assert all(len(ln) <= 80 for ln in text.splitlines())
    page = render(report, "html")
    assert "non-finite values in logits" in page and "non-finite" in page
    assert len(list(csv.DictReader(io.StringIO(render(report, "csv"))))) == 5
    assert json.loads(render(report, "json"))["summary"]["accuracy"][0]["finite"] is False


# ---------------------------------------------------------------------------------------------- CSV
@pytest.mark.parametrize("kind", sorted(REPORTS))
def test_csv_one_row_per_node(kind):
    report = REPORTS[kind]()
    text = render(report, "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(report.nodes)
    assert text.splitlines()[0].split(",") == csv_columns()
    for col in ("name", "op_type", "precision", "rule", "reason", "flops", "bytes", "tensor_core", "casts_in",
                "casts_out", "range_min", "range_max", "range_absmax", "underflow_share", "error_rel_l2",
                "error_max_abs", "error_added"):
        assert col in csv_columns()
    # Every NodeReport field is there (nested ones flattened).
    flat = {f.name for f in dataclasses.fields(NodeReport)} - {"range", "error"}
    assert flat <= set(csv_columns())


def test_csv_values():
    report = small_report()
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO(render(report, "csv", sort="graph")))}
    sm = rows["softmax"]
    assert sm["casts_in"] == "softmax_in_cast" and sm["casts_out"] == "softmax_out_cast"
    assert sm["input_dtypes"] == "float32;float32"
    assert float(sm["error_added"]) == -3.9e-4 and float(sm["range_absmax"]) == 1.0
    assert rows["mm_q"]["tensor_core"] == "true" and rows["mm_big"]["tensor_core"] == "false"
    assert rows["softmax"]["tensor_core"] == "" and rows[XSS]["flops"] == "" and rows[XSS]["error_rel_l2"] == ""
    assert int(rows["mm_big"]["flops"]) == 603_979_776 and rows["mm_big"]["index"] == "2"
    only = list(csv.DictReader(io.StringIO(render(report, "csv", op="MatMul"))))
    assert [r["name"] for r in only] == ["mm_big", "mm_q"]


# ---------------------------------------------------------------------------------------------- HTML
class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: dict[str, int] = {}
        self.ids: set[str] = set()
        self.text: list[str] = []
        self.refs: list[str] = []
        self.stack: list[str] = []
        self.rows = 0

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for k in ("src", "href", "xlink:href", "action"):
            if k in a:
                self.refs.append(a[k])
        if tag == "tr" and "tbody" in self.stack:
            self.rows += 1
        if tag not in ("meta", "input", "br", "wbr", "rect", "circle", "line", "link", "img"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.stack:
            while self.stack.pop() != tag:
                pass

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


def test_html_self_contained_with_summary_plots_and_table():
    report = small_report()
    text = render(report, "html")
    page = _parse(text)
    assert text.startswith("<!DOCTYPE html>") and page.stack == []
    assert "http://" not in text and "https://" not in text
    assert all(r.startswith("#") and r[1:] in page.ids for r in page.refs)  # links within the page only
    assert "link" not in page.tags and "img" not in page.tags
    assert {"plot-share", "plot-ops", "plot-graph", "nodes"} <= page.ids
    assert page.tags["svg"] >= 3 and page.tags["script"] == 1
    assert page.rows == len(report.nodes)
    words = " ".join(" ".join(page.text).split())
    share = f"{report.summary.low_flops_share * 100:.1f}%"
    for needle in (share, "2 / 5", "12.3 kB", "820 → 540 kB", "0.999988", "3.1e-3", "fp16", "cuda",
                   "Calibration", "8 samples", "Per-layer error along the graph", "mm_big", "calibration.overflow"):
        assert needle in words, needle
    assert "relative L2 error vs FP32" in text  # y axis label
    assert "node index in graph order" in text  # x axis label


def test_html_says_each_shared_reason_once_and_what_its_rows_are():
    report = small_report()
    report.nodes.append(dataclasses.replace(report.nodes[-1], name="cast_in", rule="lowering.cast", inserted=True,
                                            reason="Cast inserted to feed x"))
    for k, n in enumerate(report.nodes[:3]):  # three rows, one rule, one reason
        report.nodes[k] = dataclasses.replace(n, rule="policy.low", reason="a long shared reason")
    text = render(report, "html")
    assert text.count("a long shared reason") == 1  # under its rule, not in every row
    assert text.count("Cast inserted to feed x") == 1 and 'id="rule-policy.low"' in text
    assert text.count('href="#rule-policy.low"') == 3
    rows = len(report.nodes)
    assert f"{rows} of {rows} rows: {rows - 1} nodes of the model + 1 inserted Cast;" in text
    assert f"({rows} rows: {rows - 1} nodes of the model + 1 inserted Cast)" in text  # the plot's axis
    # On a phone the rows are blocks whose numbers sit behind a checkbox, each labelled.
    assert "@media (max-width:700px)" in text and 'id="shownums"' in text
    assert 'data-label="FLOPs" data-num="1"' in text and 'data-label="node"' in text


def test_html_escapes_model_strings():
    report = small_report()
    report.warnings = ['"><img src=x onerror=alert(2)>']
    report.nodes[1].casts_in = ['x" onmouseover="alert(3)']
    text = render(report, "html")
    assert XSS not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    page = _parse(text)
    assert page.tags["script"] == 1 and "img" not in page.tags
    assert 'onmouseover="alert' not in text
    assert any(XSS in t for t in page.text)  # shown as text


def test_html_without_calibration_plots_flops_along_the_graph():
    text = render(small_report(False), "html")
    page = _parse(text)
    assert "plot-graph" in page.ids
    assert "FLOPs along the graph" in text and "--calibration-data" in text
    assert "Per-layer error" in text  # says what is missing
    assert "http://" not in text and "https://" not in text


def test_html_empty_report():
    page = _parse(render(REPORTS["empty"](), "html"))
    assert page.rows == 0 and "plot-share" in page.ids


@pytest.mark.parametrize("calibrated", [True, False])
def test_html_5000_nodes_stays_bounded(calibrated):
    report = large_report(5000, calibrated)
    text = render(report, "html")
    page = _parse(text)
    assert page.rows == 5000
    svgs = re.findall(r"<svg.*?</svg>", text, flags=re.S)
    plots = "".join(svgs)
    assert plots.count("<text") < 120  # no per-node labels
    assert plots.count("<circle") + plots.count("<rect") < 2 * MAX_MARKS + 100
    assert len(text) < 8_000_000


def test_html_sort_and_filters_select_table_rows():
    report = small_report()
    page = _parse(render(report, "html", op="MatMul"))
    assert page.rows == 2
    text = render(report, "html", sort="graph")
    assert text.index(">mm_q<") < text.index(">softmax<") < text.index(">mm_big<")


# ---------------------------------------------------------------------------------------------- Chromium
def _read_png(path) -> np.ndarray:
    """A minimal PNG decoder (8-bit RGB/RGBA, not interlaced): header, IDAT, zlib, scanline filters."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    w, h, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    bpp = 3 if colour_type == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), np.int32)
    prev = np.zeros(w * bpp, np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 1:
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) % 256
        elif f == 2:
            cur = (line + prev) % 256
        else:
            cur = np.zeros_like(line)
            lst, up = line.tolist(), prev.tolist()
            c = [0] * (w * bpp)
            for x in range(w * bpp):
                a = c[x - bpp] if x >= bpp else 0
                b = up[x]
                if f == 3:
                    c[x] = (lst[x] + (a + b) // 2) & 255
                else:
                    d = up[x - bpp] if x >= bpp else 0
                    p = a + b - d
                    pa, pb, pd = abs(p - a), abs(p - b), abs(p - d)
                    c[x] = (lst[x] + (a if pa <= pb and pa <= pd else b if pb <= pd else d)) & 255
            cur = np.array(c, np.int32)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3].astype(np.uint8)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _hex(colour: str) -> np.ndarray:
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)


def test_html_renders_in_headless_chromium(tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    page = tmp_path / "report.html"
    page.write_text(render(small_report(), "html"), encoding="utf-8")
    png = tmp_path / "report.png"
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    subprocess.run(
        flags + [f"--screenshot={png}", "--window-size=1280,2000", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    assert png.exists() and png.stat().st_size > 20_000
    img = _read_png(png)
    assert img.shape[:2] == (2000, 1280)
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 50  # not a single colour: text, cards, plots
    # The plots drew: fp16 and fp32 fills cover real areas, within the first screen.
    for p in ("fp16", "fp32"):
        assert (img == _hex(COLOURS[p])).all(axis=-1).sum() > 500, p
    dom = subprocess.run(
        flags + ["--dump-dom", page.as_uri()], capture_output=True, timeout=120, check=True, text=True
    ).stdout
    for plot in ("plot-share", "plot-ops", "plot-graph"):
        assert re.search(rf'<svg[^>]*id="{plot}"', dom), plot
    assert dom.count("<circle") >= 4 and "<rect" in dom
    assert 'class="js"' in dom  # the inline script ran (sorting, filter)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom


def test_terminal_verbose_says_what_underflow_moves():
    report = small_report()
    assert "of its L2 norm" not in render(report, "terminal", verbose=True, width=200)
    ranged = next(n for n in report.nodes if n.range is not None)
    ranged.range.underflow_error = 3e-6
    text = render(report, "terminal", verbose=True, width=200)
    assert "underflow 0.1%" in text and "(moving it by 3" in text and "of its L2 norm)" in text
