"""``--tolerance``'s per-node errors come from both models run as chains of pieces: no session holds more
than a piece's tensors, and the error sums are those of the two whole models run with every tensor
exposed, in this process and in the child alike."""

from __future__ import annotations

import os

import numpy as np
import pytest

from amp_compiler.onnx.convert import convert
from amp_compiler.onnx.measure.chain import ModelChain, exposed_model
from amp_compiler.onnx.measure.emulate import emulate, rounded_origin
from amp_compiler.onnx.measure.pieces import MAX_NODES
from amp_compiler.onnx.tolerance.refine import measure
from amp_compiler.runtime.runner import ChildRunner, InProcessRunner
from amp_compiler.targets import Target
from models import catalog


def _model(name: str, n: int, target: str = "fp16"):
    entry = catalog.get(name)
    fp32 = catalog.load(entry)
    samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(n)]
    return fp32, emulate(convert(fp32, probe=False, target=target).model), samples


def _pairs(reference_names, converted_names):
    stored = {n: n for n in converted_names}
    stored.update({o: n for n in converted_names if (o := rounded_origin(n)) is not None})
    return [(n, stored[n]) for n in reference_names if n in stored]


@pytest.mark.parametrize("runner_type", [InProcessRunner, ChildRunner])
@pytest.mark.parametrize(("name", "target"), [("mobilenetv2-small", "fp16"), ("text-det-sigmoid", "fp16"),
                                              ("resnet50-small", "bf16")])
def test_the_chains_sums_are_the_whole_models(runner_type, name, target, monkeypatch):
    from amp_compiler.onnx.measure import chain as chain_module

    monkeypatch.setattr(chain_module, "LEAST_PIECE_BYTES", 0)  # the small entries cut as large models are
    fp32, emulated, samples = _model(name, 2, target)
    with runner_type() as runner:
        reference, converted = ModelChain(fp32, runner, samples[0]), ModelChain(emulated, runner, samples[0])
        assert len(reference.sessions) > 1 and len(converted.sessions) > 1
        pairs = _pairs(reference.names, converted.names)
        outputs = [(o.name, o.name) for o in fp32.graph.output]
        whole_ref, ref_names = exposed_model(fp32)
        whole_conv, conv_names = exposed_model(emulated)
        assert pairs == _pairs(ref_names, conv_names)
        whole = [runner.load(whole_ref, basic=True)], [runner.load(whole_conv, basic=True)]
        for sample in samples:
            chained = runner.compare(reference.sessions, converted.sessions, sample, pairs, outputs, 1)
            at_once = runner.compare(*whole, sample, pairs, outputs, 2)
            for got, expected in zip([*chained[0], *chained[1]], [*at_once[0], *at_once[1]], strict=True):
                np.testing.assert_array_equal(got, expected)
        sums = runner.errors(1)
        assert sums == runner.errors(2) and len(sums) == len(pairs)
        assert any(s[0] > 0 for s in sums.values())  # the conversion moved something


class _Counting(InProcessRunner):
    """Records the number of outputs of every model it loads."""

    def __init__(self):
        super().__init__()
        self.outputs: list[int] = []

    def load(self, model, **kwargs):
        self.outputs.append(len(model.graph.output))
        return super().load(model, **kwargs)


def test_measure_holds_no_more_than_a_pieces_tensors_at_once():
    fp32, _, samples = _model("mobilenetv2-small", 2)
    converted = convert(fp32, probe=False).model
    runner = _Counting()
    errors, outputs, runs = measure(fp32, converted, samples, Target.FP16, runner=runner)
    assert errors and outputs and runs == 2
    assert len(runner.outputs) > 2  # two chains of pieces, not two whole models
    assert max(runner.outputs) <= MAX_NODES < len(exposed_model(fp32)[1])  # a piece's tensors, not the model's


def test_the_in_process_and_the_child_runner_measure_the_same():
    fp32, _, samples = _model("ctc-wide-softmax", 2)
    converted = convert(fp32, probe=False).model
    with InProcessRunner() as here, ChildRunner() as child:
        a, b = (measure(fp32, converted, samples, Target.FP16, runner=r) for r in (here, child))
    assert a[1] == b[1] and a[2] == b[2]
    assert {i: e.rel_l2 for i, e in a[0].items()} == {i: e.rel_l2 for i, e in b[0].items()}


class _Recording(InProcessRunner):
    """An in-process runner that keeps the pieces it was given and the folder their data is in."""

    def load_chain(self, models, *, basic=False, chained=False, data_folder=None, prepack=True):
        self.pieces = [m.__deepcopy__() for m in models]
        self.folder = data_folder
        from amp_compiler.runtime.session import Runner

        return Runner.load_chain(self, iter(self.pieces), basic=basic, chained=chained, data_folder=data_folder,
                                 prepack=prepack)


