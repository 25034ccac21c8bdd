"""Cast placement by minimum cut: known optima on small graphs, never worse than painting."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.core.plan import Role, Rule
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.passes.analysis import MinCutPlacementPass
from amp_compiler.passes.analysis.mincut import _output_penalties, _tensors, total_cast_bytes
from amp_compiler.passes.analysis.pipeline import AnalysisSettings, plan_precisions
from amp_compiler.policy import default_table
from amp_compiler.targets import Provider, Target
from models import catalog
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _slice_then_matmul():
    """A big FP32 graph input, sliced down 64x (to [4, 16]) before a MatMul: cast after the Slice, not before."""
    return model(
        [
            helper.make_node("Slice", ["x", "starts", "ends"], ["s"], name="slice"),
            helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
        ],
        [vi("x", F32, [64, 64])], [vi("y", F32, [4, 16])],
        [
            tensor("starts", np.array([0, 0], np.int64)), tensor("ends", np.array([4, 16], np.int64)),
            tensor("w", weights((16, 16))),  # K = 16: a shorter product of the input is raw-small-product's
        ],
    )


def test_cast_goes_to_the_smaller_side_of_a_slice():
    m = _slice_then_matmul()
    painted = convert(m, placement="paint", probe=False)
    placed = convert(m, probe=False)
    d = {x.node: x for x in placed.decisions}
    assert {x.node: x for x in painted.decisions}["slice"].precision == "fp16"  # painting: cast 64x64
    assert d["slice"].precision == "fp32" and d["slice"].rule == "placement.min-cut"
    assert placed.cast_bytes_painting == (64 * 64 + 4 * 16) * 6
    assert placed.cast_bytes == (4 * 16 + 4 * 16) * 6
    validate(placed.model)
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    assert compare("y", run_onnxruntime(m, {"x": x})[0], run_onnxruntime(placed.model, {"x": x})[0]).cosine > 0.999


def test_one_cast_serves_every_user_of_a_tensor():
    """An FP32 tensor read by three low-precision ops needs one Cast, not three: the cut pays it once."""
    m = model(
        [
            helper.make_node("Exp", ["x"], ["e"], name="exp"),
            helper.make_node("MatMul", ["e", "w"], ["a"], name="mm1"),
            helper.make_node("MatMul", ["e", "w"], ["b"], name="mm2"),
            helper.make_node("MatMul", ["e", "w"], ["c"], name="mm3"),
            helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum"),
        ],
        [vi("x", F32, [4, 4])], [vi("y", F32, [4, 4])], [tensor("w", weights((4, 4)))],
    )
    r = convert(m, probe=False)
    assert r.cast_bytes <= r.cast_bytes_painting
    to_low = [n for n in r.model.graph.node if n.op_type == "Cast" and n.input[0] == "e"]
    assert len(to_low) == 1


def test_painting_only_is_still_available_and_unknown_placement_is_an_error():
    from amp_compiler.errors import OptionError

    assert convert(_slice_then_matmul(), placement="paint", probe=False).cast_bytes is None
    with pytest.raises(OptionError, match="placement"):
        convert(_slice_then_matmul(), placement="greedy", probe=False)


@pytest.mark.parametrize("entry", catalog.entries("small"), ids=lambda e: e.name)
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_never_more_cast_bytes_than_painting(entry, target):
    """At most painting's bytes, and more only to compute an FP32 graph output in FP32 (at most one
    Cast of each such output more)."""
    model = catalog.load(entry)
    r = convert(model, target=target, probe=False)
    assert r.cast_bytes is not None and r.cast_bytes_painting is not None
    if r.cast_bytes > r.cast_bytes_painting:
        outputs = onnx.shape_inference.infer_shapes(model).graph.output
        dims = [[d.dim_value if d.dim_value > 0 else 1 for d in o.type.tensor_type.shape.dim] for o in outputs]
        assert r.cast_bytes <= r.cast_bytes_painting + sum(6 * int(np.prod(d)) for d in dims)
        assert any(d.rule == "placement.min-cut" and "FP32 graph output" in d.reason for d in r.decisions)


def _transpose_chain_then_slice(n: int):
    """A 64x64 FP32 input through ``n`` Transposes (PASS ops), sliced to 4x16 before a MatMul.

    Painting spreads low precision from the MatMul back through every PASS op and casts the 64x64
    input; the optimum casts after the Slice, ``n + 1`` ops away from painting's Cast, so the band
    around painting's Cast has to grow across the whole chain before its bounds meet."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("Transpose", [prev], [f"t{i}"], name=f"tr{i}", perm=[1, 0]))
        prev = f"t{i}"
    nodes += [
        helper.make_node("Slice", [prev, "starts", "ends"], ["s"], name="slice"),
        helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
    ]
    return model(
        nodes, [vi("x", F32, [64, 64])], [vi("y", F32, [4, 16])],
        [
            tensor("starts", np.array([0, 0], np.int64)), tensor("ends", np.array([4, 16], np.int64)),
            tensor("w", weights((16, 16))),
        ],
    )


