"""The FX conversion observes the FP32 graph's activation ranges (amp_compiler.fx.graph.ranges): what
overflows FP16 on the example inputs or calibration samples stays FP32, as the ONNX path's range probe
and calibration data keep it."""

import pytest
import torch
import torch.nn.functional as F

import amp_compiler.fx as ampfx
from amp_compiler.core.plan import Rule
from amp_compiler.errors import OptionError

TENSOR_CORE = ("aten.linear.default", "aten.mm.default", "aten.addmm.default", "aten.bmm.default",
               "aten.matmul.default", "aten.convolution.default")


class SwiGLU(torch.nn.Module):
    """``x + down(silu(gate(x)) * up(x))``; ``massive``: one gate/up row x200, so the product reaches
    about 1e5 on N(0, 1) inputs (a decoder's massive activation), every weight within FP16."""

    def __init__(self, massive: bool, d: int = 64, f: int = 128):
        super().__init__()
        torch.manual_seed(0)
        self.g = torch.nn.Linear(d, f, bias=False)
        self.u = torch.nn.Linear(d, f, bias=False)
        self.dn = torch.nn.Linear(f, d, bias=False)
        if massive:
            with torch.no_grad():
                self.g.weight[5] *= 200.0
                self.u.weight[5] *= 200.0
                self.dn.weight[:, 5] = 0
                self.dn.weight[3, 5] = 0.05

    def forward(self, x):
        return x + self.dn(F.silu(self.g(x)) * self.u(x))


def _x(seed: int) -> torch.Tensor:
    return torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(seed))


def _decisions(gm):
    return {d.node: d for d in ampfx.report(gm).decisions}


def _tensor_core(gm):
    return [d for d in ampfx.report(gm).decisions if d.op_type in TENSOR_CORE]


def _error_of_range(model, gm, x) -> float:
    with torch.no_grad():
        ref, got = model(x), gm(x)
    assert torch.isfinite(got).all()
    return float((got - ref).abs().max() / (ref.max() - ref.min()))


def test_massive_product_stays_fp32_by_the_example_inputs_ranges():
    m = SwiGLU(massive=True).eval()
    gm = ampfx.convert(m, (_x(0),), range_fallback="fp32")
    d = _decisions(gm)
    assert d["mul"].precision == "fp32" and d["mul"].rule == Rule.PROBE_OVERFLOW.value
    assert "the example inputs" in d["mul"].reason
    assert d["linear_2"].precision == "fp32" and d["linear_2"].rule == Rule.PROBE_OVERFLOW.value  # reads it
    assert d["linear"].precision == d["linear_1"].precision == "fp16"  # the rest of the Tensor Core ops
    for seed in (100, 101, 102):  # before: 64 inf/NaN values per sample
        assert _error_of_range(m, gm, _x(seed)) < 2e-3
    rep = ampfx.report(gm)
    assert rep.ranges_from == "the example inputs" and rep.range_runs == 1
    assert "ranges from the example inputs (1 FP32 run(s)): 2 node(s) kept FP32 by them" in rep.summary()
    assert not rep.warnings


def test_range_pinned_matrix_product_takes_bf16_by_default():
    """The down projection only FP16's range keeps out of FP16 runs in BF16 (FP32's range on Tensor
    Cores), as the ONNX path's range fallback runs it for the CUDA provider; the elementwise product that
    overflows stays FP32 (BF16 would buy it no Tensor Core FLOPs). Before: FP32, a third of the FLOPs."""
    m = SwiGLU(massive=True).eval()
    gm = ampfx.convert(m, (_x(0),))
    d = _decisions(gm)
    assert d["linear_2"].precision == "bf16" and d["linear_2"].rule == Rule.PROBE_OVERFLOW.value
    assert "BF16 instead of FP32" in d["linear_2"].reason and "'mul' reaches" in d["linear_2"].reason
    assert d["mul"].precision == "fp32"
    assert all(t.precision in ("fp16", "bf16") for t in _tensor_core(gm))
    for seed in (100, 101, 102):
        assert _error_of_range(m, gm, _x(seed)) < 5e-3
    rep = ampfx.report(gm)
    assert "1 node(s) kept FP32 and 1 BF16 by them" in rep.summary()
    flops = rep.flops_by_precision()
    assert flops.get("fp32", 0) < 0.02 * sum(flops.values())
    assert not rep.warnings
    with pytest.raises(OptionError, match="range fallback 'scaled'"):
        ampfx.convert(m, (_x(0),), range_fallback="scaled")


def test_tame_ranges_keep_every_tensor_core_op_low():
    m = SwiGLU(massive=False).eval()
    gm = ampfx.convert(m, (_x(0),))
    assert all(d.precision == "fp16" for d in _tensor_core(gm)) and len(_tensor_core(gm)) == 3
    assert not any(d.rule.startswith(("probe.", "calibration.")) for d in ampfx.report(gm).decisions)
    assert _error_of_range(m, gm, _x(100)) < 2e-3


