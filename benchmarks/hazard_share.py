"""Tensor Core FLOPs kept low on CUDA, with the runtime-hazard rule where it happens vs everywhere.

    python -m benchmarks.hazard_share [--size small|full|all] [--models vit-mha,...] [--encoder-layers 48]

Per transformer of the catalog (its architectures and deployment graphs), converted to FP16 for the
CUDA provider: the share of the Tensor Core FLOPs in FP16 (the policy table's ``tensor_core`` ops,
FLOPs from ``amp_compiler.onnx.costs.costs.estimate`` at the catalog's input shapes), the Casts
inserted and the bytes they move, and the nodes the rule ``runtime.ort-transpose-matmul`` decided:
"everywhere" is the rule as it was before issue 27 (both ops FP32 on every provider, what it still
does on the CPU provider, which inserts the crashing Cast itself); "where it happens" is the rule
now (on CUDA the Transpose takes the MatMul's precision). ``--encoder-layers N`` adds a stack of N
``nn.TransformerEncoderLayer(batch_first=True)`` (``models.torch_nets.encoder_stack``, width 512,
sequence 128), built on first use and cached.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from unittest import mock

import numpy as np
import onnx

from amp_compiler import convert
from amp_compiler.core.plan import Rule
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.passes.analysis import RuntimeHazardPass
from amp_compiler.policy import default_table
from models import catalog, torch_nets

#: The catalog's transformers: attention models among its architectures and deployment graphs.
TRANSFORMERS = ("bert", "gpt2", "t5", "vit", "whisper", "clip", "llama")


@dataclasses.dataclass(frozen=True)
class Share:
    tc_low: float  # share of Tensor Core FLOPs in FP16
    casts: int
    cast_bytes: int
    pinned: int  # nodes decided by runtime.ort-transpose-matmul


def measure(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], *, everywhere: bool) -> Share:
    """The FP16 conversion of ``model`` for CUDA, with the hazard rule as it is or (``everywhere``) as
    it was: both ops FP32 on every provider."""
    as_before = mock.patch.object(RuntimeHazardPass, "inserts_cast", property(lambda self: True))
    with as_before if everywhere else contextlib.nullcontext():
        result = convert(model, target="fp16", provider="cuda", input_shapes=shapes, probe=False)
    costs = estimate(result.model, shapes)
    table = default_table()
    total = low = cast_bytes = 0
    for d, cost in zip(result.decisions, costs.nodes, strict=True):
        if table.is_tensor_core(d.domain, d.op_type):
            total += cost.flops
            low += cost.flops if d.precision == "fp16" else 0
        if d.rule == Rule.LOWERING_CAST.value:
            cast_bytes += cost.bytes
    pinned = sum(d.rule == Rule.RUNTIME_TRANSPOSE_MATMUL.value for d in result.decisions)
    return Share(low / total if total else 1.0, result.casts_inserted, cast_bytes, pinned)


def transformers(size: str | None) -> list[catalog.CatalogModel]:
    return [e for e in catalog.entries(size) if e.kind in ("architecture", "deployment")
            and any(e.name.startswith(t) for t in TRANSFORMERS)]


def row(name: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> str:
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    before, after = measure(model, shapes, everywhere=True), measure(model, shapes, everywhere=False)
    return (
        f"| {name} | {100 * before.tc_low:.1f}% | {100 * after.tc_low:.1f}% | {before.casts} / {before.cast_bytes / 1e6:.1f} MB"
        f" | {after.casts} / {after.cast_bytes / 1e6:.1f} MB | {before.pinned} / {after.pinned} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["small", "full", "all"])
    parser.add_argument("--models", default=None, help="comma-separated catalog names (default: every transformer)")
    parser.add_argument("--encoder-layers", type=int, default=0, help="add an nn.TransformerEncoder stack of N layers")
    args = parser.parse_args()
    entries = transformers(None if args.size == "all" else args.size)
    if args.models is not None:
        entries = [catalog.get(name) for name in args.models.split(",") if name]
    print("| model | Tensor Core FLOPs FP16, rule everywhere | where it happens | Casts / MB, everywhere "
          "| where it happens | nodes the rule decided (everywhere / where) |")
    print("|---|---|---|---|---|---|")
    for entry in entries:
        print(row(entry.name, catalog.load(entry), entry.make_inputs(np.random.default_rng(0))), flush=True)
    if args.encoder_layers:
        spec = torch_nets.encoder_stack(args.encoder_layers)
        print(row(spec.name, spec.build(catalog.CACHE_DIR), spec.make_inputs(np.random.default_rng(0))), flush=True)


if __name__ == "__main__":
    main()
