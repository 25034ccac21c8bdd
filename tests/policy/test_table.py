"""Checks of the declarative precision-policy table amp_compiler/policy/onnx_ops.toml."""

import json
import subprocess
import sys

import onnx.defs
import pytest
import tomllib

from tests.support import REPO_ROOT

ROOT = REPO_ROOT
TABLE = ROOT / "amp_compiler" / "policy" / "onnx_ops.toml"
REFERENCE = ROOT.parent / "shared" / "reference" / "onnx_op_precision.json"

CATEGORIES = {"LOW", "HIGH", "FOLLOW", "PASS", "NONFLOAT"}
DOMAINS = {"ai.onnx", "ai.onnx.ml", "com.microsoft"}
SENSITIVITIES = {"range", "arithmetic"}
PROVIDERS = {"cuda", "cpu", "tensorrt"}
ALLOWED_KEYS = {
    "op", "domain", "category", "reason", "sensitivity", "refs", "dtype_attr", "fp32_inside", "tensor_core",
    "shape_inputs", "signal", "dynamic_range", "quantizes", "recurrent", "tiny_outputs", "fp8_inputs", "fp8_reason",
    "gemm", "zero_singular", "keeps_zeros", "when", "thresholds", "thresholds_operand", "periodic", "positions",
    "logit_differences", "logit_inputs", "selects", "index_inputs", "scores", "scale_inputs",
}
GEMM_KEYS = {"kind", "operands", "transpose", "bias", "source"}


@pytest.fixture(scope="module")
def entries():
    with TABLE.open("rb") as f:
        data = tomllib.load(f)
    assert set(data) == {"op"}, "the table holds only [[op]] entries"
    return data["op"]


@pytest.fixture(scope="module")
def table(entries):
    return {(e["op"], e["domain"]): e for e in entries}


def test_parses_and_is_not_empty(entries):
    assert len(entries) > 300


def test_every_tensor_core_op_says_whether_it_takes_fp8(entries):
    """FP8 inputs through Q/DQ (``fp8_inputs``) or a reason why not (``fp8_reason``), for Tensor Core ops only."""
    for e in entries:
        has_inputs, has_reason = bool(e.get("fp8_inputs")), bool(e.get("fp8_reason"))
        if e.get("tensor_core"):
            assert has_inputs != has_reason, e["op"]
        else:
            assert not has_inputs and not has_reason, e["op"]
    from amp_compiler.policy import default_table

    takes = {e["op"] for e in entries if e.get("fp8_inputs")}
    assert takes == {"MatMul", "Gemm", "Conv"}
    table = default_table()
    for op in ("MatMul", "Gemm", "Conv"):
        assert table.get("", op).fp8_inputs == (0, 1)
    assert "Q/DQ" in table.get("com.microsoft", "Attention").fp8_reason


def test_tensor_core_ops_are_the_low_matrix_products(entries):
    """"Tensor Core op" is defined once, by the tables' ``tensor_core`` entries, all of them LOW."""
    from amp_compiler.fx.graph.policy import default_policy
    from amp_compiler.policy import default_table

    marked = {(e["domain"], e["op"]) for e in entries if e.get("tensor_core")}
    onnx_ops = {("ai.onnx", op) for op in ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "LSTM", "GRU", "RNN")}
    fused = {
        ("com.microsoft", op) for op in (
            "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "MatMulNBits",
            "FusedMatMul", "GemmFastGelu", "FusedConv", "MoE",
        )
    }
    assert onnx_ops | fused <= marked
    assert {d for d, _ in marked} == {"ai.onnx", "com.microsoft"}
    # Not matrix products: norms, activations, and quantized ops' integer arithmetic.
    for op in ("SkipLayerNormalization", "BiasGelu", "FastGelu", "QuickGelu", "EmbedLayerNormalization", "RotaryEmbedding"):
        assert ("com.microsoft", op) not in marked, op
    assert all(e["category"] == "LOW" for e in entries if e.get("tensor_core"))
    onnx_table, aten_table = default_table(), default_policy().table
    assert onnx_table.is_tensor_core("", "MatMul") and onnx_table.is_tensor_core("ai.onnx", "Conv")
    assert not onnx_table.is_tensor_core("", "Softmax") and not onnx_table.is_tensor_core("", "NoSuchOp")
    aten = [e for e in aten_table if e.tensor_core]
    assert {"mm", "linear", "conv2d", "lstm"} <= {e.op for e in aten} and "mv" not in {e.op for e in aten}
    assert all(e.category.value == "LOW" for e in aten)


