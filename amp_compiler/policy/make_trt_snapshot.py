"""Regenerate ``trt_onnx_ops.json``: the types TensorRT's ONNX parser imports, per operator.

    python -m amp_compiler.policy.make_trt_snapshot --file operators.md --source "TEXT"
    python -m amp_compiler.policy.make_trt_snapshot --git-dir onnx-tensorrt/.git --ref release/10.15-GA

The source is onnx-tensorrt's ``docs/operators.md`` for one TensorRT release (``git clone
https://github.com/onnx/onnx-tensorrt``: each release has a ``release/X.Y-GA`` tag or branch): its
header names the release and the opsets it imports ("TensorRT 10.15 supports operators in the
inclusive range of opset 9 to opset 24"), and its "Operator Support Matrix" one row per ONNX operator:
whether the parser imports it (Y/N), the types it imports it in (FP32, FP16, BF16, INT32, ...) and
its restrictions. TensorRT has no kernel registry to read: the parser's own document is what it
promises, the equivalent of onnxruntime's kernel registry (``make_kernel_snapshot``) for this provider.

Types are written as ONNX spells them without ``tensor(...)`` ("float16"), so that the lookup
(:mod:`amp_compiler.policy.kernels`) compares them with schema types directly; the restrictions are
kept as written, for decision reasons. A type name the table has never used before stops the script
(a new one must be mapped here, not guessed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
from pathlib import Path

__all__ = ["TYPE_NAMES", "TableError", "dump", "main", "parse", "snapshot"]

HERE = Path(__file__).resolve().parent
OUT = HERE / "trt_onnx_ops.json"

#: The table's type names, as ONNX spells them. TensorRT's FP8 is E4M3 (its quantization guide); its
#: FP4 is E2M1.
TYPE_NAMES = {
    "DOUBLE": "double", "FP32": "float", "FP16": "float16", "BF16": "bfloat16", "FP8": "float8e4m3fn",
    "FP4": "float4e2m1", "INT64": "int64", "INT32": "int32", "INT8": "int8", "INT4": "int4", "UINT8": "uint8",
    "BOOL": "bool",
}
#: Misspellings in released tables, and what they stand for (10.0 and 10.1 list ConstantOfShape's
#: types as "FP32, FP16, BF16, INT32, INF64, BOOL").
TYPOS = {"INF64": "INT64"}
_HEADER = re.compile(
    r"TensorRT\s+(?P<version>\d+(?:\.\d+)*)\s+supports operators in the inclusive range of opset\s+"
    r"(?P<low>\d+)\s+to opset\s+(?P<high>\d+)"
)


class TableError(ValueError):
    """The file is not an onnx-tensorrt operator table this script can read."""


def parse(text: str) -> dict:
    """The release, opsets and operator rows of one ``docs/operators.md`` (see the module doc)."""
    header = _HEADER.search(text)
    if header is None:
        raise TableError("no 'TensorRT X supports operators in the inclusive range of opset A to opset B' line")
    _, matrix = text.split("## Operator Support Matrix", 1) if "## Operator Support Matrix" in text else ("", "")
    if not matrix:
        raise TableError("no '## Operator Support Matrix' section")
    ops: dict[str, dict] = {}
    for line in matrix.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0]
        if name in ("Operator", "") or set(name) <= set("-: "):
            continue  # the header and separator rows
        supported = cells[1] if len(cells) > 1 else ""
        if not supported.startswith(("Y", "N")):
            raise TableError(f"{name}: 'Supported' is {supported!r}, expected Y or N")
        imported = supported.startswith("Y")
        if imported:
            listed = [t.strip() for t in (cells[2] if len(cells) > 2 else "").split(",") if t.strip()]
            listed = [TYPOS.get(t, t) for t in listed]
            unknown = [t for t in listed if t not in TYPE_NAMES]
            if unknown:
                raise TableError(f"{name}: unknown type name(s) {unknown}: map them in TYPE_NAMES")
            restrictions = " ".join(c for c in cells[3:] if c)
        else:  # no types; some rows say why in the types column ("Not supported. ...")
            listed, restrictions = [], " ".join(c for c in cells[2:] if c)
        if name in ops:
            raise TableError(f"{name} has two rows")
        ops[name] = {
            "imported": imported,
            "types": [TYPE_NAMES[t] for t in listed],
            **({"restrictions": restrictions} if restrictions else {}),
        }
    if not ops:
        raise TableError("the operator support matrix has no rows")
    return {
        "tensorrt_version": header["version"],
        "opsets": [int(header["low"]), int(header["high"])],
        "ops": dict(sorted(ops.items())),
    }


def snapshot(text: str, source: str) -> dict:
    """The snapshot's content: the parsed table with where it came from and what it holds."""
    table = parse(text)
    ops = table["ops"]
    imported = [op for op, row in ops.items() if row["imported"]]

    def count(type_name: str) -> int:
        return sum(type_name in ops[op]["types"] for op in imported)

    return {
        "schema_version": 1,
        "provider": "TensorRT (its ONNX parser, onnx-tensorrt)",
        "tensorrt_version": table["tensorrt_version"],
        "opsets": table["opsets"],
        "source": source,
        "method": (
            "the 'Operator Support Matrix' of onnx-tensorrt's docs/operators.md for this release, one row per "
            "ONNX-domain operator: imported (Y/N), the types it is imported in (written as ONNX spells them), "
            "the restrictions as written. Operators without a row are not imported either (the parser has an "
            "importer per listed operator; anything else needs a plugin of that name)."
        ),
        "generated_by": "python -m amp_compiler.policy.make_trt_snapshot",
        "generated_on": datetime.date.today().isoformat(),
        "summary": {
            "ops": len(ops),
            "imported": len(imported),
            "imported_with_float16": count("float16"),
            "imported_with_bfloat16": count("bfloat16"),
            "imported_float_only_fp32": sum(
                ops[op]["types"] and {"float16", "bfloat16"}.isdisjoint(ops[op]["types"])
                and "float" in ops[op]["types"] for op in imported
            ),
        },
        "ops": ops,
    }


