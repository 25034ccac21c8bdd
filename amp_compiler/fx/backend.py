"""A ``torch.compile`` backend that applies the mixed-precision pass and hands the graph to Inductor.

    compiled = torch.compile(model, backend=amp_compiler.fx.backend(target="fp16"))

Dynamo gives the backend a torch-level graph whose inputs include the module's parameters and
buffers. The backend traces it to the ATen level (``make_fx`` with ``pre_dispatch=True``, the same
IR that ``torch.export`` produces), runs the same analysis and lowering as :func:`convert` with
parameters and buffers treated as constants that are cast at use (they stay the caller's FP32
tensors, so training through the compiled model updates them), then compiles the result with the
inner backend (Inductor by default), which differentiates the graph with the casts in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

from amp_compiler.fx.convert import transform
from amp_compiler.fx.report import FxReport
from amp_compiler.fx.rewrite import functionalize_inplace
from amp_compiler.fx.views import is_float
from amp_compiler.targets import Target

_STATE_MARKERS = ("._parameters[", "._buffers[")


def _is_state(node: fx.Node, example) -> bool:
    if isinstance(example, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(getattr(grapharg, "source", None), "name", "")
    name = source() if callable(source) else str(source)
    return any(m in name for m in _STATE_MARKERS)


def _fake_inputs(example_inputs) -> list | None:
    """The inputs as fake tensors of the compilation's fake mode, with their symbolic sizes and
    sources (as aot_autograd makes them), or None outside a torch.compile compilation."""
    ctx = torch._guards.TracingContext.try_get()
    mode = getattr(ctx, "fake_mode", None)
    if mode is None:
        return None
    contexts = getattr(ctx, "tensor_to_context", {})
    out = []
    for x in example_inputs:
        if isinstance(x, FakeTensor) or not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        symbolic = contexts.get(x) if x in contexts else None
        source = getattr(symbolic, "tensor_source", None)
        out.append(mode.from_tensor(x, symbolic_context=symbolic, source=source))
    return out


class AmpBackend:
    """The backend callable; ``reports`` holds one :class:`FxReport` per graph it compiled."""

    def __init__(
        self, target: Target | str = "fp16", *, inner: str | Callable = "inductor",
        block_ops: Iterable[str] = (), block_nodes: Iterable[str] = (),
    ):
        self.target = Target.parse(target) if isinstance(target, str) else target
        self.inner = inner
        self.block_ops = tuple(block_ops)
        self.block_nodes = tuple(block_nodes)
        self.reports: list[FxReport] = []
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        state_index = {
            i for i, (n, x) in enumerate(zip(placeholders, example_inputs, strict=False))
            if isinstance(x, torch.Tensor) and _is_state(n, x)
        }
        fakes = _fake_inputs(example_inputs)
        mode = torch._guards.detect_fake_mode(fakes) if fakes is not None else None
        if fakes is not None and mode is not None:
            allow = mode.allow_non_fake_inputs
            mode.allow_non_fake_inputs = True  # the graph's own tensor constants are real
            try:
                aten_gm = make_fx(gm, pre_dispatch=True)(*fakes)
            finally:
                mode.allow_non_fake_inputs = allow
        else:
            aten_gm = make_fx(gm, pre_dispatch=True, tracing_mode="fake")(*example_inputs)
        functionalize_inplace(aten_gm)
        aten_placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
        sources = {
            aten_placeholders[i]: example_inputs[i]
            for i in state_index
            if i < len(aten_placeholders) and is_float(aten_placeholders[i])
        }
        report = transform(
            aten_gm, self.target, mode="compile", block_ops=self.block_ops, block_nodes=self.block_nodes,
            constant_sources=sources, fake_inputs=fakes,
            notes={
                a.name: f"torch.compile input {p.name}" for a, p in zip(aten_placeholders, placeholders, strict=False)
            },
        )
        self.reports.append(report)
        self.graphs.append(aten_gm)
        return self._compile(aten_gm, example_inputs)

    def _compile(self, gm: fx.GraphModule, example_inputs):
        if self.inner == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        if self.inner == "eager":
            return gm.forward
        if callable(self.inner):
            return self.inner(gm, example_inputs)
        from torch._dynamo import lookup_backend

        return lookup_backend(self.inner)(gm, example_inputs)


def backend(
    target: Target | str = "fp16", *, inner: str | Callable = "inductor",
    block_ops: Iterable[str] = (), block_nodes: Iterable[str] = (),
) -> AmpBackend:
    """A ``torch.compile`` backend: the mixed-precision pass, then ``inner`` (``"inductor"``, another
    registered backend name, ``"eager"`` to run the converted graph as it is, or a callable)."""
    return AmpBackend(target, inner=inner, block_ops=block_ops, block_nodes=block_nodes)