def test_entry_fields(entries):
    for e in entries:
        name = f"{e.get('domain')}:{e.get('op')}"
        assert set(e) <= ALLOWED_KEYS, (name, set(e) - ALLOWED_KEYS)
        assert isinstance(e.get("op"), str) and e["op"], name
        assert e.get("domain") in DOMAINS, name
        assert e.get("category") in CATEGORIES, name
        assert isinstance(e.get("reason"), str) and e["reason"].strip(), name
        if "refs" in e:
            assert isinstance(e["refs"], str) and e["refs"].strip(), name
        if "dtype_attr" in e:
            assert isinstance(e["dtype_attr"], str) and e["dtype_attr"], name
        if "thresholds" in e:  # why what it reads must not be rounded: a reason, not a flag alone
            assert isinstance(e["thresholds"], str) and e["thresholds"].strip(), name
        if "thresholds_operand" in e:  # a condition on the thresholds it reads: only with their reason
            assert e["thresholds_operand"] is True and "thresholds" in e, name
        if "periodic" in e:  # why its argument's absolute error matters: a reason, not a flag alone
            assert isinstance(e["periodic"], str) and e["periodic"].strip(), name


def test_zero_facts(entries):
    """Inputs singular at zero are input indices; an op either keeps zeros or is singular at one, not both."""
    singular = {e["op"] for e in entries if e.get("zero_singular")}
    for e in entries:
        name = f"{e['domain']}:{e['op']}"
        idx = e.get("zero_singular", [])
        assert isinstance(idx, list) and all(isinstance(i, int) and i >= 0 for i in idx), name
        assert isinstance(e.get("keeps_zeros", False), bool), name
        assert not (idx and e.get("keeps_zeros")), name
    assert {"Div", "Log", "Reciprocal", "Pow"} <= singular


def test_sensitivity_only_and_always_on_high(entries):
    for e in entries:
        name = f"{e['domain']}:{e['op']}"
        if e["category"] == "HIGH":
            assert e.get("sensitivity") in SENSITIVITIES, name
        else:
            assert "sensitivity" not in e, name


def test_fp32_inside_only_on_arithmetic_high(entries):
    for e in entries:
        name = f"{e['domain']}:{e['op']}"
        if "fp32_inside" not in e:
            continue
        assert e["category"] == "HIGH" and e["sensitivity"] == "arithmetic", name
        inside = e["fp32_inside"]
        assert isinstance(inside, dict) and inside, name
        assert set(inside) <= PROVIDERS, (name, set(inside) - PROVIDERS)
        for provider, source in inside.items():
            assert isinstance(source, str) and len(source) > 20, (name, provider)


def test_no_duplicates(entries):
    keys = [(e["op"], e["domain"]) for e in entries]
    dups = {k for k in keys if keys.count(k) > 1}
    assert not dups, dups


def test_every_standard_op_up_to_opset_23_is_covered(table):
    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == "" and s.since_version <= 23}
    assert len(names) > 150
    missing = sorted(n for n in names if (n, "ai.onnx") not in table)
    assert not missing, missing


def test_every_ml_op_is_covered(table):
    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == "ai.onnx.ml"}
    missing = sorted(n for n in names if (n, "ai.onnx.ml") not in table)
    assert not missing, missing


