"""Build (or fetch from the cache) every catalog entry and report on it.

    python -m models.build [--size small|full|all] [--kind KIND] [--list] [--cache DIR] [NAME ...]

``--list`` prints the entries without building them. Otherwise each entry is built in turn and a
table row printed: name, kind, size, node count (main graph, then including subgraphs), distinct op
types, file size, build time, producer (the exporter for architectures). Exits non-zero if any entry
failed to build.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import onnx

# Runnable as `python models/build.py` too: make the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models import catalog  # noqa: E402


def _walk(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _walk(g)


def stats(model: onnx.ModelProto) -> dict:
    """Node counts (main graph / with subgraphs), distinct op types, serialized size in MB."""
    nodes = list(_walk(model.graph))
    return {
        "nodes": len(model.graph.node),
        "all_nodes": len(nodes),
        "op_types": len({(n.domain, n.op_type) for n in nodes}),
        "mb": model.ByteSize() / 1e6,
        "producer": {p.key: p.value for p in model.metadata_props}.get("amp_catalog.exporter")
        or model.producer_name
        or "?",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.build", description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=["small", "full", "all"], default="small")
    ap.add_argument("--kind", choices=["rule", "architecture", "deployment", "wheel"], default=None)
    ap.add_argument("--list", action="store_true", help="list the entries, build nothing")
    ap.add_argument("--cache", type=Path, default=None, help=f"cache dir (default {catalog.CACHE_DIR})")
    ap.add_argument("names", nargs="*", help="only these entries")
    args = ap.parse_args(argv)

    selected = catalog.entries(size=None if args.size == "all" else args.size, kind=args.kind)
    if args.names:
        unknown = set(args.names) - {e.name for e in selected}
        if unknown:
            ap.error(f"no such entries (for --size {args.size}): {', '.join(sorted(unknown))}")
        selected = [e for e in selected if e.name in args.names]

    if args.list:
        print(f"{'name':30} {'kind':12} {'size':5} description")
        for e in selected:
            print(f"{e.name:30} {e.kind:12} {e.size:5} {e.description}")
        return 0

    header = (
        f"{'name':30} {'kind':12} {'size':5} {'nodes':>6} {'(+sub)':>6} {'ops':>4} {'MB':>8} "
        f"{'build s':>8}  producer"
    )
    print(header)
    print("-" * len(header), flush=True)
    failed, total = [], 0.0
    for e in selected:
        t0 = time.perf_counter()
        try:
            model = catalog.load(e, args.cache)
        except Exception:  # noqa: BLE001 - report and go on with the others
            dt = time.perf_counter() - t0
            total += dt
            failed.append(e.name)
            print(f"{e.name:30} {e.kind:12} {e.size:5} FAILED after {dt:.1f}s", flush=True)
            traceback.print_exc()
            continue
        dt = time.perf_counter() - t0
        total += dt
        s = stats(model)
        print(
            f"{e.name:30} {e.kind:12} {e.size:5} {s['nodes']:6d} {s['all_nodes']:6d} {s['op_types']:4d} "
            f"{s['mb']:8.2f} {dt:8.1f}  {s['producer']}",
            flush=True,
        )
    print(f"{len(selected) - len(failed)} built, {len(failed)} failed, {total:.1f}s")
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