def dump(data: dict) -> str:
    """JSON with one operator per line, so that a new release gives a readable diff."""
    head = {k: v for k, v in data.items() if k != "ops"}
    lines = json.dumps(head, indent=1)[:-2].splitlines()
    lines[-1] += ","
    lines.append(' "ops": {')
    items = list(data["ops"].items())
    for i, (op, row) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"  {json.dumps(op)}: {json.dumps(row, separators=(', ', ': '))}{comma}")
    lines.append(" }")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == data
    return text


def _read(args: argparse.Namespace) -> tuple[str, str]:
    """The table's text and a default description of where it came from."""
    if args.file is not None:
        return args.file.read_text(encoding="utf-8"), f"{args.file.name} (a copy of onnx-tensorrt's docs/operators.md)"
    commit = subprocess.run(
        ["git", "--git-dir", str(args.git_dir), "rev-parse", f"{args.ref}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    text = subprocess.run(
        ["git", "--git-dir", str(args.git_dir), "show", f"{commit}:docs/operators.md"],
        check=True, capture_output=True, text=True,
    ).stdout
    return text, f"onnx/onnx-tensorrt docs/operators.md at {args.ref} (commit {commit})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--file", type=Path, help="a copy of onnx-tensorrt's docs/operators.md")
    where.add_argument("--git-dir", type=Path, help="an onnx-tensorrt git directory (with --ref)")
    ap.add_argument("--ref", default="HEAD", help="the release's tag, branch or commit (with --git-dir)")
    ap.add_argument("--source", help="where the table came from, written into the snapshot")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text, source = _read(args)
    data = snapshot(text, args.source or source)
    args.output.write_text(dump(data), encoding="utf-8")
    s = data["summary"]
    print(
        f"{args.output}: TensorRT {data['tensorrt_version']}, {s['ops']} operators ({s['imported']} imported); "
        f"FP16 for {s['imported_with_float16']}, BF16 for {s['imported_with_bfloat16']}, "
        f"FP32 but neither for {s['imported_float_only_fp32']}"
    )


if __name__ == "__main__":
    main()
