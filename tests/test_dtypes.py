"""The one dtype-name table and precision order (amp_compiler.dtypes) and the one union-find (amp_compiler.core.graph)."""

import onnx.defs
import onnx_ir as ir

from amp_compiler.core.graph import UnionFind
from amp_compiler.dtypes import FLOAT_TYPES, LOW_PRECISIONS, PRECISIONS, precision_rank, schema_type, short_name
from amp_compiler.targets import Target


def test_short_names():
    assert [short_name(t) for t in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)] \
        == ["fp32", "fp16", "bf16", "fp64"]
    assert short_name(ir.DataType.INT64) == "int64" and short_name(ir.DataType.FLOAT8E4M3FN) == "fp8"
    assert short_name(ir.DataType.FLOAT8E5M2) == "fp8e5m2"  # FP8 training gradients (E5M2)
    assert {short_name(t.dtype) for t in Target} == {"fp16", "bf16", "fp8"}


def test_precisions_are_listed_low_first_fewest_bits_first():
    assert set(LOW_PRECISIONS) == {short_name(t.dtype) for t in Target}
    assert PRECISIONS == ("fp8", "fp16", "bf16", "mixed", "fp32", "none")
    names = ["none", "int8", "fp32", "mixed", "bf16", "fp16", "fp8", "fp64"]
    assert sorted(names, key=precision_rank) == ["fp8", "fp16", "bf16", "mixed", "fp32", "none", "fp64", "int8"]


def test_schema_type_is_the_onnx_spelling():
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in onnx.defs.get_schema("Add", 14).type_constraints}
    assert {schema_type(t) for t in FLOAT_TYPES} <= allowed["T"]
    assert schema_type(ir.DataType.INT64) in allowed["T"] and Target.FP16.type_str == "tensor(float16)"


def test_union_find_groups_in_order_of_first_member():
    uf: UnionFind[str] = UnionFind()
    for item in "abcdef":
        uf.add(item)
    uf.union("c", "a")
    uf.union("e", "c")
    uf.union("b", "f")
    assert uf.find("a") == uf.find("c") == "e" and uf.find("f") == "b"  # the first set's root stays
    assert list(uf.groups().values()) == [["a", "c", "e"], ["b", "f"], ["d"]]
    uf.parent.update({"x": "y", "y": "y"})  # a star added directly, as the ONNX builder adds templates
    assert uf.groups()["y"] == ["x", "y"]