def test_common_contrib_ops_are_covered(table):
    for op in [
        "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "DecoderMaskedMultiHeadAttention",
        "RotaryEmbedding", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization",
        "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "BiasAdd", "BiasSplitGelu", "BiasSoftmax", "FusedMatMul",
        "FusedConv", "FusedGemm", "GroupNorm", "NhwcConv", "MatMulNBits", "MatMulInteger16", "QOrderedMatMul",
        "QLinearAdd", "QLinearConv", "DynamicQuantizeMatMul", "QAttention", "MatMulIntegerToFloat",
        "DequantizeLinear", "QuantizeLinear", "Inverse", "Range", "Trilu", "BeamSearch", "GreedySearch",
        "Sampling", "WhisperBeamSearch", "GatherND",
    ]:
        assert (op, "com.microsoft") in table, op
    # onnxruntime registers its RMSNorm and contrib LayerNorm in the ai.onnx domain
    assert ("SimplifiedLayerNormalization", "ai.onnx") in table


def test_dtype_attr_names_a_real_attribute(table):
    for (op, domain), e in table.items():
        if "dtype_attr" not in e or domain != "ai.onnx":
            continue
        try:
            schema = onnx.defs.get_schema(op, 23)
        except onnx.defs.SchemaError:
            continue
        # an attribute (Cast "to"), or for CastLike the input that carries the target type
        inputs = [i.name for i in schema.inputs]
        assert e["dtype_attr"] in schema.attributes or e["dtype_attr"] in inputs, (op, e["dtype_attr"])
    assert table[("Cast", "ai.onnx")]["dtype_attr"] == "to"
    assert table[("ConstantOfShape", "ai.onnx")]["dtype_attr"] == "value"
    for op in ["RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike", "Bernoulli"]:
        assert table[(op, "ai.onnx")]["dtype_attr"] == "dtype", op


def _cat(table, op, domain="ai.onnx"):
    return table[(op, domain)]["category"]


