"""amp_compiler.fx.convert on small hand-written modules, one behaviour per test."""

import collections

import pytest
import torch
import torch.nn.functional as F

import amp_compiler.fx as ampfx
from amp_compiler.errors import OptionError
from amp_compiler.fx.graph.lower import CAST

torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _decisions(gm):
    return {d.node: d for d in ampfx.report(gm).decisions}


def _casts(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is CAST]


def _cos(a, b):
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def test_mlp_runs_in_fp16_with_fp32_interface_and_half_the_parameters():
    m = MLP().eval()
    x = torch.randn(4, 16)
    gm = ampfx.convert(m, (x,))
    d = _decisions(gm)
    assert d["linear"].precision == d["linear_1"].precision == "fp16"
    assert d["linear"].rule == "policy.low" and "matrix product" in d["linear"].reason
    assert d["relu"].precision == "fp16" and d["relu"].rule == "paint.between-low"
    out = gm(x)
    assert out.dtype == torch.float32 and _cos(out, m(x)) > 0.9999
    assert all(p.dtype == torch.float16 for p in gm.parameters())
    rep = ampfx.report(gm)
    assert rep.parameter_bytes_after * 2 == rep.parameter_bytes_before
    assert rep.casts_inserted == 2  # the input to fp16, the output back to fp32
    # The caller's model is untouched.
    assert all(p.dtype == torch.float32 for p in m.parameters())


def test_report_lists_every_graph_node_in_order():
    gm = ampfx.convert(MLP().eval(), (torch.randn(4, 16),))
    rep = ampfx.report(gm)
    assert [d.node for d in rep.decisions] == [n.name for n in gm.graph.nodes]
    assert all(d.rule and d.reason for d in rep.decisions)
    casts = [d for d in rep.decisions if d.rule == "lowering.cast"]
    assert len(casts) == rep.casts_inserted and all(d.index is None for d in casts)
    assert "policy.low" in rep.decisions_by_rule()
    assert "linear" in str(rep) and "fp16 inference" in rep.summary()


def test_report_of_an_unconverted_module_is_an_error():
    with pytest.raises(ValueError):
        ampfx.report(torch.fx.symbolic_trace(MLP()))


class Fanout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)  # K = 16: a shorter product of x is policy.high.raw-small-product's
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return self.a(h) + self.b(h), h.exp(), h.log_softmax(-1), h


def test_one_cast_per_tensor_and_dtype():
    gm = ampfx.convert(Fanout().eval(), (torch.randn(2, 16),))
    per_source = collections.Counter((c.args[0].name, c.kwargs["dtype"]) for c in _casts(gm))
    assert per_source and max(per_source.values()) == 1
    # h (fp16) feeds exp, log_softmax and a graph output, all FP32: one cast serves them all.
    assert per_source[("linear", torch.float32)] == 1
    d = _decisions(gm)
    assert d["exp"].precision == "fp32" and d["exp"].rule == "policy.high.range"
    assert d["log_softmax"].precision == "fp32"


class SharedWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 16))  # K = 16

    def forward(self, x):
        return F.linear(x, self.w), self.w.sum()


