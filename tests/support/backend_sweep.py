"""Sweep amp_compiler.convert over the ONNX backend node test cases.

Every case is one small model (usually a single node) with reference inputs and outputs
(``model.onnx`` plus ``test_data_set_*/input_*.pb`` and ``output_*.pb``). For each case:

1. ``skip-nontensor``: an input or output of the graph is a sequence, map or optional (this sweep
   only feeds and compares plain tensors).
2. ``skip-nofloat``: no float32 graph input, float32 initializer or float32 ``Constant`` (also
   looked for inside subgraphs): there is nothing for the converter to lower.
3. ``skip-invalid-fp32``: the FP32 model itself fails the checks of steps 6/7 (e.g. onnx 1.23's
   own MeanVarianceNormalization function body fails the full checker): the converter cannot be
   held to them.
4. ``skip-ort-fp32`` (fp16 only): onnxruntime CPU cannot load or run the FP32 model (IR version or
   opset newer than it supports, missing kernels), or its FP32 outputs do not match the reference
   under the rule below (random ops, ORT deviations): there is nothing to compare the converted
   model against. Steps 5-7 still run on these cases (a failure there is reported as such); only
   running and comparing are skipped.
5. ``convert-error``: ``amp_compiler.convert`` raised.
6. ``invalid``: ``onnx.checker.check_model(converted, full_check=True)`` raised.
7. ``shape-inference``: ``onnx.shape_inference.infer_shapes(converted, check_type=True,
   strict_mode=True)`` raised.
8. ``ort-error`` (fp16 only): onnxruntime CPU cannot load or run the converted model.
9. Outputs are compared with the reference outputs (fp16 only):

   * non-float outputs must be identical (same dtype, shape and values);
   * float outputs (float16/32/64, bfloat16, float8, complex) must have the reference dtype and
     shape and satisfy ``np.allclose(got, ref, rtol=1e-2, atol=1e-2 * max(1, max|ref|),
     equal_nan=True)`` where ``max|ref|`` is taken over the finite reference values of that
     output; infinities must match exactly.

   ``pass-low``: all outputs match and at least one decision is low precision (fp16/bf16/mixed).
   ``pass-fp32``: all outputs match and every decision (subgraphs included) is ``fp32`` or
   ``none``: the policy kept the case in FP32.
   ``mismatch``: an output does not match (whatever the decisions: the FP32 model matched the
   reference in step 4, so a mismatch is always caused by the conversion).

With ``target="bf16"`` steps 4, 8 and 9 are not run: onnxruntime's CPU provider lacks BF16 kernels
for most ops, so a bf16 ``pass-low``/``pass-fp32`` means "converts, passes the full checker and
strict shape inference" only.

The onnx wheel does not always ship ``onnx/backend/test/data/node``; :func:`node_case_dirs`
then materialises the cases from ``onnx.backend.test.case.node`` (the same generator onnx uses to
write that folder) into a cache folder once.

    python tests/support/backend_sweep.py [--target fp16|bf16] [-k SUBSTRING] [-v]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx.checker
import onnx.shape_inference
from onnx import numpy_helper

PASS_STATUSES = frozenset({"pass-low", "pass-fp32"})
SKIP_STATUSES = frozenset(
    {"skip-nontensor", "skip-nofloat", "skip-invalid-fp32", "skip-ort-fp32"}
)
FAIL_STATUSES = frozenset({"convert-error", "invalid", "shape-inference", "ort-error", "mismatch"})

RTOL = 1e-2
ATOL = 1e-2  # scaled by max(1, max|ref|) per output

_LOW = frozenset({"fp16", "bf16", "mixed"})


@dataclasses.dataclass
class CaseResult:
    name: str
    status: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAIL_STATUSES


# --------------------------------------------------------------------------------------------
# Locating / materialising the node cases


def _installed_node_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


def _cache_dir() -> Path:
    env = os.environ.get("AMP_ONNX_NODE_CASES")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"amp-compiler-onnx-node-cases-{onnx.__version__}"


def _write_value(path: Path, value, value_info: onnx.ValueInfoProto) -> None:
    """Serialise one test value the way onnx's ``backend-test-tools generate-data`` does."""
    t = value_info.type
    if t.HasField("map_type"):
        proto = numpy_helper.from_dict(value, value_info.name)
    elif t.HasField("sequence_type"):
        proto = numpy_helper.from_list(value, value_info.name)
    elif t.HasField("optional_type"):
        proto = numpy_helper.from_optional(value, value_info.name)
    elif isinstance(value, onnx.TensorProto):
        proto = value
    else:
        proto = numpy_helper.from_array(value, value_info.name)
    path.write_bytes(proto.SerializeToString())


