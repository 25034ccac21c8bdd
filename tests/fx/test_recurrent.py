"""Recurrent layers fed by a table lookup (Embedding -> LSTM/GRU) through convert and prepare_training.

The fake-tensor self-check re-runs the converted graph: its parameters must keep the static shapes
``torch.export`` traced (fresh symbols made ``aten.lstm``'s ``numel()`` of its weights fail in BF16),
and a symbolic batch must go through ``aten.lstm``'s symbolic-aware decomposition, as in export.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import amp_compiler.fx as ampfx
from tests.support.fx_helpers import one_thread  # noqa: F401 - autouse: torch on one thread


class EmbRNN(torch.nn.Module):
    def __init__(self, cell: type[torch.nn.RNNBase]) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.rnn = cell(16, 32, batch_first=True)
        self.fc = torch.nn.Linear(32, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(ids))
        return self.fc(h[:, -1])


def _model(cell: type[torch.nn.RNNBase]) -> EmbRNN:
    torch.manual_seed(0)
    return EmbRNN(cell)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


IDS = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU], ids=["lstm", "gru"])
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_embedding_into_a_recurrent_layer_converts(cell, target):
    m = _model(cell).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export: the RNN's _flat_weights "assigned during export"
        gm = ampfx.convert(m, (IDS,), target=target)
    assert _cos(gm(IDS), m(IDS)) > 0.999
    assert ampfx.report(gm).target == target


def test_embedding_into_an_lstm_converts_with_a_dynamic_batch_in_bf16():
    m = _model(torch.nn.LSTM).eval()
    batch = torch.export.Dim("batch")  # torch.export specializes an LSTM's sequence length: the batch only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = ampfx.convert(m, (IDS,), target="bf16", dynamic_shapes=({0: batch},))
    ids = torch.randint(0, 100, (7, 5), generator=torch.Generator().manual_seed(1))
    assert gm(ids).shape == (7, 5) and _cos(gm(ids), m(ids)) > 0.999


@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_embedding_into_an_lstm_trains(target):
    m = _model(torch.nn.LSTM)
    y = torch.randint(0, 5, (2,), generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = ampfx.prepare_training(m, torch.nn.CrossEntropyLoss(), (IDS, y), target=target)
    before = m.rnn.weight_ih_l0.detach().clone()
    loss = step(IDS, y, torch.optim.SGD(m.parameters(), lr=0.1))
    assert torch.isfinite(loss) and not torch.equal(m.rnn.weight_ih_l0, before)
