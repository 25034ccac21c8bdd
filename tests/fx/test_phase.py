"""Phase arguments and signal paths on torch.fx graphs: the aten table's ``periodic``, ``positions``,
``signal`` and ``dynamic_range`` flags drive the shared passes (passes/analysis/phase.py, signal.py).

A Llama-style rotary block (``inv_freq`` a buffer, ``position_ids`` an int64 input, the K = 1 angle
matmul, cos/sin, rotate_half, attention) converted to FP16 computed its angles in FP16: 16% of the
output's range at positions 32000..32015 (3.6% at 2000); with its angle path FP32, 0.05%. An STFT
front end (a conv1d with a constant filter bank, power, log) in FP16: 7.2% of range; FP32, 0.03%.
"""

from __future__ import annotations

import math

import pytest
import torch

import amp_compiler.fx as ampfx
from tests.support.fx_helpers import error_of_range, one_thread  # noqa: F401 - autouse: torch on one thread

PHASE = "policy.high.phase-argument"
SIGNAL = "policy.high.signal-path"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaRotary(torch.nn.Module):
    """Attention with rotary position embeddings as Hugging Face Llama computes them (``outer``: as
    GPT-NeoX does, ``outer(arange(seq, dtype=float32) + past, inv_freq)``, from a count)."""

    def __init__(self, d: int = 64, heads: int = 2, outer: bool = False):
        super().__init__()
        self.h, self.hd, self.outer = heads, d // heads, outer
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        if self.outer:
            t = torch.arange(s, dtype=torch.float32) + 1000.0
            freqs = torch.outer(t, self.inv_freq)[None]
        else:
            inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
            freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        q, k, v = (p(x).view(b, s, self.h, self.hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        a = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(self.hd), dim=-1) @ v
        return self.o(a.transpose(1, 2).reshape(b, s, -1))


def _convert(module, inputs, target="fp16"):
    gm = ampfx.convert(module, inputs, target=target)
    return gm, {d.node: d for d in ampfx.report(gm).decisions}


@pytest.fixture(scope="module")
def rotary():
    torch.manual_seed(0)
    module = LlamaRotary().eval()
    x = torch.randn(1, 16, 64)
    return module, x, _convert(module, (x, torch.arange(16)[None]))


def test_llama_rotary_angles_and_their_sines_stay_fp32(rotary):
    _, _, (_, d) = rotary
    # inv_freq[None, :, None].float().expand(...): the buffer is a constant, .float() does not make it a
    # position; the K = 1 angle matmul; the cat; cos and sin read the angle in FP32 (aten's FOLLOW them).
    for node in ["unsqueeze", "unsqueeze_1", "to", "expand", "to_1", "matmul", "transpose", "cat", "cos", "sin"]:
        assert (d[node].precision, d[node].rule) == ("fp32", PHASE), (node, d[node].precision, d[node].rule)
    reason = d["matmul"].reason  # the periodic op, the raw value (position_ids.float()) and the angle's error
    assert "cos node 'cos'" in reason and "to node 'to_1'" in reason and "32000 rad to within 8" in reason, reason
    assert "reads its argument" in d["cos"].reason, d["cos"].reason
    # every projection and attention product stays low
    for node in ["linear", "linear_1", "linear_2", "linear_3", "matmul_1", "matmul_2"]:
        assert d[node].precision == "fp16", (node, d[node].precision)


@pytest.mark.parametrize("position", [2000, 32000])
def test_llama_rotary_is_accurate_at_long_positions(rotary, position):
    """16% of range at 32000 (3.6% at 2000) with the angle in FP16; 0.04-0.05% now."""
    module, x, (gm, _) = rotary
    err = error_of_range(module, gm, (x, torch.arange(16)[None] + position))
    assert err < 0.005, err


def test_bf16_rotary_is_accurate_at_long_positions(rotary):
    """BF16: 26% of range at 32000 with the angle in BF16; 0.37% now (the BF16 projections' own error)."""
    module, x, _ = rotary
    gm, d = _convert(module, (x, torch.arange(16)[None]), "bf16")
    assert d["matmul"].rule == PHASE
    assert error_of_range(module, gm, (x, torch.arange(16)[None] + 32000)) < 0.01


def test_positions_counted_by_arange_into_outer():
    """GPT-NeoX's angles: ``outer(arange(seq, dtype=float32) + past, inv_freq)``: the count is a position
    (the arange itself keeps the type the model asked for)."""
    torch.manual_seed(0)
    module = LlamaRotary(outer=True).eval()
    _, d = _convert(module, (torch.randn(1, 16, 64), torch.arange(16)[None]))
    assert d["arange"].precision == "fp32"
    for node in ["add", "outer", "cat", "cos", "sin"]:
        assert d[node].rule == PHASE, (node, d[node].rule)
    assert "arange node 'arange'" in d["outer"].reason, d["outer"].reason


class Fourier(torch.nn.Module):
    """sin/cos of 2 pi x @ B over raw coordinates (``hidden``: of a hidden layer, as a SIREN's)."""

    def __init__(self, hidden: bool = False):
        super().__init__()
        self.hidden = torch.nn.Linear(2, 2) if hidden else None
        self.register_buffer("B", torch.randn(2, 16, generator=torch.Generator().manual_seed(1)) * 10.0)
        self.mlp = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hidden is not None:
            x = torch.relu(self.hidden(x))
        a = 2 * math.pi * x @ self.B
        return self.mlp(torch.cat([a.sin(), a.cos()], dim=-1))


@pytest.mark.parametrize("hidden", [False, True], ids=["coordinates", "hidden-layer"])
def test_fourier_features_of_raw_coordinates_only(hidden):
    torch.manual_seed(0)
    _, d = _convert(Fourier(hidden).eval(), (torch.rand(64, 2) * 100,))
    assert (d["matmul"].rule == PHASE) is not hidden, d["matmul"].rule
    assert d["linear" if not hidden else "linear_1"].precision == "fp16"


class Frontend(torch.nn.Module):
    """An STFT as a strided conv1d with a constant (cos, sin) filter bank, its power, its log, then a CNN."""

    def __init__(self, cast: bool, n_fft: int = 256, hop: int = 64):
        super().__init__()
        n, k = torch.arange(n_fft).float(), torch.arange(n_fft // 2 + 1).float()
        ang = 2 * math.pi * k[:, None] * n[None] / n_fft
        window = torch.hann_window(n_fft)
        self.register_buffer("bank", torch.cat([torch.cos(ang) * window, -torch.sin(ang) * window])[:, None])
        self.cast, self.hop, self.bins = cast, hop, n_fft // 2 + 1
        self.conv = torch.nn.Conv1d(self.bins, 64, 3, padding=1)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        wave = wave.float() if self.cast else wave
        spec = torch.nn.functional.conv1d(wave[:, None], self.bank, stride=self.hop)
        re, im = spec[:, : self.bins], spec[:, self.bins:]
        features = torch.log(re * re + im * im + 1e-10)
        return self.fc(torch.relu(self.conv(features)).mean(-1))


@pytest.mark.parametrize("cast", [False, True], ids=["input", "input.float()"])
def test_audio_front_end_signal_path_stays_fp32(cast):
    """A 440 Hz tone with a component 60 dB below it: 7.2% of range with the front end in FP16, 0.03% now."""
    torch.manual_seed(0)
    module = Frontend(cast).eval()
    t = torch.arange(16000) / 16000
    wave = (torch.sin(2 * math.pi * 440 * t) + 1e-3 * torch.sin(2 * math.pi * 3000 * t))[None]
    gm, d = _convert(module, (wave,))
    for node in ["conv1d", "mul", "mul_1", "add"] + (["to"] if cast else []):
        assert (d[node].precision, d[node].rule) == ("fp32", SIGNAL), (node, d[node].precision, d[node].rule)
    assert d["conv1d_1"].precision == d["linear"].precision == "fp16"  # learned layers after the log
    assert error_of_range(module, gm, (wave,)) < 0.002
