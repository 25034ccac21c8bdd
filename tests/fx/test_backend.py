"""The torch.compile backend: the same pass, then Inductor (or another backend)."""

import warnings

import pytest
import torch

import amp_compiler.fx as ampfx
from tests.support.fx_helpers import (
    build,
    cosine,
    one_thread,  # noqa: F401 - autouse: torch on one thread
)


def _run(module, inputs, backend):
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend)
    with torch.no_grad():
        out = compiled(*inputs)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", ["resnet50-small", "mobilenetv2-small", "bert-base-small", "gpt2-small"])
def test_backend_runs_the_converted_graph(name):
    """The backend's graph (run as it is) matches FP32 and makes the decisions convert makes."""
    module, inputs, ref = build(name)
    be = ampfx.backend("fp16", inner="eager")
    out = _run(module, inputs, be)
    for r, o in zip(ref, out, strict=True):
        assert o.dtype == r.dtype and cosine(r, o) >= 0.999
    assert len(be.reports) == 1
    rep = be.reports[0]
    assert rep.mode == "compile" and [d.node for d in rep.decisions] == [n.name for n in be.graphs[0].graph.nodes]
    # Same precision for every op as the inference conversion (parameters are inputs here, so
    # batch norms are not folded and embedding tables are not stored low: compare without those).
    gm = ampfx.convert(module, inputs, fold_bn=False)
    def by_op(r):
        out = {}
        for d in r.decisions:
            if d.op_type.startswith("aten.") and "_to_copy" not in d.op_type and "embedding" not in d.op_type:
                out.setdefault(d.op_type, []).append(d.precision)
        return out
    ours, theirs = by_op(rep), by_op(ampfx.report(gm))
    for op in ("aten.conv2d.default", "aten.linear.default", "aten.addmm.default", "aten.matmul.default",
               "aten.softmax.int", "aten.layer_norm.default", "aten.batch_norm.default"):
        assert ours.get(op) == theirs.get(op), op


@pytest.mark.parametrize("name", [
    "resnet50-small",
    "bert-base-small",
    pytest.param("mobilenetv2-small", marks=pytest.mark.slow),
    pytest.param("gpt2-small", marks=pytest.mark.slow),
])
def test_inductor_gives_the_same_outputs(name):
    module, inputs, ref = build(name)
    eager = _run(module, inputs, ampfx.backend("fp16", inner="eager"))
    inductor_backend = ampfx.backend("fp16")
    compiled = _run(module, inputs, inductor_backend)
    assert inductor_backend.reports and inductor_backend.reports[0].casts_inserted > 0
    for r, e, c in zip(ref, eager, compiled, strict=True):
        assert cosine(r, c) >= 0.999
        # Inductor fuses the casts with their neighbours but computes what the graph says.
        assert torch.allclose(c, e, rtol=2e-2, atol=2e-2 * float(e.abs().max()))


def test_training_through_the_backend_updates_fp32_parameters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    be = ampfx.backend("bf16", inner="eager")
    compiled = torch.compile(model, backend=be)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    before = model[0].weight.detach().clone()
    torch._dynamo.reset()
    loss = torch.nn.functional.mse_loss(compiled(x), y)
    loss.backward()
    opt.step()
    assert model[0].weight.dtype == torch.float32 and model[0].weight.grad.dtype == torch.float32
    assert not torch.equal(model[0].weight, before)
    d = {r.node: r for r in be.reports[0].decisions}
    assert d["linear"].precision == "bf16"


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(40, 32, 2, batch_first=True)
        self.proj = torch.nn.Linear(32, 16)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.proj(y[:, -1])


def test_a_model_dynamo_does_not_trace_warns_instead_of_running_silently_unconverted():
    """Dynamo does not trace nn.LSTM by default: the backend then sees no graph at all."""
    torch._dynamo.reset()
    compiled = ampfx.compile(_Encoder().eval(), "fp16", inner="eager")
    x = torch.randn(2, 10, 40)
    with pytest.warns(ampfx.NoGraphWarning, match="no graph: the model ran unconverted.*LSTM.*allow_rnn=True"):
        compiled(x)
    assert not compiled.amp_backend.graphs
    torch._dynamo.reset()
    traced = ampfx.compile(_Encoder().eval(), "fp16", inner="eager", allow_rnn=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampfx.NoGraphWarning)
        traced(x)
    ops = {d.op_type: d.precision for d in traced.amp_backend.reports[0].decisions}
    assert ops["aten.lstm.input"] == ops["aten.linear.default"] == "fp16"


class _Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.n = torch.nn.LayerNorm(64)
        self.b = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.b(self.n(torch.relu(self.a(x)))).softmax(-1)


SHAPES = [(2, 5, 64), (3, 9, 64), (4, 17, 64), (5, 6, 64), (6, 7, 64)]


def test_dynamic_shapes_compile_one_graph_for_every_shape():
    """The analysis reads a symbolic size's hint without a guard: no graph specialized to one shape."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _Tokens().eval()
    compiled = ampfx.compile(m, "fp16", inner="eager", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", ampfx.NoGraphWarning)
        for shape in SHAPES:
            x = torch.randn(*shape)
            out = compiled(x)
            assert not torch.equal(out, m(x)) and cosine(out, m(x)) > 0.999  # converted, and close
    assert len(compiled.amp_backend.graphs) == 1


def test_a_call_past_dynamos_recompile_limit_warns_that_it_ran_unconverted():
    torch._dynamo.reset()
    torch.manual_seed(0)
    compiled = ampfx.compile(_Tokens().eval(), "fp16", inner="eager", dynamic=False)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=2):
        with warnings.catch_warnings():
            warnings.simplefilter("error", ampfx.NoGraphWarning)
            compiled(torch.randn(*SHAPES[0]))
            compiled(torch.randn(*SHAPES[1]))
            compiled(torch.randn(*SHAPES[0]))  # a graph already compiled: it runs converted
        with pytest.warns(ampfx.NoGraphWarning, match="without any of the 2 graph.*recompile_limit.*dynamic=True"):
            compiled(torch.randn(*SHAPES[2]))
    assert len(compiled.amp_backend.graphs) == 2
