"""Op signatures from the ONNX schemas (and onnxruntime's, for the ops onnx does not define).

The precision graph needs, for every node, which of its inputs and outputs share a type parameter and
which types each parameter allows. That comes from ``onnx.defs`` for the ops onnx defines and from
onnxruntime's registered schemas for the others (``com.microsoft``'s contrib ops, and the ops
onnxruntime registers in onnx's own domains): no per-op special cases.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import onnx
import onnx.defs

from amp_compiler import runtime

__all__ = [
    "ONNX_DOMAINS", "OpSignature", "canonical_domain", "is_onnx_domain", "lookup", "onnx_knows", "opset_in",
    "ort_schema",
]


def canonical_domain(domain: str) -> str:
    """The domain as the policy tables and kernel registries key it: "ai.onnx" for the default one."""
    return "ai.onnx" if is_onnx_domain(domain) else domain


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


ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")  # the domains onnx's own schemas cover


@functools.cache
def _ort_schemas() -> dict[tuple[str, str], list]:
    """onnxruntime's registered schemas, by (domain, op) with "" for the default domain, oldest first.
    Read only for ops onnx has no schema for (com.microsoft's, and the ones onnxruntime registers in
    onnx's own domains, such as SimplifiedLayerNormalization); onnxruntime is imported then."""
    ort = runtime.onnxruntime("read the schemas of ops that onnx does not define")
    out: dict[tuple[str, str], list] = {}
    for s in ort.capi._pybind_state.get_all_operator_schema():
        domain = "" if is_onnx_domain(s.domain) else s.domain
        out.setdefault((domain, s.name), []).append(s)
    for versions in out.values():
        versions.sort(key=lambda s: s.since_version)
    return out


def ort_schema(domain: str, op_type: str, opset: int):
    """onnxruntime's schema of ``op_type`` in ``domain`` as of ``opset`` (its newest version not newer
    than ``opset``, else its oldest), or None when onnxruntime registers no such op."""
    versions = _ort_schemas().get(("" if is_onnx_domain(domain) else domain, op_type))
    if not versions:
        return None
    return ([s for s in versions if s.since_version <= opset] or versions[:1])[-1]


def onnx_knows(domain: str, op_type: str, opset: int) -> bool:
    """True when onnx itself has a schema for ``op_type`` in ``domain`` at ``opset``."""
    dom = "" if is_onnx_domain(domain) else domain
    return dom in ONNX_DOMAINS and onnx.defs.has(op_type, opset, dom)


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
    """The signature of ``op_type`` as of ``opset`` in ``domain``, or None when no schema is known:
    onnx's schema, else onnxruntime's (for contrib ops, in whatever domain the model puts them)."""
    dom = "" if is_onnx_domain(domain) else domain
    if dom in ONNX_DOMAINS:
        try:
            return _from_onnx(onnx.defs.get_schema(op_type, opset, dom))
        except onnx.defs.SchemaError:
            pass
    schema = ort_schema(dom, op_type, opset)
    return None if schema is None else _from_ort(schema)


def opset_in(imports: Mapping[str, int], domain: str) -> int:
    """The opset a model imports for ``domain`` (``imports``: onnx_ir's ``opset_imports``), the
    default domain spelled either way; 1 when it imports none."""
    dom = "" if is_onnx_domain(domain) else domain
    return imports.get(dom, imports.get("ai.onnx", 1) if dom == "" else 1)


def is_onnx_domain(domain: str) -> bool:
    """True for the default ONNX domain, spelled "" or "ai.onnx"."""
    return domain in ("", "ai.onnx")