def test_key_decisions(table):
    for op in ["MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "LSTM"]:
        assert _cat(table, op) == "LOW", op
    for op in ["Attention", "FusedMatMul", "MatMulNBits"]:
        assert _cat(table, op, "com.microsoft") == "LOW", op
    for op in ["Exp", "Log", "Pow", "Reciprocal", "ReduceSum", "CumSum", "ReduceSumSquare"]:
        e = table[(op, "ai.onnx")]
        assert e["category"] == "HIGH" and e["sensitivity"] == "range", op
        assert "fp32_inside" not in e, op
    for op in ["Softmax", "LayerNormalization"]:
        e = table[(op, "ai.onnx")]
        assert e["category"] == "HIGH" and e["sensitivity"] == "arithmetic", op
        assert "cuda" in e["fp32_inside"], op
    assert _cat(table, "Shape") == "NONFLOAT"
    assert _cat(table, "Reshape") == "PASS"
    assert _cat(table, "Add") == "FOLLOW"


def test_decisions_where_references_disagree(table):
    # ReduceMean: TF/TVM keep FP32, torch/apex run in the input type -> FP32 accumulation only.
    e = table[("ReduceMean", "ai.onnx")]
    assert e["category"] == "HIGH" and e["sensitivity"] == "arithmetic" and "cuda" in e["fp32_inside"]
    # BatchNormalization: MindSpore FP32, TF infer -> follows (an affine map at inference).
    assert _cat(table, "BatchNormalization") == "FOLLOW"
    # Resize: torch/apex FP32, TF/TVM clear -> follows its input.
    assert _cat(table, "Resize") == "FOLLOW"
    # Min/Max/TopK: onnxconverter-common blocks them, TF/TVM clear -> precision-neutral.
    for op in ["Max", "Min", "TopK", "ReduceMax", "ReduceMin"]:
        assert _cat(table, op) == "PASS", op
    # Pow: TF deny, all others FP32 -> FP32 in and out.
    assert table[("Pow", "ai.onnx")]["sensitivity"] == "range"


def test_arithmetic_high_norms_list_providers(table):
    for key in [("RMSNormalization", "ai.onnx"), ("SimplifiedLayerNormalization", "ai.onnx"),
                ("InstanceNormalization", "ai.onnx"), ("SkipLayerNormalization", "com.microsoft"),
                ("SkipSimplifiedLayerNormalization", "com.microsoft")]:
        e = table[key]
        assert e["category"] == "HIGH" and e["sensitivity"] == "arithmetic", key
        assert {"cuda", "cpu"} <= set(e["fp32_inside"]), key


def test_reference_ops_are_covered(table):
    if not REFERENCE.exists():
        pytest.skip("shared/reference is not beside the repository")
    ref = json.loads(REFERENCE.read_text())
    # onnxruntime registers these two in the ai.onnx domain, where the table has them.
    moved = {("LayerNormalization", "com.microsoft"), ("SimplifiedLayerNormalization", "com.microsoft")}
    missing = [(r["op"], r["domain"]) for r in ref if (r["op"], r["domain"]) not in table
               and (r["op"], r["domain"]) not in moved]
    assert not missing, missing
    for op, _ in moved:
        assert (op, "ai.onnx") in table


_KERNELS_SCRIPT = r"""
import json, collections
from onnxruntime.capi import _pybind_state as C
out = collections.defaultdict(set)
for k in C.get_all_opkernel_def():
    if k.provider == "CPUExecutionProvider":
        for v in k.type_constraints.values():
            out[(k.domain or "ai.onnx") + ":" + k.op_name] |= set(v)
print(json.dumps({k: sorted(v) for k, v in out.items()}))
"""


def test_cpu_no_fp16_kernel_claims_hold(table):
    """Entries that cite 'no FP16 CPU kernel' must match the installed onnxruntime's kernel registry.

    The registry is read in a child process: with onnxruntime-gpu and no CUDA libraries it can crash.
    """
    pytest.importorskip("onnxruntime")
    proc = subprocess.run([sys.executable, "-c", _KERNELS_SCRIPT], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip("cannot read onnxruntime's kernel registry here")
    kernels = json.loads(proc.stdout)
    checked = 0
    for (op, domain), e in table.items():
        cpu = e.get("fp32_inside", {}).get("cpu", "")
        if "no FP16 CPU kernel" in cpu and "get_all_opkernel_def" in cpu:
            types = kernels.get(f"{domain}:{op}")
            assert types is not None, (op, "has no CPU kernel at all")
            assert "tensor(float16)" not in types, (op, types)
            checked += 1
    assert checked >= 5


def test_gemm_layouts_name_their_schemas_inputs_and_attributes(entries):
    """Each Tensor Core op's product layout (``[op.gemm]``) names inputs and attributes of the op's ONNX
    schema, in the order its kind reads them, and says where it is defined."""
    laid_out = {}
    for e in entries:
        if "gemm" not in e:
            continue
        gemm, name = e["gemm"], e["op"]
        assert e.get("tensor_core") and e["domain"] == "ai.onnx", name
        assert set(gemm) <= GEMM_KEYS and len(gemm["source"]) > 40 and gemm["source"].startswith(f"ONNX {name}:"), name
        schema = onnx.defs.get_schema(name, 23)
        inputs = [i.name for i in schema.inputs]
        assert all(0 <= i < len(inputs) for i in (*gemm.get("operands", ()), gemm.get("bias", 0))), name
        assert all(a in schema.attributes for a in gemm.get("transpose", ())), name
        if gemm["kind"] in ("conv", "conv_transpose"):
            assert "group" in schema.attributes, name
        if gemm["kind"] == "einsum":
            assert "equation" in schema.attributes and "operands" not in gemm, name
        laid_out[name] = (gemm["kind"], [inputs[i] for i in gemm.get("operands", ())], gemm.get("bias"))
    recurrent = ("recurrent", ["X", "W", "R"], None)
    assert laid_out == {
        "MatMul": ("matmul", ["A", "B"], None), "Gemm": ("matmul", ["A", "B"], 2), "Conv": ("conv", ["X", "W"], 2),
        "ConvTranspose": ("conv_transpose", ["X", "W"], 2), "Einsum": ("einsum", [], None),
        "LSTM": recurrent, "GRU": recurrent, "RNN": recurrent,
    }
    takes_fp8 = [e for e in entries if e.get("fp8_inputs")]
    assert all(e["fp8_inputs"] == e["gemm"]["operands"] for e in takes_fp8)  # FP8 Q/DQ on the product's operands


def test_a_gemm_layout_is_checked_when_the_table_is_read():
    from amp_compiler.policy import GemmKind, PolicyTable

    def table(layout: str) -> PolicyTable:
        return PolicyTable.from_toml(f'[[op]]\nop = "MatMul"\ncategory = "LOW"\nreason = "r"\n[op.gemm]\n{layout}\n')

    gemm = table('kind = "matmul"\noperands = [0, 1]\nsource = "ONNX MatMul"').get("", "MatMul").gemm
    assert gemm is not None and gemm.kind is GemmKind.MATMUL and gemm.weight_axes(3) == (1, 2)
    assert gemm.weight_axes(2, transposed=True) == (1, 0)
    for bad, message in [
        ('kind = "matmul"\noperands = [0]\nsource = "s"', "names"),
        ('kind = "conv"\noperands = [0, 1]\ntranspose = ["a", "b"]\nsource = "s"', "transpose"),
        ('kind = "matmul"\noperands = [0, 1]', "source"),
        ('kind = "outer"\noperands = [0, 1]\nsource = "s"', "outer"),
    ]:
        with pytest.raises(ValueError, match=message):
            table(bad)


def test_attribute_cases_name_a_real_attribute_and_its_values(entries):
    """Every ``[[op.when]]`` names an attribute of the op's schema, string values, a reason, and on HIGH a
    sensitivity; the table reads each into an :class:`AttributeCase` whose policy is the entry's with them."""
    from amp_compiler.policy import default_table, schemas

    cased = [e for e in entries if "when" in e]
    assert {e["op"] for e in cased} >= {"ScatterElements", "ScatterND", "DequantizeLinear"}
    for e in cased:
        schema = schemas.lookup(e["domain"], e["op"], 100)
        for case in e["when"]:
            if "constant_inputs" in case:  # a case on constant inputs: real inputs of the schema, no attribute
                assert "attribute" not in case and "values" not in case, e["op"]
                assert all(0 <= i < len(schema.inputs) for i in case["constant_inputs"]), e["op"]
                assert all(0 <= i < len(schema.inputs) for i in case.get("scale_inputs", ())), e["op"]
                assert case["reason"].strip() and case["category"] in CATEGORIES, e["op"]
                continue
            attributes = onnx.defs.get_schema(e["op"], domain="" if e["domain"] == "ai.onnx" else e["domain"]).attributes
            assert case["attribute"] in attributes, (e["op"], case["attribute"])
            assert case["values"] and all(isinstance(v, str) for v in case["values"]), e["op"]
            assert case["reason"].strip() and case["category"] in CATEGORIES, e["op"]
            assert (case.get("sensitivity") in SENSITIVITIES) == (case["category"] == "HIGH"), e["op"]
        entry = default_table().get(e["domain"], e["op"])
        assert len(entry.when) == len(e["when"]) and all(c.policy.op == e["op"] and not c.policy.when for c in entry.when)


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_a_scatter_that_sums_is_high_and_one_that_moves_values_is_pass(op):
    """A scatter-add is a segment sum (FP32 like ReduceSum); none/max/min only move values."""
    from amp_compiler.policy import Category, Sensitivity, default_table

    entry = default_table().get("", op)
    for reduction, category in (("add", Category.HIGH), ("mul", Category.HIGH), ("none", Category.PASS),
                                ("max", Category.PASS), ("min", Category.PASS), (None, Category.PASS)):
        chosen = entry.resolve(lambda name, r=reduction: r if name == "reduction" else None)
        assert chosen.category is category, (op, reduction)
        if category is Category.HIGH:
            assert chosen.sensitivity is Sensitivity.RANGE and "segment sum" in chosen.reason


def test_a_case_without_values_or_reason_is_refused():
    from amp_compiler.policy import PolicyTable

    text = """
[[op]]
op = "ScatterElements"
category = "PASS"
reason = "moves values"

[[op.when]]
attribute = "reduction"
values = ["add"]
category = "HIGH"
"""
    with pytest.raises(ValueError, match="names an attribute and its values, or constant inputs, and a reason"):
        PolicyTable.from_toml(text)
