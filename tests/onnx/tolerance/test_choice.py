"""--tolerance's choice per unit: the levels' values, the switches each level turns on, and the nodes
each picked level pins or keeps (the choice among the levels: tests/core/test_choice.py)."""

from __future__ import annotations

from onnx import helper

from amp_compiler.onnx.tolerance.choice import Level, decide, switches_on, unit_choices, value
from amp_compiler.onnx.tolerance.units import Unit
from amp_compiler.targets import Target
from tests.support.onnx_builders import model, tensor, vi, weights


def test_levels_are_worth_the_gemm_time_they_save_against_tf32():
    # FP32 runs as TF32 at half FP16's rate, FP8 at twice it: FP16 saves 1 s per FP16-second, FP8 1.5
    assert value(1000, Target.FP16) == 2000 and value(1000, Target.BF16) == 2000
    assert value(1000, Target.FP8) == 3000
    # --fp32-products split: FP32 is four TF32 products, 8 FP16-seconds per FP16-second: FP16 saves 7, FP8 7.5
    assert value(1000, Target.FP16, "split") == 14000 and value(1000, Target.FP8, "split") == 15000


def test_a_tensor_core_unit_with_followers_has_every_level_cheaper_ones_first():
    errors = {}

    def alone(on):
        errors[on] = 0.01 * len(on)
        return errors[on]

    unit = Unit((3, 4, 5), 1000)
    got = unit_choices(alone, unit, (7, 8), 9, Target.FP16)
    assert [c.level for c in got] == [Level.FP32, Level.LOW_ROOT, Level.LOW, Level.FP8_ROOT, Level.FP8]
    assert [c.groups for c in got] == [frozenset(), {7}, {7, 8}, {7, 9}, {7, 8, 9}]
    values = [c.option.value for c in got]
    assert values == sorted(values) and values[2] == values[1] + 1  # followers low: one more, fewer pins
    cheap = unit_choices(alone, Unit((6,), 0), (10,), None, Target.FP16)
    assert [(c.level, c.option.value) for c in cheap] == [(Level.FP32, 0), (Level.LOW, 1)]
    assert switches_on([got, cheap], [3, 1]) == {7, 9, 10} and switches_on([got, cheap], [0, 0]) == frozenset()



def test_a_unit_whose_tensor_core_op_alone_is_beyond_the_room_is_not_measured_whole():
    measured = []

    def alone(on):
        measured.append(on)
        return {frozenset({7}): 0.05, frozenset({7, 9}): 0.002}.get(on, 0.001)

    unit = Unit((3, 4, 5), 1000)
    got = unit_choices(alone, unit, (7, 8), 9, Target.FP16, room=0.01)
    # low-root (0.05) is beyond the room: low and fp8 take its error unmeasured; fp8-root (0.002) is not
    assert measured == [{7}, {7, 9}, {7, 8, 9}]
    assert [(c.level, c.option.error, c.measured) for c in got] == [
        (Level.FP32, 0.0, True), (Level.LOW_ROOT, 0.05, True), (Level.LOW, 0.05, False),
        (Level.FP8_ROOT, 0.002, True), (Level.FP8, 0.001, True)]
    measured.clear()
    assert [c.option.error for c in unit_choices(alone, unit, (7, 8), None, Target.FP16)] == [0.0, 0.05, 0.001]
    assert measured == [{7}, {7, 8}]  # no room given: every level measured


def _chain():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["h1"], name="bias"),
             helper.make_node("Relu", ["h1"], ["y"], name="act")]
    return model(nodes, [vi("x", shape=[4, 8])], [vi("y", shape=[4, 8])],
                 [tensor("w", weights([8, 8], 1)), tensor("b", weights([8], 2))])


def test_decide_gives_every_node_of_a_unit_one_place_with_the_measured_numbers():
    graph = _chain().graph
    unit = Unit((0, 1, 2), 512)
    item = unit_choices(lambda on: 0.001 * len(on), unit, (0, 1), 2, Target.FP16)
    by_level = {c.level: k for k, c in enumerate(item)}
    for level, pinned, kept, fp8 in [
        (Level.FP32, [0, 1, 2], [], []),
        (Level.LOW_ROOT, [1, 2], [0], []),
        (Level.LOW, [], [0, 1, 2], []),
        (Level.FP8_ROOT, [1, 2], [0], [0]),
        (Level.FP8, [], [0, 1, 2], [0]),
    ]:
        d = decide(graph, [unit], [item], [by_level[level]], 0.01, Target.FP16)
        assert ([i for i, _ in d.pinned], [i for i, _ in d.kept], [i for i, _ in d.fp8]) == (pinned, kept, fp8)
        assert all("--tolerance 0.01" in why and "MatMul 'mm'" in why for _, why in d.pinned + d.kept + d.fp8)


def test_a_pin_whose_unit_was_not_measured_whole_reports_its_tensor_core_op_alone():
    graph = _chain().graph
    unit = Unit((0, 1, 2), 512)
    item = unit_choices(lambda on: 0.03 if on == {0} else 0.5, unit, (0, 1), None, Target.FP16, room=0.01)
    d = decide(graph, [unit], [item], [0], 0.01, Target.FP16)
    assert [i for i, _ in d.pinned] == [0, 1, 2]
    assert all("in fp16 alone MatMul 'mm' moves the outputs by 3.00e-02 (relative L2) before the 2 op(s) it feeds"
               in why for _, why in d.pinned)