def test_parameter_with_fp16_and_fp32_uses_stays_fp32_and_is_cast_at_use():
    m = SharedWeight().eval()
    gm = ampfx.convert(m, (torch.randn(2, 16),))
    assert gm.w.dtype == torch.float32
    assert [c.args[0].name for c in _casts(gm) if c.kwargs["dtype"] == torch.float16].count("w") == 1
    d = _decisions(gm)
    assert d["w"].rule == "constant" and "not all in one other type" in d["w"].reason


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(512, 64)
        self.head = torch.nn.Linear(64, 512, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(F.layer_norm(self.emb(ids), (64,)))  # FP32 between the two uses


def test_tied_weights_are_stored_once_in_low_precision():
    m = Tied().eval()
    ids = torch.randint(0, 512, (2, 5))
    gm = ampfx.convert(m, (ids,))
    rep = ampfx.report(gm)
    assert rep.parameter_ratio == pytest.approx(0.5)
    d = _decisions(gm)
    assert d["embedding"].rule == "paint.table-lookup"
    assert _cos(gm(ids), m(ids)) > 0.9999


class InPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        h = torch.relu_(h)  # on a fresh tensor: made functional
        v = h.view(-1)
        v.add_(1.0)  # on a view whose base is read afterwards: stays in place
        return self.fc2(h), h.exp().sum()


def test_inplace_ops_are_made_functional_or_share_their_tensors_precision():
    m = InPlace().eval()
    x = torch.randn(2, 8)
    gm = ampfx.convert(m, (x,))
    targets = {n.name: n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert targets["relu_"] is torch.ops.aten.relu.default
    assert targets["add_"] is torch.ops.aten.add_.Tensor
    d = _decisions(gm)
    assert d["add_"].precision == d["relu_"].precision == d["view"].precision
    with torch.no_grad():
        for a, b in zip(m(x), gm(x)):
            assert _cos(a, b) > 0.9999


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.k = torch.nn.Linear(8, 8)
        self.o = torch.nn.Linear(8, 8)

    def forward(self, x, mask):
        s = self.q(x) @ self.k(x).transpose(-1, -2)
        s = s.masked_fill(mask, torch.finfo(torch.float32).min)  # float32's lowest: inf in FP16
        p = torch.clamp(s.softmax(-1), min=1e-9)  # an FP16 flush-to-zero bound
        return self.o(p @ x), p.log()


def test_scalar_constants_out_of_range_keep_their_op_fp32():
    m = Masked().eval()
    x, mask = torch.randn(2, 4, 8), torch.rand(2, 4, 4) > 0.7
    gm = ampfx.convert(m, (x, mask))
    d = _decisions(gm)
    assert d["masked_fill"].precision == "fp32" and d["masked_fill"].rule == "constant.overflow"
    assert d["clamp"].precision == "fp32" and d["clamp"].rule == "constant.underflow"
    assert d["matmul"].precision == "fp16"
    with torch.no_grad():
        for a, b in zip(m(x, mask), gm(x, mask)):
            assert torch.isfinite(b).all() and _cos(a, b) > 0.999


class Conversions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 8)  # K = 16
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x, mask):
        h = self.a(x) * mask.to(x.dtype)[..., None]  # from int64: follows its users
        y = self.b(h).to(torch.float32)  # to the type it has: follows the plan
        return y, y.half().float()  # between float types: the model's own choice, kept


def test_explicit_conversions_are_retargeted_or_kept():
    m = Conversions().eval()
    x, mask = torch.randn(2, 3, 16), torch.ones(2, 3, dtype=torch.long)
    gm = ampfx.convert(m, (x, mask))
    conv = [n for n in gm.graph.nodes if n.op == "call_function" and "to.dtype" in str(n.target)]
    dtypes = [n.args[1] for n in conv]
    assert dtypes == [torch.float16, torch.float32, torch.float16, torch.float32]
    d = _decisions(gm)
    assert "explicit conversion" in d[conv[2].name].reason  # y.half(): fixed
    asserts = [n for n in gm.graph.nodes if "_assert_tensor_metadata" in str(n.target)]
    for a in asserts:  # metadata checks follow the tensor's new dtype
        assert a.kwargs["dtype"] == a.args[0].meta["val"].dtype
    with torch.no_grad():
        for a, b in zip(m(x, mask), gm(x, mask)):
            assert _cos(a, b) > 0.9999


class Unknown(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 8)  # K = 16
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.i0(self.a(x)))


def test_unknown_ops_stay_fp32_with_casts_and_a_warning():
    gm = ampfx.convert(Unknown().eval(), (torch.randn(2, 16),))
    rep = ampfx.report(gm)
    d = _decisions(gm)
    assert d["i0"].precision == "fp32" and d["i0"].rule == "policy.unknown-op"
    assert d["linear"].precision == d["linear_1"].precision == "fp16"
    assert any("i0" in w for w in rep.warnings)