@pytest.mark.parametrize("runner_type", [InProcessRunner, ChildRunner])
def test_the_pieces_weights_lie_in_one_file_the_chain_removes(runner_type):
    """Every large weight is written once into a file the pieces refer to (no piece carries its bytes,
    none is written twice), the sessions read it there, and it is gone once they are made."""
    import onnx

    model = catalog.load("resnet50-small")
    sample = catalog.get("resnet50-small").make_inputs(np.random.default_rng(0))
    large = {t.name: t for t in model.graph.initializer if len(t.raw_data) >= 1024}
    seen = {}

    class _Looking(runner_type):
        def load_chain(self, models, **kwargs):
            folder = kwargs["data_folder"]
            seen["folder"], seen["bytes"] = folder, open(os.path.join(folder, "weights.bin"), "rb").read()
            return super().load_chain(models, **kwargs)

    with _Looking() as runner:
        chain = ModelChain(model, runner, sample)
        places = chain._weights.places
        assert set(places) == set(large)
        stored = seen["bytes"]
        assert all(stored[o:o + n] == large[name].raw_data for name, (o, n) in places.items())
        assert len(stored) < sum(len(t.raw_data) for t in large.values()) + 4096 * len(large)
        assert not os.path.exists(seen["folder"])  # removed once the sessions were made
        runner.fold(chain.sessions, chain.feeds(sample), 3)
        assert runner.statistics(3)
        chain.close()
    recording = _Recording()
    chain = ModelChain(model, recording, sample)
    refs = [t for p in recording.pieces for t in p.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.name for t in refs} == set(large) and not any(t.raw_data for t in refs)
    chain.close()


def test_a_chain_that_fails_to_load_leaves_no_weights_file():
    import glob
    import tempfile

    from amp_compiler.errors import ModelRefusedError

    class _Refusing(InProcessRunner):
        def load_chain(self, models, **kwargs):
            self.folder = kwargs.get("data_folder")
            raise ModelRefusedError("refused")

    runner = _Refusing()
    model = catalog.load("resnet50-small")
    before = set(glob.glob("/dev/shm/amp-chain-*")) | set(glob.glob(f"{tempfile.gettempdir()}/amp-chain-*"))
    with pytest.raises(ModelRefusedError):
        ModelChain(model, runner, catalog.get("resnet50-small").make_inputs(np.random.default_rng(0)))
    assert runner.folder is not None and not os.path.exists(runner.folder)
    after = set(glob.glob("/dev/shm/amp-chain-*")) | set(glob.glob(f"{tempfile.gettempdir()}/amp-chain-*"))
    assert after <= before


def test_without_room_for_the_weights_file_the_pieces_carry_their_weights(monkeypatch):
    """A /dev/shm without room (a container's 64 MB) is passed over for the temporary folder; where no
    folder takes the file (the write fails: ENOSPC), the pieces carry their weights, and the ranges are
    the same."""
    import errno

    from amp_compiler.onnx.measure import chain as chain_module

    assert chain_module._room("/definitely/not/a/folder", 1) is None
    assert chain_module._room(os.path.dirname(os.path.abspath(__file__)), 1 << 62) is None  # more than any disk
    model = catalog.load("resnet50-small")
    samples = [catalog.get("resnet50-small").make_inputs(np.random.default_rng(s)) for s in range(2)]
    from amp_compiler.onnx.measure.calibrate import collect_ranges

    with_file = collect_ranges(model, samples, runner=InProcessRunner())

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(chain_module.tempfile, "mkdtemp", no_room)
    recording = _Recording()
    chain = ModelChain(model, recording, samples[0])
    assert chain._weights.folder is None and recording.folder is None
    assert all(t.data_location != 1 for p in recording.pieces for t in p.graph.initializer)  # none EXTERNAL
    assert sum(len(t.raw_data) for p in recording.pieces for t in p.graph.initializer) >= sum(
        len(t.raw_data) for t in model.graph.initializer)
    chain.close()
    inline = collect_ranges(model, samples, runner=InProcessRunner())
    assert inline == with_file