@pytest.mark.parametrize("n", [1, 7, 40])
def test_cast_moves_across_a_long_chain_to_the_small_side(n):
    placed = convert(_transpose_chain_then_slice(n), probe=False)
    d = {x.node: x for x in placed.decisions}
    assert placed.cast_bytes_painting == (64 * 64 + 4 * 16) * 6
    assert placed.cast_bytes == (4 * 16 + 4 * 16) * 6
    assert all(d[f"tr{i}"].precision == "fp32" for i in range(n))
    assert d["slice"].precision == "fp32" and d["mm"].precision == "fp16"
    validate(placed.model)


def _painted(m):
    """The precision graph and plan of ``m`` right after painting (convert's analyses, in order)."""
    irm = ir.from_proto(onnx.shape_inference.infer_shapes(m))
    graph = build_precision_graph(irm, Target.FP16, default_table())
    return graph, plan_precisions(graph, AnalysisSettings(Target.FP16, Provider.CUDA, placement="paint"))


def _random_graph(seed: int):
    """A random DAG of MatMul (low), Exp (FP32), Add/Tanh (follow), Relu/Concat/Slice (pass) over
    tensors of 2 to 32 rows, so that cast sizes differ; dangling tensors are graph outputs."""
    rng = np.random.default_rng(seed)
    rows = {"x": 8, "x2": 4}
    nodes, inits = [], [tensor("w", weights((4, 4))), tensor("half", np.array([0], np.int64))]
    for i in range(int(rng.integers(10, 18))):
        names = sorted(rows)
        a = names[rng.integers(len(names))]
        same = [b for b in names if rows[b] == rows[a]]
        b = same[rng.integers(len(same))]
        op = rng.choice(["MatMul", "Exp", "Add", "Tanh", "Relu", "Concat", "Slice"], p=[.25, .05, .15, .1, .15, .15, .15])
        out = f"v{i}"
        if op == "MatMul":
            nodes.append(helper.make_node(op, [a, "w"], [out], name=out))
        elif op == "Add":
            nodes.append(helper.make_node(op, [a, b], [out], name=out))
        elif op == "Concat" and rows[a] + rows[b] <= 32:
            nodes.append(helper.make_node(op, [a, b], [out], name=out, axis=0))
            rows[out] = rows[a] + rows[b]
            continue
        elif op == "Slice" and rows[a] >= 4:
            end = f"end{i}"
            inits.append(tensor(end, np.array([rows[a] // 2], np.int64)))
            nodes.append(helper.make_node(op, [a, "half", end], [out], name=out))
            rows[out] = rows[a] // 2
            continue
        else:
            nodes.append(helper.make_node(op if op in ("Exp", "Tanh", "Relu") else "Relu", [a], [out], name=out))
        rows[out] = rows[a]
    used = {i for n in nodes for i in n.input}
    outputs = [vi(t, F32, [r, 4]) for t, r in sorted(rows.items()) if t not in used and t.startswith("v")]
    inputs = [vi("x", F32, [8, 4]), vi("x2", F32, [4, 4])]
    return model(nodes, inputs, outputs or [vi("x", F32, [8, 4])], inits)


def free_vertices(graph, plan) -> list[int]:
    """The vertices whose colour the min-cut may choose: INFER/CLEAR ones painting left free."""
    return sorted(
        v.id for v in graph.vertices
        if plan.roles[v.id] in (Role.INFER, Role.CLEAR)
        and plan.decisions[v.id].rule not in (Rule.PAINT_DENY, Rule.PAINT_TABLE)
    )


@pytest.mark.parametrize("seed", range(60))
def test_min_cut_finds_the_optimum_of_exhaustive_search(seed):
    """On random graphs, the pass finds the cheapest of every colouring of the free vertices (cast
    bytes, plus one Cast of each FP32 graph output a numeric op computes in low precision), and
    changes nothing where painting is already optimal."""
    graph, plan = _painted(_random_graph(seed))
    low = graph.target.dtype
    painted = {v.id: plan.decisions[v.id].dtype == low for v in graph.vertices}
    free = free_vertices(graph, plan)
    tensors = _tensors(graph)
    penalties = _output_penalties(graph, plan, tensors)

    def cost(low_of):
        return total_cast_bytes(tensors, low_of) + sum(b for v, b in penalties.items() if low_of[v])

    best = min(cost({**painted, **dict(zip(free, colours))}) for colours in itertools.product((False, True), repeat=len(free)))
    MinCutPlacementPass()(graph, plan)
    final = {v.id: plan.decisions[v.id].dtype == low for v in graph.vertices}
    assert cost(final) == best and plan.cast_bytes_final == total_cast_bytes(tensors, final)
    assert plan.cast_bytes_painting == total_cast_bytes(tensors, painted)
    changed = [v for v in free if final[v] != painted[v]]
    if best == cost(painted):
        assert all(v in penalties and not final[v] for v in changed)  # ties go to FP32 for outputs only
    assert all(plan.decisions[v].rule is Rule.MINCUT for v in changed)


def _batch_then_slice():
    """x: (B, 16), dynamic B, sliced to its first row before a MatMul. With B unknown (counted as 1)
    a Cast before the Slice moves as many bytes as one after it, and painting's choice (before)
    stands; at B = 64 the Cast belongs after the Slice."""
    return model(
        [
            helper.make_node("Slice", ["x", "starts", "ends"], ["s"], name="slice"),
            helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
        ],
        [vi("x", F32, ["B", 16])], [vi("y", F32, [1, 8])],
        [
            tensor("starts", np.array([0, 0], np.int64)), tensor("ends", np.array([1, 16], np.int64)),
            tensor("w", weights((16, 8))),
        ],
    )


def test_input_shapes_decide_where_dynamic_tensors_are_cast():
    m = _batch_then_slice()
    default = convert(m, probe=False)
    assert {d.node: d.precision for d in default.decisions}["slice"] == "fp16"
    assert default.cast_bytes == default.cast_bytes_painting == (16 + 8) * 6
    shaped = convert(m, input_shapes={"x": (64, 16)}, probe=False)
    d = {x.node: x for x in shaped.decisions}
    assert d["slice"].precision == "fp32" and d["slice"].rule == "placement.min-cut"
    assert shaped.cast_bytes_painting == (64 * 16 + 8) * 6 and shaped.cast_bytes == (16 + 8) * 6
    assert shaped.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "B"  # still dynamic
    validate(shaped.model)


def test_input_shapes_name_graph_inputs():
    from amp_compiler.errors import OptionError

    with pytest.raises(OptionError, match="is not a graph input"):
        convert(_batch_then_slice(), input_shapes={"nope": (1, 16)}, probe=False)


def test_cli_input_shape_reaches_the_placement(tmp_path):
    import contextlib
    import io

    import onnx

    from amp_compiler.cli import main

    src, out = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(_batch_then_slice(), src)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["convert", str(src), "-o", str(out), "--input-shape", "x:64x16"]) == 0
    cast = next(n for n in onnx.load(out).graph.node if n.op_type == "Cast" and n.output[0] != "y")
    assert cast.input[0] == "s"  # the sliced row is cast, not the whole input