def materialize_node_cases(dest: Path) -> None:
    """Write every node test case of the installed onnx to ``dest/<case name>/``."""
    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = node_cases.collect_testcases(None)
    dest.mkdir(parents=True, exist_ok=True)
    for case in cases:
        if case.model is None or not case.data_sets:
            continue
        out = dest / case.name
        out.mkdir(exist_ok=True)
        (out / "model.onnx").write_bytes(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = out / f"test_data_set_{i}"
            ds.mkdir(exist_ok=True)
            for j, value in enumerate(inputs):
                _write_value(ds / f"input_{j}.pb", value, case.model.graph.input[j])
            for j, value in enumerate(outputs):
                _write_value(ds / f"output_{j}.pb", value, case.model.graph.output[j])


def node_case_dirs() -> list[Path]:
    """All node case folders, sorted by name.

    Uses ``onnx/backend/test/data/node`` when the installed onnx ships it; otherwise the cases are
    generated once into ``$AMP_ONNX_NODE_CASES`` or ``<tmp>/amp-compiler-onnx-node-cases-<onnx
    version>`` (written to a scratch folder and renamed into place, so concurrent runs are safe).
    """
    root = _installed_node_dir()
    if not (root.is_dir() and any(root.glob("*/model.onnx"))):
        root = _cache_dir()
        if not (root / ".complete").exists():
            root.parent.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
            try:
                materialize_node_cases(scratch)
                (scratch / ".complete").write_text(onnx.__version__)
                if root.exists() and not (root / ".complete").exists():
                    shutil.rmtree(root, ignore_errors=True)  # an interrupted earlier run
                try:
                    scratch.rename(root)
                except OSError:  # another process won the race
                    if not (root / ".complete").exists():
                        raise
            finally:
                if scratch.exists():
                    shutil.rmtree(scratch, ignore_errors=True)
    return sorted((p.parent for p in root.glob("*/model.onnx")), key=lambda p: p.name)


# --------------------------------------------------------------------------------------------
# One case


class _Skip(Exception):
    def __init__(self, status: str, detail: str = ""):
        super().__init__(detail)
        self.status = status
        self.detail = detail



def _has_float32(model: onnx.ModelProto) -> bool:
    from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
    from amp_compiler.policy.schemas import is_onnx_domain

    FLOAT = onnx.TensorProto.FLOAT
    for vi in model.graph.input:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == FLOAT:
            return True
    for g in iter_proto_graphs(model.graph):
        if any(init.data_type == FLOAT for init in g.initializer):
            return True
        for node in g.node:
            if node.op_type != "Constant" or not is_onnx_domain(node.domain):
                continue
            for attr in node.attribute:
                if attr.name == "value" and attr.t.data_type == FLOAT:
                    return True
                if attr.name in ("value_float", "value_floats"):
                    return True
    return False


def _load_data_sets(case_dir: Path, model: onnx.ModelProto):
    """[(feeds, reference outputs)] per test_data_set; raises _Skip for non-tensor values."""
    for vi in list(model.graph.input) + list(model.graph.output):
        if not vi.type.HasField("tensor_type"):
            kind = vi.type.WhichOneof("value")
            raise _Skip("skip-nontensor", f"{vi.name!r} is a {kind}")
    sets = []
    for ds in sorted(case_dir.glob("test_data_set_*"), key=lambda p: int(p.name.rsplit("_", 1)[1])):
        feeds = {}
        n_in = len(list(ds.glob("input_*.pb")))
        for j in range(n_in):
            t = onnx.TensorProto()
            t.ParseFromString((ds / f"input_{j}.pb").read_bytes())
            feeds[model.graph.input[j].name] = numpy_helper.to_array(t)
        refs = []
        n_out = len(list(ds.glob("output_*.pb")))
        for j in range(n_out):
            t = onnx.TensorProto()
            t.ParseFromString((ds / f"output_{j}.pb").read_bytes())
            refs.append(numpy_helper.to_array(t))
        sets.append((feeds, refs))
    return sets


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat16", "float8", "float4"))


def compare(got, ref: np.ndarray) -> str | None:
    """None when ``got`` matches ``ref`` under the module's rule, else what differs."""
    got = np.asarray(got)
    if got.shape != ref.shape:
        return f"shape {got.shape} != reference {ref.shape}"
    if ref.dtype.kind in "OUS" or got.dtype.kind in "OUS":
        return None if np.array_equal(got.astype(object), ref.astype(object)) else "values differ"
    if got.dtype != ref.dtype:
        return f"dtype {got.dtype} != reference {ref.dtype}"
    if not _is_float(ref.dtype):
        if np.array_equal(got, ref):
            return None
        bad = int(np.count_nonzero(got != ref))
        return f"{bad}/{ref.size} values differ"
    cplx = ref.dtype.kind == "c"
    g = got.astype(np.complex128 if cplx else np.float64)
    r = ref.astype(np.complex128 if cplx else np.float64)
    finite = np.isfinite(r)
    scale = max(1.0, float(np.max(np.abs(r[finite]))) if finite.any() else 1.0)
    atol = ATOL * scale
    if np.allclose(g, r, rtol=RTOL, atol=atol, equal_nan=True):
        return None
    with np.errstate(invalid="ignore"):
        err = np.abs(g - r)
        bad = ~np.isclose(g, r, rtol=RTOL, atol=atol, equal_nan=True)
    worst = float(np.nanmax(np.where(bad, err, 0))) if bad.any() else float("nan")
    return f"{int(bad.sum())}/{ref.size} values off (max abs err {worst:.4g}, atol {atol:.3g})"


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run_all(model: onnx.ModelProto, data_sets) -> list[list]:
    sess = _session(model)
    names = [o.name for o in model.graph.output]
    return [sess.run(names[: len(refs)] or None, feeds) for feeds, refs in data_sets]


def _compare_all(results, data_sets, model: onnx.ModelProto) -> str | None:
    for k, (outs, (_, refs)) in enumerate(zip(results, data_sets)):
        for j, (got, ref) in enumerate(zip(outs, refs)):
            why = compare(got, ref)
            if why is not None:
                return f"data set {k}, output {model.graph.output[j].name!r}: {why}"
    return None


def _static_check(model: onnx.ModelProto) -> tuple[str, str] | None:
    """("invalid" | "shape-inference", error) when ``model`` fails the full checker or strict
    shape inference, else None."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001
        return "invalid", _one_line(exc)
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as exc:  # noqa: BLE001
        return "shape-inference", _one_line(exc)
    return None


def _one_line(exc: BaseException, limit: int = 400) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("==>")]
    return " | ".join(lines)[:limit]


def run_case(case_dir: Path, target: str = "fp16") -> CaseResult:
    """Convert, check, run and compare one case (see the module docstring)."""
    from amp_compiler import convert

    name = case_dir.name
    run = target == "fp16"
    not_run = None  # why the models are not run (the case is then checked statically only)
    try:
        model = onnx.load(str(case_dir / "model.onnx"))
        data_sets = _load_data_sets(case_dir, model)
        if not _has_float32(model):
            raise _Skip("skip-nofloat")
        why = _static_check(model)
        if why is not None:
            raise _Skip("skip-invalid-fp32", why[1])
    except _Skip as s:
        return CaseResult(name, s.status, s.detail)
    if run:
        try:
            ref_run = _run_all(model, data_sets)
        except Exception as exc:  # noqa: BLE001
            not_run = _one_line(exc)
        else:
            why = _compare_all(ref_run, data_sets, model)
            if why is not None:
                not_run = f"onnxruntime FP32 disagrees with the reference: {why}"

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = convert(model, target=target, probe=False)
    except Exception as exc:  # noqa: BLE001
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" [at {Path(tb[-1].filename).name}:{tb[-1].lineno}]" if tb else ""
        return CaseResult(name, "convert-error", _one_line(exc) + where)
    out = r.model
    why = _static_check(out)
    if why is not None:
        return CaseResult(name, *why)
    if not_run is not None:
        return CaseResult(name, "skip-ort-fp32", f"converted and checked statically; {not_run}")

    precisions = Counter(d.precision for d in r.decisions)
    all_fp32 = not any(p in _LOW for p in precisions)
    summary = ", ".join(f"{p}={n}" for p, n in sorted(precisions.items()))
    if run:
        try:
            got = _run_all(out, data_sets)
        except Exception as exc:  # noqa: BLE001
            return CaseResult(name, "ort-error", _one_line(exc))
        why = _compare_all(got, data_sets, model)
        if why is not None:
            return CaseResult(name, "mismatch", f"{why} (decisions: {summary})")
        detail = f"decisions: {summary}"
    else:
        detail = f"static checks only (not run); decisions: {summary}"
    return CaseResult(name, "pass-fp32" if all_fp32 else "pass-low", detail)


def sweep(case_dirs: Iterable[str | os.PathLike], target: str = "fp16") -> list[CaseResult]:
    """Run :func:`run_case` on every folder; see the module docstring for the statuses."""
    if target not in ("fp16", "bf16"):
        raise ValueError(f"target must be fp16 or bf16, not {target!r}")
    return [run_case(Path(d), target) for d in case_dirs]


# --------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("-k", dest="substring", default="", help="only cases whose name contains this")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = parser.parse_args(argv)

    dirs = [d for d in node_case_dirs() if args.substring in d.name]
    t0 = time.perf_counter()
    results = sweep(dirs, target=args.target)
    elapsed = time.perf_counter() - t0

    if args.verbose:
        for r in results:
            print(f"{r.status:16} {r.name}  {r.detail}")
    print(f"target {args.target}: {len(results)} cases in {elapsed:.1f}s")
    if args.target == "bf16":
        print("  (bf16: convert + full checker + strict shape inference only; not run on onnxruntime)")
    counts = Counter(r.status for r in results)
    order = sorted(counts, key=lambda s: (s not in PASS_STATUSES, s not in SKIP_STATUSES, s))
    for status in order:
        print(f"  {status:16} {counts[status]}")
    failures = [r for r in results if r.failed]
    if failures:
        print(f"\n{len(failures)} failing cases:")
        for r in failures:
            print(f"  {r.status:16} {r.name}: {r.detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    # Run as a script, sys.path[0] is tests/support/; put the repository root first (as conftest.py
    # does) so that ``amp_compiler`` is the source package whatever state the editable install is in.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
