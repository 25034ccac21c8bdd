"""Execution-provider awareness: kernel coverage data, the coverage rule, and TensorRT's typed graphs."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.write.strongly_typed import undecided_values
from amp_compiler.policy import kernels as providers
from amp_compiler.policy.kernels import KernelCoverage, coverage_for, load_snapshot, probe_registry
from amp_compiler.policy.make_kernel_snapshot import dump, merge_defs
from amp_compiler.targets import Provider
from tests.support import REPO_ROOT
from tests.support.onnx_builders import F32, model, tensor, vi, weights

DEMO = REPO_ROOT / "models" / "demo.onnx"


def _decisions(result):
    return {d.node: d for d in result.decisions}


# -- the snapshot ------------------------------------------------------------------------------


def test_snapshot_states_its_provenance_and_counts():
    data = providers.read_snapshot_data()
    assert data["provider"] == "CUDAExecutionProvider"
    assert data["onnxruntime_version"] == "1.31.1"
    assert "onnxruntime-gpu 1.31.1" in data["package"] and "sha256" in data["package"]
    assert "get_all_opkernel_def" in data["method"]
    assert data["generated_by"].startswith("python -m amp_compiler.policy.make_kernel_snapshot")
    cov = load_snapshot()
    assert data["summary"]["ops"] == len(cov.kernels)
    assert data["summary"]["ops_with_float16"] == len(cov.low_precision_ops("float16")) >= 200
    assert data["summary"]["ops_with_bfloat16"] == len(cov.low_precision_ops("bfloat16")) >= 100


def test_snapshot_matches_known_kernels_of_onnxruntime_1_31():
    cov = load_snapshot()
    fp16, bf16 = [("T", ["float16"])], [("T", ["bfloat16"])]
    assert cov.supports("", "MatMul", 13, fp16) and cov.supports("", "MatMul", 13, bf16)
    assert cov.supports("", "Conv", 11, fp16) and not cov.supports("", "Conv", 11, bf16)
    assert cov.supports("", "Conv", 22, bf16)  # BF16 convolution only from opset 22
    assert not cov.supports("", "GridSample", 16, [("T1", ["float16"])])
    assert cov.supports("", "GridSample", 16, [("T1", ["float"])])
    assert cov.supports("", "Resize", 19, [("T1", ["float16"])]) and not cov.supports("", "Resize", 19, [("T1", ["bfloat16"])])
    assert not cov.supports("", "Clip", 11, fp16) and cov.supports("", "Clip", 13, fp16)
    # LayerNormalization-17 takes FP16 data with FP32 statistics (U), not FP16 statistics
    assert cov.supports("", "LayerNormalization", 17, [("T", ["float16"]), ("U", ["float"])])
    assert not cov.supports("", "LayerNormalization", 17, [("T", ["float16"]), ("U", ["float16"])])
    assert cov.supports("com.microsoft", "FusedMatMul", 1, fp16)
    assert not cov.has_op("", "Det")


def test_snapshot_file_is_what_the_generator_writes():
    text = (Path(providers.__file__).parent / providers.SNAPSHOT).read_text("utf-8")
    assert dump(json.loads(text)) == text


def test_merging_kernel_defs_is_exact():
    defs = [
        [1, None, {"T": ["float"], "U": ["float"]}],
        [1, None, {"T": ["float16"], "U": ["float"]}],
        [1, None, {"T": ["double"], "U": ["double"]}],
        [2, 5, {"T": ["float"], "U": ["float"]}],
    ]
    merged = merge_defs(defs)
    assert [1, None, {"T": ["float", "float16"], "U": ["float"]}] in merged
    assert [1, None, {"T": ["double"], "U": ["double"]}] in merged  # (double, float) was never a kernel
    assert len(merged) == 3


# -- reading the installed registry --------------------------------------------------------------


def test_installed_cpu_registry_is_read_in_a_child_process():
    ort = pytest.importorskip("onnxruntime")
    data = probe_registry("CPUExecutionProvider")
    if data is None:
        pytest.skip("this onnxruntime cannot list its kernels")
    assert data["onnxruntime_version"] == ort.__version__
    ops = {(d or "ai.onnx", op) for d, op, *_ in data["kernels"]}
    assert ("ai.onnx", "MatMul") in ops and ("ai.onnx", "Softmax") in ops


def test_a_crashing_probe_falls_back_to_the_snapshot(monkeypatch):
    # onnxruntime-gpu without its CUDA libraries lists CUDA as available and segfaults in the registry
    monkeypatch.setattr(providers, "PROBE_SCRIPT", "import os; os.abort()")
    monkeypatch.setattr(providers, "_may_list", lambda name: True)  # as if the build shipped its library
    monkeypatch.setattr(providers, "_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.delenv(providers.SOURCE_ENV, raising=False)
    assert probe_registry("CUDAExecutionProvider") is None
    coverage_for.cache_clear()
    try:
        assert coverage_for(Provider.CUDA) is load_snapshot()
    finally:
        coverage_for.cache_clear()


def test_a_listed_provider_is_probed(monkeypatch):
    fake = {"onnxruntime_version": "9.9.9", "provider": "CUDAExecutionProvider",
            "kernels": [["", "MatMul", 13, 2**31 - 1, {"T": ["tensor(float16)"]}]]}
    monkeypatch.setattr(providers, "probe_registry", lambda name, **kw: fake)
    monkeypatch.setattr(providers, "_may_list", lambda name: True)  # as if the build shipped its library
    monkeypatch.setattr(providers, "_available_providers", lambda: ["CUDAExecutionProvider"])
    monkeypatch.delenv(providers.SOURCE_ENV, raising=False)
    coverage_for.cache_clear()
    try:
        cov = coverage_for(Provider.CUDA)
        assert cov.source == "installed onnxruntime 9.9.9 kernel registry"
        assert cov.supports("", "MatMul", 13, [("T", ["float16"])]) and not cov.has_op("", "Add")
        trt = coverage_for(Provider.TENSORRT)  # no registry: its parser's operator table
        assert trt.source.startswith("TensorRT ") and trt.fallback is cov  # what it does not import runs on CUDA
    finally:
        coverage_for.cache_clear()


# -- the coverage rule -------------------------------------------------------------------------


def _gridsample_model(opset: int = 17):
    """Conv -> GridSample -> Relu -> Conv: GridSample has no FP16 kernel on CUDA in onnxruntime 1.31."""
    rng = np.random.default_rng(0)
    return model(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("GridSample", ["c1", "grid"], ["gs"], name="gs"),
            helper.make_node("Relu", ["gs"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
        ],
        [vi("x", F32, [1, 8, 6, 6])],
        [vi("y", F32, [1, 8, 4, 4])],
        [
            tensor("w1", weights((8, 8, 3, 3), seed=1)),
            tensor("grid", rng.uniform(-1, 1, (1, 4, 4, 2)).astype(np.float32)),
            tensor("w2", weights((8, 8, 1, 1), seed=2)),
        ],
        opset=opset, ir_version=10,
    )


def test_op_without_fp16_cuda_kernel_stays_fp32_and_its_neighbours_convert(snapshot_only):
    m = _gridsample_model()
    r = convert(m, target="fp16", provider="cuda", probe=False)
    d = _decisions(r)
    assert d["gs"].precision == "fp32" and d["gs"].rule == "provider.no-kernel"
    assert "no FP16 kernel for GridSample-16 on the CUDA provider" in d["gs"].reason
    assert "onnxruntime-gpu 1.31.1 kernel registry snapshot" in d["gs"].reason
    assert d["conv1"].precision == d["relu"].precision == d["conv2"].precision == "fp16"
    node = next(n for n in r.model.graph.node if n.name == "gs")
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(r.model).graph.value_info}
    assert types[node.input[0]] == types[node.output[0]] == onnx.TensorProto.FLOAT  # fed and read through Casts
    validate(r.model)
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 8, 6, 6)).astype(np.float32)}
    acc = compare("y", run_onnxruntime(m, feeds)[0], run_onnxruntime(emulate(r.model), feeds)[0])
    assert acc.finite and acc.cosine > 0.999


def test_coverage_depends_on_provider_and_target(snapshot_only):
    m = _gridsample_model()
    # TensorRT builds GridSample itself in the graph's types: nothing to pin
    assert _decisions(convert(m, provider="tensorrt", probe=False))["gs"].precision == "fp16"
    # Resize-19 has an FP16 CUDA kernel but no BF16 one
    r = model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
            helper.make_node("Reshape", ["a", "shape4"], ["a4"], name="to4d"),
            helper.make_node("Resize", ["a4", "", "scales"], ["b4"], name="resize", mode="linear"),
            helper.make_node("Reshape", ["b4", "shape2"], ["b"], name="to2d"),
            helper.make_node("MatMul", ["b", "w2"], ["y"], name="mm2"),
        ],
        [vi("x", F32, [4, 16])],  # K = 16: a shorter product of x stays FP32 (policy.high.raw-small-product)
        [vi("y", F32, [8, 8])],
        [
            tensor("w1", weights((16, 8), seed=1)), tensor("w2", weights((16, 8), seed=2)),
            tensor("shape4", np.array([1, 1, 4, 8], np.int64)), tensor("shape2", np.array([8, 16], np.int64)),
            tensor("scales", np.array([1, 1, 2, 2], np.float32)),
        ],
        opset=19,
    )
    fp16 = _decisions(convert(r, target="fp16", provider="cuda", probe=False))
    bf16 = _decisions(convert(r, target="bf16", provider="cuda", probe=False))
    assert fp16["resize"].output_dtypes == ["fp16"]  # "mixed": its scales stay float by the schema
    assert bf16["resize"].output_dtypes == ["fp32"] and bf16["resize"].rule == "provider.no-kernel"
    assert "no BF16 kernel for Resize-19 on the CUDA provider" in bf16["resize"].reason
    assert bf16["mm1"].precision == bf16["mm2"].precision == "bf16"


def test_user_and_schema_decisions_are_not_overwritten(snapshot_only):
    m = _gridsample_model()
    d = _decisions(convert(m, provider="cuda", block_ops=["GridSample"], probe=False))
    assert d["gs"].rule == "user.block-op"


def test_cpu_provider_reports_missing_kernels_without_pinning():
    cov = coverage_for(Provider.CPU)
    if cov is None:
        pytest.skip("cannot read the installed CPU provider's registry")
    d = _decisions(convert(_gridsample_model(), target="fp16", provider="cpu", probe=False))
    # onnxruntime's CPU provider inserts Casts around a node without an FP16 kernel itself
    assert d["gs"].precision == "fp16"
    assert "no FP16 kernel for GridSample-16 on the CPU provider" in d["gs"].reason


def test_the_pass_accepts_a_given_coverage():
    import onnx_ir as ir

    from amp_compiler.core.plan import PrecisionPlan, Role
    from amp_compiler.onnx.graph.precision_graph import build_precision_graph
    from amp_compiler.passes.analysis import ClassifyPass, KernelCoveragePass
    from amp_compiler.policy import default_table
    from amp_compiler.targets import Target

    nothing = KernelCoverage(Provider.CUDA, "0", "an empty registry", {})
    ir_model = ir.from_proto(onnx.shape_inference.infer_shapes(_gridsample_model()))
    graph = build_precision_graph(ir_model, Target.FP16, default_table())
    plan = PrecisionPlan()
    ClassifyPass()(graph, plan)
    KernelCoveragePass(Provider.CUDA, nothing)(graph, plan)
    free = [v for v in graph.vertices if v.node is not None and v.free]
    assert free and all(plan.roles[v.id] is Role.FIXED for v in free)  # FP32, without spreading
    assert "no CUDA kernel for Conv-11 in any type" in plan.role_rules[free[0].id][1]


# -- TensorRT: every precision decision is in the graph -------------------------------------------


def _check_typed_as_decided(result):
    assert undecided_values(result.model) == []
    inferred = onnx.shape_inference.infer_shapes(result.model, strict_mode=True)
    types = {}
    for g in [inferred.graph]:
        for v in list(g.input) + list(g.output) + list(g.value_info):
            types[v.name] = v.type.tensor_type.elem_type
        types.update({t.name: t.data_type for t in g.initializer})
    want = {"fp16": onnx.TensorProto.FLOAT16, "fp32": onnx.TensorProto.FLOAT, "bf16": onnx.TensorProto.BFLOAT16}
    floats = set(want.values())
    checked = 0
    for decision, node in zip(result.decisions, result.model.graph.node):
        if decision.graph != "main" or decision.precision not in want or node.op_type == "Cast":
            continue
        seen = {types[v] for v in list(node.input) + list(node.output) if v and types.get(v) in floats}
        assert seen <= {want[decision.precision]} or decision.rule == "fixed", (node.name, decision.precision, seen)
        checked += 1
    assert checked


@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_tensorrt_output_carries_every_precision_decision_in_its_types(target):
    result = convert(onnx.load(DEMO), target=target, provider="tensorrt", probe=False)
    validate(result.model)
    _check_typed_as_decided(result)


def test_tensorrt_gridsample_model_is_fully_typed():
    _check_typed_as_decided(convert(_gridsample_model(), provider="tensorrt", probe=False))


def test_undecided_values_finds_untyped_tensors():
    m = model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [vi("x", F32, [2])],
        [vi("y", F32, [2])],
    )
    assert undecided_values(m) == []
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
    with pytest.raises(onnx.shape_inference.InferenceError):
        undecided_values(m)  # strict inference refuses a graph input without a type


def test_a_build_without_the_provider_library_is_not_imported_to_ask(monkeypatch, tmp_path):
    """The CPU wheel ships no CUDA provider library: CUDA is known unlisted without importing
    onnxruntime; a package folder that has the library is asked (True: import it and ask)."""
    import importlib.machinery

    package = tmp_path / "onnxruntime"
    (package / "capi").mkdir(parents=True)
    spec = importlib.machinery.ModuleSpec("onnxruntime", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(providers.importlib.util, "find_spec", lambda name: spec)
    assert not providers._may_list("CUDAExecutionProvider")
    assert providers._may_list("CPUExecutionProvider")
    (package / "capi" / "libonnxruntime_providers_cuda.so").write_bytes(b"")
    assert providers._may_list("CUDAExecutionProvider")
    monkeypatch.setattr(providers.importlib.util, "find_spec", lambda name: None)
    assert not providers._may_list("CPUExecutionProvider")


# -- attribute-dependent kernel limits ------------------------------------------------------------


def _scatter_feeds(edges: int = 3000):
    rng = np.random.default_rng(0)
    return {"msg": rng.standard_normal((edges, 4)).astype(np.float32), "dst": rng.integers(0, 8, edges).astype(np.int64)}


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
@pytest.mark.parametrize("reduction", ["add", "max"])
def test_a_scatter_written_for_the_cpu_provider_runs_there(op, reduction):
    """onnxruntime's CPU scatter kernels are registered for FP16 but refuse it for reductions at run time
    ("MLFloat16 data type is not supported with ScatterElements opset 16 when reduction is 'add'"); even
    forced low by the user, the written model runs."""
    from tests.support.onnx_builders import scatter_hub_model

    if coverage_for(Provider.CPU) is None:
        pytest.skip("cannot read the installed CPU provider's registry")
    m = scatter_hub_model(op, reduction)
    for allow in ((), (op,)):
        result = convert(m, provider="cpu", allow_ops=list(allow), probe=False)
        run_onnxruntime(result.model, _scatter_feeds())  # raised before: the FP16 kernel refused the reduction
    d = _decisions(result)["node"]
    if op == "ScatterND" or reduction == "add":  # what onnxruntime 1.32's CPU kernels refuse in FP16
        assert (d.precision, d.rule) == ("fp32", "provider.no-kernel")
        assert f"kernel refuses FP16 with reduction='{reduction}'" in d.reason
    else:
        assert d.precision == "fp16"  # ScatterElements max runs in FP16 on the CPU provider


def test_cpu_kernel_limits_hold_for_the_installed_onnxruntime():
    """Each CPU limit of ``ort_kernel_limits.json`` fails in onnxruntime, and each float type and
    reduction it does not list runs (the limits are measured, not guessed)."""
    from onnx import TensorProto

    from amp_compiler.policy.kernels import load_limits

    if coverage_for(Provider.CPU) is None:
        pytest.skip("cannot read the installed CPU provider's registry")
    limits = load_limits(Provider.CPU)
    types = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16, "float": TensorProto.FLOAT}
    for op in ("ScatterElements", "ScatterND"):
        for reduction in ("none", "add", "mul", "max", "min"):
            for name, elem in types.items():
                attrs = {"axis": 0} if op == "ScatterElements" else {}
                nodes = [helper.make_node("Cast", ["d"], ["dc"], to=elem), helper.make_node("Cast", ["u"], ["uc"], to=elem),
                         helper.make_node(op, ["dc", "i", "uc"], ["yc"], reduction=reduction, **attrs),
                         helper.make_node("Cast", ["yc"], ["y"], to=F32)]
                m = model(nodes, [vi("d", F32, [4, 1]), vi("i", onnx.TensorProto.INT64, [2, 1]), vi("u", F32, [2, 1])],
                          [vi("y", F32, [4, 1])])
                refused = any(lim.refuses_node(18, reduction, name) for lim in limits.get(("ai.onnx", op), ()))
                feeds = {"d": np.ones((4, 1), np.float32), "i": np.zeros((2, 1), np.int64), "u": np.ones((2, 1), np.float32)}
                try:
                    run_onnxruntime(m, feeds)
                    ran = True
                except Exception as exc:  # onnxruntime's own error type
                    assert "not supported" in str(exc), (op, reduction, name, exc)
                    ran = False
                assert ran != refused, (op, reduction, name)