def test_calibration_samples_give_fp16_its_ranges():
    m = SwiGLU(massive=True).eval()
    small = _x(0) * 0.01  # the example alone shows no overflow: the samples do
    gm = ampfx.convert(m, (small,), calibration=[_x(1), (_x(2),)])
    d = _decisions(gm)
    assert d["mul"].precision == "fp32" and d["mul"].rule == Rule.CALIBRATION_OVERFLOW.value
    assert "2 calibration samples" in d["mul"].reason
    assert ampfx.report(gm).ranges_from == "2 calibration samples" and ampfx.report(gm).range_runs == 2
    assert _error_of_range(m, gm, _x(100)) < 2e-3
    bf16 = ampfx.convert(m, (small,), target="bf16", calibration=[_x(1)])  # BF16 has FP32's range
    assert all(d.precision == "bf16" for d in _tensor_core(bf16))


def test_probe_false_skips_the_run_and_says_ranges_were_not_checked():
    m = SwiGLU(massive=True).eval()
    gm = ampfx.convert(m, (_x(0),), probe=False)
    rep = ampfx.report(gm)
    assert _decisions(gm)["mul"].precision == "fp16" and rep.ranges_from == ""
    assert any("activation ranges were not checked" in w for w in rep.warnings)


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.fc(x) * self.calls


@pytest.mark.parametrize("calibration", [None, [torch.randn(2, 8), torch.randn(2, 8)]])
def test_observing_ranges_leaves_written_state_as_it_was(calibration):
    m = Counter().eval()
    gm = ampfx.convert(m, (torch.randn(2, 8),), calibration=calibration)
    assert float(m.calls) == 0 and float(gm.get_buffer("calls")) == 0


def test_fp8_keeps_its_fp16_rest_within_range_by_its_calibration_samples():
    m = SwiGLU(massive=True).eval()
    gm = ampfx.convert(m, (_x(0),), target="fp8", calibration=[_x(1), _x(2)])
    d = _decisions(gm)
    assert d["mul"].precision == "fp32" and d["mul"].rule == Rule.CALIBRATION_OVERFLOW.value
    assert d["linear_2"].precision == "fp32"  # not lowered to FP8 with an FP16 input beyond its range
    assert _error_of_range(m, gm, _x(100)) < 0.05


class OwnHalf(torch.nn.Module):
    """A model that casts to FP16 itself (its dtype is fixed): the value it casts is beyond FP16."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc((x * 1e5).half().float())


def test_an_observed_overflow_left_in_fp16_is_a_warning():
    gm = ampfx.convert(OwnHalf().eval(), (torch.randn(2, 8),))
    warnings = ampfx.report(gm).warnings
    assert any(w.startswith("to reaches |x| = inf on the example inputs but is computed in float16")
               for w in warnings), warnings


class RawUnits(torch.nn.Module):
    """A first layer trained on raw units: feature 0 (a timestamp near 1.7e9) has weights near 1e-9."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = torch.nn.Linear(20, 64), torch.nn.Linear(64, 2)
        with torch.no_grad():
            self.l1.weight[:, 0] *= 3e-9
            self.l1.bias -= self.l1.weight[:, 0] * 1.7e9

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def _raw(seed: int) -> torch.Tensor:
    x = torch.randn(32, 20, generator=torch.Generator().manual_seed(seed))
    x[:, 0] = 1.7e9 + 1e6 * x[:, 0]
    return x


def test_raw_unit_inputs_stay_fp32_when_seen_and_are_a_warning_when_not():
    m = RawUnits().eval()
    # the example holds raw units: the first linear reads them in FP32 (or, by default, BF16: FP32's range)
    gm = ampfx.convert(m, (_raw(0),), range_fallback="fp32")
    d = _decisions(gm)
    assert d["linear"].precision == "fp32" and d["linear"].rule == Rule.PROBE_OVERFLOW.value
    assert d["linear_1"].precision == "fp16"
    assert _error_of_range(m, gm, _raw(100)) < 2e-3  # before: every output inf/NaN
    assert not ampfx.report(gm).warnings
    bf16 = ampfx.convert(m, (_raw(0),))
    assert _decisions(bf16)["linear"].precision == "bf16" and _error_of_range(m, bf16, _raw(100)) < 5e-3
    blind = ampfx.convert(m, (torch.randn(32, 20),))  # N(0, 1) examples show nothing: the weights say it
    warnings = ampfx.report(blind).warnings
    assert any(w.startswith("linear 'linear' reads feature 0 of input 'x' with weights of at most") for w in warnings)
    calibrated = ampfx.convert(m, (torch.randn(32, 20),), calibration=[_raw(1)])
    assert _decisions(calibrated)["linear"].rule == Rule.CALIBRATION_OVERFLOW.value
    assert not ampfx.report(calibrated).warnings  # the data's values were seen: no guess from weights
