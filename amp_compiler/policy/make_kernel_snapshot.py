"""Regenerate ``ort_cuda_kernels.json``: the CUDA provider's kernel registry of an onnxruntime-gpu wheel.

    python -m amp_compiler.policy.make_kernel_snapshot [--version 1.31.1] [--wheel FILE] [--workdir DIR]

Runs on a machine without a GPU or CUDA (needs pip, gcc, readelf and nm):

1. ``pip download --no-deps onnxruntime-gpu==VERSION`` (about 255 MB) into a work folder outside the
   repository, and ``pip install --no-deps --target`` it there (the installed onnxruntime is untouched).
2. The CUDA and TensorRT provider libraries link CUDA, cuDNN and TensorRT libraries that are not
   here; without them ``get_all_opkernel_def()`` segfaults. Stub libraries stand in for them: one
   per missing library, with its soname, symbol versions and every symbol the provider imports
   (functions returning 0, i.e. success). Kernels are registered from static tables in the provider
   library, so its registry is the real one; nothing is ever run on a device.
3. The registry is read in a child process (``amp_compiler.policy.kernels.probe_registry``) with the
   unpacked wheel first on ``PYTHONPATH`` and the stubs on ``LD_LIBRARY_PATH``; the CUDA provider's
   kernels are written out, one op per line. The internal ``com.ms.internal.nhwc`` domain (layout
   rewrites onnxruntime makes itself) is left out.

If the child still crashes the script stops. The fallback is onnxruntime's ``docs/OperatorKernels.md``
at the release's tag, generated from the same registrations (``tools/python/gen_opkernel_doc.py``);
a snapshot made from it must say so in its ``method``. (A copy at commit 001d12d, read here, was
older than 1.31.1 in places: it lists RoiAlign's CUDA kernel as double/float only, where 1.31.1
registers FP16 from opset 16 and BF16 from 22.)
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from amp_compiler.policy.kernels import OPEN_END, probe_registry, short_type

__all__ = ["dump", "main", "merge_defs"]

HERE = Path(__file__).resolve().parent
OUT = HERE / "ort_cuda_kernels.json"
SKIP_DOMAINS = {"com.ms.internal.nhwc"}
_SYSTEM = ("libc.", "libm.", "libdl.", "librt.", "libpthread.", "libstdc++", "libgcc_s", "ld-linux", "libonnxruntime")
# Stubs whose return value is read as something other than a status code.
_SPECIAL = {
    "__cudaRegisterFatBinary": "static void* fat[4]; void** __cudaRegisterFatBinary(void* f) { return fat; }",
    "cudaGetDeviceCount": "int cudaGetDeviceCount(int* n) { *n = 1; return 0; }",
    "cudaGetErrorString": 'const char* cudaGetErrorString(int e) { return "stub"; }',
    "cudaGetErrorName": 'const char* cudaGetErrorName(int e) { return "stub"; }',
    "cublasGetStatusName": 'const char* cublasGetStatusName(int e) { return "stub"; }',
    "cublasGetStatusString": 'const char* cublasGetStatusString(int e) { return "stub"; }',
}


def _run(args: list[str], **kw) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def build_stubs(provider_libs: list[Path], out_dir: Path) -> list[str]:
    """Compile one stub shared library per non-system library the provider libraries need."""
    needed: set[str] = set()
    versioned: dict[str, set[str]] = collections.defaultdict(set)
    plain: set[str] = set()
    for lib in provider_libs:
        for line in _run(["readelf", "-d", str(lib)]).splitlines():
            if "(NEEDED)" in line:
                name = line.split("[", 1)[1].rstrip("]")
                if not name.startswith(_SYSTEM):
                    needed.add(name)
        for line in _run(["nm", "-D", "--undefined-only", str(lib)]).splitlines():
            parts = line.split()
            if len(parts) != 2 or parts[0] != "U":
                continue
            symbol, _, version = parts[1].partition("@")
            if version in needed:
                versioned[version].add(symbol)
            elif not version and symbol != "Provider_GetHost":  # unversioned: cuTensorMapEncodeTiled, TensorRT's
                plain.add(symbol)
    out_dir.mkdir(parents=True, exist_ok=True)
    for soname in sorted(needed):
        symbols = sorted(versioned.get(soname, ()))
        # Unversioned imports may come from any library without symbol versions: give them to each.
        extra = [] if symbols else sorted(plain)
        src = out_dir / f"{soname}.c"
        src.write_text("\n".join(_SPECIAL.get(s, f"int {s}(void) {{ return 0; }}") for s in symbols + extra) + "\n")
        args = ["gcc", "-shared", "-fPIC", "-o", str(out_dir / soname), str(src), f"-Wl,-soname,{soname}"]
        if symbols:
            script = out_dir / f"{soname}.map"
            script.write_text(f"{soname} {{ global: {' '.join(s + ';' for s in symbols)} }};\n")
            args.append(f"-Wl,--version-script={script}")
        _run(args)
    return sorted(needed)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def merge_defs(defs: list) -> list:
    """Merge kernels of one version range that differ in one type parameter only (exact: the union
    of {T: a, U: x} and {T: b, U: x} is {T: a+b, U: x}). onnxruntime registers most kernels once per
    type; merged, an op fits on one line."""
    merged = [[d[0], d[1], {p: set(t) for p, t in d[2].items()}] for d in defs]
    changed = True
    while changed:
        changed = False
        for i in range(len(merged)):
            for j in range(i + 1, len(merged)):
                a, b = merged[i], merged[j]
                if a[:2] != b[:2] or a[2].keys() != b[2].keys():
                    continue
                differ = [p for p in a[2] if a[2][p] != b[2][p]]
                if len(differ) <= 1:
                    for p in differ:
                        a[2][p] |= b[2][p]
                    del merged[j]
                    changed = True
                    break
            if changed:
                break
    out = [[s, e, {p: sorted(t) for p, t in sorted(c.items())}] for s, e, c in merged]
    return sorted(out, key=lambda d: (d[0], json.dumps(d[2])))


def snapshot(version: str, workdir: Path, wheel: Path | None = None) -> dict:
    if wheel is None:
        dl = workdir / "dl"
        _run([sys.executable, "-m", "pip", "download", "--no-deps", f"onnxruntime-gpu=={version}", "-d", str(dl)])
        wheel = next(dl.glob(f"onnxruntime_gpu-{version}-*.whl"))
    site = workdir / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--upgrade", "--target", str(site), str(wheel)])
    capi = site / "onnxruntime" / "capi"
    libs = sorted(capi.glob("libonnxruntime_providers_*.so"))
    libs = [p for p in libs if "shared" not in p.name]
    stubbed = build_stubs(libs, workdir / "stubs")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(workdir / "stubs")] + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])
    )
    data = probe_registry("CUDAExecutionProvider", env=env, timeout=600)
    if data is None or len(data["kernels"]) < 500:
        raise SystemExit("could not read the CUDA provider's registry: fall back to docs/OperatorKernels.md")
    if data["onnxruntime_version"] != version:
        raise SystemExit(f"the child imported onnxruntime {data['onnxruntime_version']}, not {version}")

    kernels: dict[str, dict[str, list]] = {}
    for domain, op, start, end, types in data["kernels"]:
        domain = domain or "ai.onnx"
        if domain in SKIP_DOMAINS:
            continue
        constraints = {p: [short_type(t) for t in ts] for p, ts in sorted(types.items())}
        entry = [start, None if end >= OPEN_END else end, constraints]
        defs = kernels.setdefault(domain, {}).setdefault(op, [])
        if entry not in defs:
            defs.append(entry)
    for ops in kernels.values():
        for op, defs in ops.items():
            ops[op] = merge_defs(defs)

    def count(type_name: str) -> int:
        return sum(
            1 for ops in kernels.values() for defs in ops.values()
            if any(type_name in ts for d in defs for ts in d[2].values())
        )

    return {
        "schema_version": 1,
        "provider": "CUDAExecutionProvider",
        "onnxruntime_version": version,
        "package": f"onnxruntime-gpu {version} from PyPI: {wheel.name} (sha256 {_sha256(wheel)})",
        "method": (
            "onnxruntime.capi._pybind_state.get_all_opkernel_def() of the unpacked wheel, read in a child "
            "process on a machine without CUDA: stub libraries (every imported symbol returns 0) stood in for "
            f"{', '.join(stubbed)}, so the provider library loads and registers its kernels from its static "
            "tables. Kernels of the internal com.ms.internal.nhwc domain are left out. Type constraints are "
            "written without 'tensor(...)'; an end of null means the range is open."
        ),
        "generated_by": "python -m amp_compiler.policy.make_kernel_snapshot",
        "generated_on": datetime.date.today().isoformat(),
        "summary": {
            "kernel_entries": sum(len(defs) for ops in kernels.values() for defs in ops.values()),
            "ops": sum(len(ops) for ops in kernels.values()),
            "ops_with_float16": count("float16"),
            "ops_with_bfloat16": count("bfloat16"),
        },
        "kernels": {d: dict(sorted(kernels[d].items())) for d in sorted(kernels)},
    }


def dump(data: dict) -> str:
    """JSON with one op per line, so that a new onnxruntime version gives a readable diff."""
    head = {k: v for k, v in data.items() if k != "kernels"}
    lines = json.dumps(head, indent=1)[:-2].splitlines()
    lines[-1] += ","
    lines.append(' "kernels": {')
    domains = list(data["kernels"].items())
    for i, (domain, ops) in enumerate(domains):
        lines.append(f"  {json.dumps(domain)}: {{")
        items = list(ops.items())
        for j, (op, defs) in enumerate(items):
            comma = "," if j < len(items) - 1 else ""
            lines.append(f"   {json.dumps(op)}: {json.dumps(defs, separators=(',', ':'))}{comma}")
        lines.append("  }" + ("," if i < len(domains) - 1 else ""))
    lines.append(" }")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == data
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="1.31.1", help="onnxruntime-gpu version (default 1.31.1)")
    ap.add_argument("--wheel", type=Path, help="an onnxruntime-gpu wheel already downloaded")
    ap.add_argument("--workdir", type=Path, help="work folder (default: a temporary one)")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        data = snapshot(args.version, args.workdir, args.wheel)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            data = snapshot(args.version, Path(tmp), args.wheel)
    args.output.write_text(dump(data), encoding="utf-8")
    s = data["summary"]
    print(
        f"{args.output}: {s['ops']} ops ({s['kernel_entries']} entries); FP16 kernels for "
        f"{s['ops_with_float16']} ops, BF16 for {s['ops_with_bfloat16']}"
    )


if __name__ == "__main__":
    main()