def test_block_ops_and_block_nodes():
    x = torch.randn(2, 16)
    d = _decisions(ampfx.convert(MLP().eval(), (x,), block_ops=["linear"]))
    assert d["linear"].precision == "fp32" and d["linear"].rule == "user.block-op"
    d = _decisions(ampfx.convert(MLP().eval(), (x,), block_nodes=["^linear_1$"]))
    assert d["linear_1"].precision == "fp32" and d["linear_1"].rule == "user.block-node"
    assert d["linear"].precision == "fp16"
    with pytest.raises(OptionError):
        ampfx.convert(MLP().eval(), (x,), block_ops=["not_an_op"])


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-2, 2)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.running_var[0] = 1e8  # beyond FP16's range

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_batchnorm_is_folded_for_inference_or_keeps_fp32_parameters():
    m = ConvBN().eval()
    x = torch.randn(2, 3, 10, 10)
    gm = ampfx.convert(m, (x,))
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.batch_norm.default" not in ops
    d = _decisions(gm)
    assert d["conv2d"].precision == "fp16" and "folded" in d["conv2d"].reason
    assert _cos(gm(x), m(x)) > 0.999
    gm = ampfx.convert(m, (x,), fold_bn=False)
    d = _decisions(gm)
    assert d["batch_norm"].precision == "fp16"  # FP16 data, FP32 weight/bias/statistics
    assert gm.bn.running_var.dtype == torch.float32 and gm.bn.weight.dtype == torch.float32
    assert "mixed-type kernel" in d["bn_running_var"].reason
    assert _cos(gm(x), m(x)) > 0.999


def test_dynamic_shapes_and_bf16():
    m = MLP().eval()
    batch = torch.export.Dim("batch")
    gm = ampfx.convert(m, (torch.randn(4, 16),), target="bf16", dynamic_shapes=({0: batch},))
    x = torch.randn(7, 16)
    assert gm(x).shape == (7, 8) and _cos(gm(x), m(x)) > 0.999
    assert ampfx.report(gm).target == "bf16"
    assert {p.dtype for p in gm.parameters()} == {torch.bfloat16}


def test_precision_report_renders_with_the_shared_renderers():
    from amp_compiler.report.render import render

    gm = ampfx.convert(MLP().eval(), (torch.randn(4, 16),))
    pr = ampfx.report(gm).to_precision_report("mlp")
    assert len(pr.nodes) == len(list(gm.graph.nodes))
    text = render(pr, "json")
    assert '"linear"' in text


class SliceFirst(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 8)  # K = 16: a shorter product of x is policy.high.raw-small-product's

    def forward(self, x):
        return self.a(x[:, :16])


def test_min_cut_placement_casts_after_the_slice():
    x = torch.randn(8, 1024)
    painted = _decisions(ampfx.convert(SliceFirst().eval(), (x,), placement="paint"))
    assert painted["slice_1"].precision == "fp16" and "x_fp16" in painted  # casts the whole input
    d = _decisions(ampfx.convert(SliceFirst().eval(), (x,)))  # the default: min-cut, as the ONNX path
    assert d["slice_1"].precision == "fp32" and d["slice_1"].rule == "placement.min-cut"
    assert "slice_1_fp16" in d and "x_fp16" not in d  # casts the 128 values it keeps


class Stateful(torch.nn.Module):
    """A forward that writes its buffers: an EMA (through the view mul_ returns), a counter, a cache row."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.scale = torch.nn.Parameter(torch.ones(16))
        self.register_buffer("ema", torch.zeros(16))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("cache", torch.zeros(2, 16), persistent=False)

    def forward(self, x):
        h = self.fc(x)
        self.ema.mul_(0.9).add_(0.1 * h.mean(0))
        self.calls += 1
        self.cache[0].copy_(h[0])
        return torch.exp(h + self.ema) * self.scale  # exp keeps FP32: scale stays FP32 too


def test_running_the_converted_module_leaves_the_models_buffers_as_they_were():
    m = Stateful().eval()
    before = {k: v.clone() for k, v in list(m.state_dict().items()) + [("cache", m.cache)]}
    gm = ampfx.convert(m, (torch.randn(4, 16),))
    for _ in range(5):
        gm(torch.randn(4, 16))
    for name, value in before.items():
        assert torch.equal(getattr(m, name) if name == "cache" else m.state_dict()[name], value), name
    assert gm.get_buffer("calls").item() == 5 and gm.get_buffer("ema").abs().max() > 0
    assert gm.get_buffer("cache").abs().max() > 0
    # what the graph only reads stays shared (no copy of the weights): the FP32 parameter is the model's
    assert gm.get_parameter("scale").dtype == torch.float32 and gm.get_parameter("scale") is m.scale
