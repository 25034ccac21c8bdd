"""Small torch modules, the catalog's architectures as torch modules, and a training loop, shared by the FX tests."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

import amp_compiler.fx as ampfx
from models.architectures import ARCHS


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """torch on one thread while a module's tests run (import it into the test module to use it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class CNN(torch.nn.Module):
    """Two Conv+BatchNorm+ReLU blocks, global average pooling and a linear classifier (10 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.b2 = torch.nn.BatchNorm2d(32)
        self.fc = torch.nn.Linear(32, 10)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Global average pooling to (batch, channels); subclasses may pool another way."""
        return torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return self.fc(self.pool(x))


@functools.cache
def build(name: str):
    """(eval-mode module taking positional inputs, example inputs as a tuple, FP32 outputs) of the
    catalog architecture ``name``, built once per test session."""
    return next(a for a in ARCHS if a.name == name).torch_example()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


class MeanPoolCNN(CNN):
    """The shared test CNN, pooling with a plain mean over height and width."""

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Global average pooling as x.mean((2, 3))."""
        return x.mean((2, 3))


PATTERNS = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(123))


def error_of_range(module, gm, inputs) -> float:
    """The converted ``gm``'s largest error against ``module`` (FP32) on ``inputs``, over the output's range."""
    from amp_compiler.core.tensor_error import ErrorStats

    with torch.no_grad():
        ref, got = module(*inputs).numpy(), gm(*inputs).numpy()
    stats = ErrorStats()
    stats.add(ref.ravel(), got.ravel())
    return stats.error_of_range


def images(n, seed):
    """Ten noisy class patterns (the noise keeps the loss well above zero)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    return 0.5 * PATTERNS[y] + torch.randn(n, 3, 16, 16, generator=g), y


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=32, d=64, heads=4, layers=2, seq=32):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(dict(
                ln1=torch.nn.LayerNorm(d), qkv=torch.nn.Linear(d, 3 * d), proj=torch.nn.Linear(d, d),
                ln2=torch.nn.LayerNorm(d), fc1=torch.nn.Linear(d, 4 * d), fc2=torch.nn.Linear(4 * d, d),
            ))
            for _ in range(layers)
        )
        self.lnf = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        self.heads = heads
        self.register_buffer("causal", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, ids):
        b, t = ids.shape
        h = self.tok(ids) + self.pos.weight[:t]
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](h)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            att = att.masked_fill(self.causal[:t, :t], float("-inf")).softmax(-1)
            h = h + blk["proj"]((att @ v).transpose(1, 2).reshape(b, t, -1))
            h = h + blk["fc2"](F.gelu(blk["fc1"](blk["ln2"](h))))
        return self.head(self.lnf(h))


VOCAB = 32


BIGRAMS = torch.softmax(2.5 * torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(7)), -1)


def sequences(n, seed, t=32):
    """Next-token prediction on a fixed random bigram chain (the loss floor is its entropy, 1.84)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(n, t + 1, dtype=torch.long)
    ids[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(t):
        ids[:, i + 1] = torch.multinomial(BIGRAMS[ids[:, i]], 1, generator=g)[:, 0]
    return ids[:, :-1], ids[:, 1:]


def lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train(kind, target, steps, lr, decay=False):
    """``steps`` of training from seed 0 on the same batches; ``target`` fp32, fp16 or bf16 (ampfx), or
    autocast-bf16 (torch.autocast on the CPU). ``decay``: the learning rate falls linearly to 0, so
    the run ends on a plateau. Returns the mean loss of the last 20 steps, the held-out loss, the
    losses, the model and the step."""
    torch.manual_seed(0)
    if kind == "cnn":
        model, data, loss_fn = MeanPoolCNN(), images, torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        model, data, loss_fn = TinyGPT(), sequences, lm_loss
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / steps) if decay else None
    if target in ("fp32", "autocast-bf16"):
        model.train()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=target != "fp32")

        def step(x, y, opt):
            opt.zero_grad()
            with autocast:
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
    else:
        step = ampfx.prepare_training(model, loss_fn, data(32, 0), target=target)
    losses = []
    for i in range(steps):
        losses.append(step(*data(32, i + 1), opt).item())
        if schedule is not None:
            schedule.step()
    model.eval()
    with torch.no_grad():
        x, y = data(256, 10**6)
        held_out = loss_fn(model(x), y).item()
    return sum(losses[-20:]) / 20, held_out, losses, model, step
