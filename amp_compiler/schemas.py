"""Op signatures from the ONNX schemas (and onnxruntime's contrib schemas).

The precision graph needs, for every node, which of its inputs and outputs share a type parameter and
which types each parameter allows. That comes from ``onnx.defs`` for the standard domains and from
onnxruntime's registered schemas for ``com.microsoft``: no per-op special cases.
"""

from __future__ import annotations

import dataclasses
import functools

import onnx
import onnx.defs


@dataclasses.dataclass(frozen=True)
class Formal:
    """One formal input or output of a schema."""

    name: str
    type_str: str  # a type parameter ("T") or a fixed type ("tensor(float)")
    variadic: bool
    homogeneous: bool


@dataclasses.dataclass(frozen=True)
class OpSignature:
    domain: str
    op_type: str
    since_version: int
    inputs: tuple[Formal, ...]
    outputs: tuple[Formal, ...]
    allowed: dict[str, frozenset[str]]  # type parameter -> allowed type strings

    def _formal(self, formals: tuple[Formal, ...], index: int) -> Formal | None:
        if index < len(formals):
            return formals[index]
        if formals and formals[-1].variadic:
            return formals[-1]
        return None

    def type_key(self, is_input: bool, index: int) -> str | tuple[str, int] | None:
        """The key shared by all slots that must have one dtype (None when the slot is unknown).

        Homogeneous formals share their type parameter; each slot of a heterogeneous variadic formal
        (If/Loop/Scan values) gets its own key.
        """
        formal = self._formal(self.inputs if is_input else self.outputs, index)
        if formal is None:
            return None
        if formal.variadic and not formal.homogeneous:
            return (formal.type_str, index if is_input else -1 - index)
        return formal.type_str

    def allowed_types(self, is_input: bool, index: int) -> frozenset[str]:
        formal = self._formal(self.inputs if is_input else self.outputs, index)
        if formal is None:
            return frozenset()
        if formal.type_str in self.allowed:
            return self.allowed[formal.type_str]
        return frozenset({formal.type_str})


def _from_onnx(schema: onnx.defs.OpSchema) -> OpSignature:
    def formals(params) -> tuple[Formal, ...]:
        return tuple(
            Formal(
                name=p.name,
                type_str=p.type_str,
                variadic=p.option == onnx.defs.OpSchema.FormalParameterOption.Variadic,
                homogeneous=p.is_homogeneous,
            )
            for p in params
        )

    return OpSignature(
        domain=schema.domain,
        op_type=schema.name,
        since_version=schema.since_version,
        inputs=formals(schema.inputs),
        outputs=formals(schema.outputs),
        allowed={c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints},
    )


@functools.cache
def _contrib_schemas() -> dict[tuple[str, str], list]:
    """onnxruntime's registered schemas for non-ONNX domains (com.microsoft, ...), by (domain, op)."""
    try:
        from onnxruntime.capi import _pybind_state as C

        raw = C.get_all_operator_schema()
    except Exception:  # an onnxruntime build without schema export: contrib ops become unknown
        return {}
    out: dict[tuple[str, str], list] = {}
    for s in raw:
        if s.domain in ("", "ai.onnx", "ai.onnx.ml"):
            continue
        out.setdefault((s.domain, s.name), []).append(s)
    for versions in out.values():
        versions.sort(key=lambda s: s.since_version)
    return out


def _from_ort(schema) -> OpSignature:
    variadic = schema.FormalParameterOption.Variadic

    def formals(params) -> tuple[Formal, ...]:
        return tuple(
            Formal(p.name, p.typeStr, p.option == variadic, p.isHomogeneous) for p in params
        )

    return OpSignature(
        domain=schema.domain,
        op_type=schema.name,
        since_version=schema.since_version,
        inputs=formals(schema.inputs),
        outputs=formals(schema.outputs),
        allowed={c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints},
    )


@functools.lru_cache(maxsize=4096)
def lookup(domain: str, op_type: str, opset: int) -> OpSignature | None:
    """The signature of ``op_type`` as of ``opset`` in ``domain``, or None when no schema is known."""
    dom = "" if domain == "ai.onnx" else domain
    if dom in ("", "ai.onnx.ml", "ai.onnx.preview.training"):
        try:
            return _from_onnx(onnx.defs.get_schema(op_type, opset, dom))
        except onnx.defs.SchemaError:
            return None
    versions = _contrib_schemas().get((dom, op_type))
    if not versions:
        return None
    chosen = [s for s in versions if s.since_version <= opset] or versions[:1]
    return _from_ort(chosen[-1])


def is_onnx_domain(domain: str) -> bool:
    """True for the default ONNX domain, spelled "" or "ai.onnx"."""
    return domain in ("", "ai.onnx")