def _head_split(batch: int, seq: int, heads: int, width: int):
    """A transformer's head split as exporters write it: the shape computed from the input's
    (``Shape -> Gather -> Concat -> Reshape``), then a Transpose and a MatMul of the heads."""
    import onnx
    from onnx import helper as oh

    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        oh.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        oh.make_node("Concat", ["batch", "seq", "heads", "head_width"], ["split"], axis=0),
        oh.make_node("Reshape", ["x", "split"], ["h"]),
        oh.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1, 3]),
        oh.make_node("MatMul", ["t", "w"], ["y"]),
    ]
    inits = [
        oh.make_tensor("zero", onnx.TensorProto.INT64, [1], [0]),
        oh.make_tensor("one", onnx.TensorProto.INT64, [1], [1]),
        oh.make_tensor("heads", onnx.TensorProto.INT64, [1], [heads]),
        oh.make_tensor("head_width", onnx.TensorProto.INT64, [1], [width // heads]),
        oh.make_tensor("w", onnx.TensorProto.FLOAT, [width // heads, width // heads],
                       np.eye(width // heads, dtype=np.float32).ravel()),
    ]
    graph = oh.make_graph(nodes, "heads", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", "s", width])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    return model, {"x": np.ones((batch, seq, width), np.float32)}


def test_pieces_are_sized_through_shapes_the_graph_computes():
    """Tensors after a Reshape to a computed shape are sized (data propagation), not left unknown: a
    piece whose outputs' sizes are unknown is cut by its node count alone, whatever they hold."""
    from amp_compiler.onnx.measure import chain as chain_module

    model, sample = _head_split(2, 64, 4, 32)
    light, _ = chain_module._weightless(model, sample)
    exposed, _ = exposed_model(light)
    plain = chain_module._tensor_bytes(exposed)
    sizes = chain_module._sizes(light, exposed)
    assert "t" not in plain and "y" not in plain  # what onnx's plain shape inference leaves unknown
    assert sizes["h"] == sizes["t"] == sizes["y"] == 2 * 64 * 32 * 4


def test_pieces_are_cut_no_smaller_than_least_piece_bytes(monkeypatch):
    """Pieces are not cut below LEAST_PIECE_BYTES of outputs (a small model's chain is a few sessions of
    MAX_NODES nodes, not dozens of runs of a few kB each); without that floor, at the live bytes' share."""
    from amp_compiler.onnx.measure import chain as chain_module

    model = catalog.load("mobilenetv2-small")
    sample = catalog.get("mobilenetv2-small").make_inputs(np.random.default_rng(0))
    recording = _Recording()
    ModelChain(model, recording, sample, at_once=6).close()
    whole = len(recording.pieces)
    monkeypatch.setattr(chain_module, "LEAST_PIECE_BYTES", 0)
    recording = _Recording()
    ModelChain(model, recording, sample, at_once=6).close()
    assert whole == -(-len(model.graph.node) // MAX_NODES) < len(recording.pieces)


def _resize_to_computed_sizes():
    """TorchScript's interpolation: a Resize whose ``scales`` is empty and whose ``sizes`` is computed from
    the input's shape, each value its own node (and so, cut one node a piece, ``sizes`` the border of the
    Resize's piece)."""
    import onnx
    from onnx import helper as oh

    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Slice", ["shape", "zero", "two"], ["batch_channels"]),
        oh.make_node("Concat", ["batch_channels", "eight"], ["sizes"], axis=0),
        oh.make_node("Relu", ["x"], ["r"]),
        oh.make_node("Resize", ["r", "", "scales", "sizes"], ["y"], mode="linear"),
    ]
    inits = [oh.make_tensor("zero", onnx.TensorProto.INT64, [1], [0]), oh.make_tensor("two", onnx.TensorProto.INT64, [1], [2]),
             oh.make_tensor("scales", onnx.TensorProto.FLOAT, [0], []),
             oh.make_tensor("eight", onnx.TensorProto.INT64, [2], [8, 8])]
    graph = oh.make_graph(nodes, "resize", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 3, "h", "w"])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    return model, {"x": np.random.default_rng(0).uniform(0, 1, (1, 3, 5, 6)).astype(np.float32)}


def test_pieces_inputs_keep_the_shapes_every_sample_gives_them(monkeypatch):
    """Cut one node a piece, the Resize's piece takes ``sizes`` from another: declared with its shape at
    the model's own dims (4 values), onnxruntime loads it; declared shapeless, it refused it ("Number of elements of input 'sizes' (0) must be same as rank of input 'X' (4)"), and
    calibration and the probe failed on a model onnxruntime runs."""
    from amp_compiler.onnx.measure import chain as chain_module
    from amp_compiler.onnx.measure.calibrate import collect_ranges

    monkeypatch.setattr(chain_module, "LEAST_PIECE_BYTES", 0)
    model, sample = _resize_to_computed_sizes()
    recording = _Recording()
    chain = ModelChain(model, recording, sample, at_once=1000)
    assert len(chain.sessions) > 2
    resize = next(p for p in recording.pieces if p.graph.node[-1].op_type == "Resize")
    declared = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in resize.graph.input}
    assert declared["sizes"] == [4]
    chain.close()
    other = {"x": np.ones((2, 3, 9, 4), np.float32)}  # other dims than the chain was cut at
    ranges = collect_ranges(model, [sample, other], runner=InProcessRunner())
    assert ranges["y"].count == (1 + 2) * 3 * 8 * 8


def test_a_chain_whose_pieces_onnxruntime_refuses_loads_the_model_whole():
    from amp_compiler.errors import ModelRefusedError

    class _RefusingPieces(InProcessRunner):
        def load_chain(self, models, **kwargs):
            models = list(models)
            if len(models) > 1:
                raise ModelRefusedError("onnxruntime could not load the model: a piece")
            return super().load_chain(models, **kwargs)

    model = catalog.load("mobilenetv2-small")
    sample = catalog.get("mobilenetv2-small").make_inputs(np.random.default_rng(0))
    runner = _RefusingPieces()
    chain = ModelChain(model, runner, sample)
    assert len(chain.sessions) == 1
    runner.fold(chain.sessions, chain.feeds(sample), 5)
    assert set(runner.statistics(5)) >= {o.name for o in model.graph.output}
    chain.close()
