"""Which nodes onnxruntime ran off the provider asked for, read from its session profile.

onnxruntime's profile (``SessionOptions.enable_profiling``) has one ``Node`` event per kernel run,
with the node's name (``<name>_kernel_time``), ``args.op_name``, ``args.provider`` and the element
types of its inputs and outputs (``input_type_shape``/``output_type_shape``: ``[{"float": [1, 8]}]``).
A node on another provider than the one asked for is CPU fallback when it reads or writes a float
tensor (``fallback``: it moves activations between host and device); one that touches only integer
or boolean tensors is shape arithmetic (``Shape``, ``Gather`` of a shape, ``Concat`` of dims...),
which onnxruntime's CUDA provider places on the CPU on purpose (``shape_like``, listed apart).
``MemcpyToHost``/``MemcpyFromHost`` are the copies it inserts between the two (``copies``).
"""

from __future__ import annotations

from collections.abc import Iterable

from benchmarks.gpu.rows import Placement

__all__ = ["FLOAT_TYPES", "placement_from_profile"]

#: Element type names in a profile's ``*_type_shape`` entries that hold float data.
FLOAT_TYPES = frozenset({"float", "float16", "bfloat16", "double", "float8e4m3fn", "float8e4m3fnuz",
                         "float8e5m2", "float8e5m2fnuz", "float4e2m1"})
_COPIES = frozenset({"MemcpyToHost", "MemcpyFromHost"})


def _types(entries: object) -> set[str]:
    out: set[str] = set()
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            out.update(str(k) for k in entry)
    return out


def placement_from_profile(events: Iterable[dict], provider: str) -> Placement:
    """The placement of the nodes in a profile's events against ``provider`` (its onnxruntime name)."""
    seen: dict[str, tuple[str, str, bool]] = {}  # name -> (op, provider, touches a float tensor)
    for event in events:
        args = event.get("args") or {}
        if event.get("cat") != "Node" or "provider" not in args:
            continue
        name = str(event.get("name", "")).removesuffix("_kernel_time")
        if not name or name in seen:
            continue
        types = _types(args.get("input_type_shape")) | _types(args.get("output_type_shape"))
        seen[name] = (str(args.get("op_name", "?")), str(args["provider"]), bool(types & FLOAT_TYPES))
    fallback: list[str] = []
    shape_like: list[str] = []
    copies = 0
    for name, (op, where, floats) in sorted(seen.items()):
        if op in _COPIES:
            copies += 1
            continue
        if where == provider:
            continue
        (fallback if floats else shape_like).append(f"{op} {name} ({where})")
    return Placement(provider, len(seen), fallback, shape_like, copies)
