"""A ``torch.compile`` backend that applies the mixed-precision pass and hands the graph to Inductor.

    compiled = torch.compile(model, backend=amp_compiler.fx.backend(target="fp16"))

Dynamo gives the backend a torch-level graph whose inputs include the module's parameters and
buffers. The backend traces it to the ATen level (``make_fx`` with ``pre_dispatch=True``, the same
IR that ``torch.export`` produces), runs the same analysis and lowering as :func:`convert` with
parameters and buffers treated as constants that are cast at use (they stay the caller's FP32
tensors, so training through the compiled model updates them), then compiles the result with the
inner backend (Inductor by default), which differentiates the graph with the casts in it.

Dynamo hands a backend only what it traces: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` it does not trace
unless ``torch._dynamo.config.allow_rnn`` is set, and a model made of them reaches the backend as no
graph at all and runs unconverted, in FP32, without a word; so does a call dynamo runs as Python code
once a function has ``torch._dynamo.config.recompile_limit`` compiled versions. :func:`compile` wraps
``torch.compile`` with this backend, counts the runs of the converted graphs and warns
(:class:`NoGraphWarning`) after each call that ran none of them, naming the RNN modules when they are
why (``allow_rnn=True`` traces them), else the recompile limit; the backend itself warns when a graph
it is given has no operation to convert.

The backend reads a symbolic size as its hint, without a guard (``views.dim_hint``): with
``dynamic=True`` a model called at 5 sequence lengths compiles 1 graph (it compiled 5, one per shape,
and with the default limit of 8 ran 4 of 10 sequence lengths unconverted).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

from amp_compiler.errors import OptionError
from amp_compiler.fx.graph.pipeline import transform
from amp_compiler.fx.graph.report import FxReport
from amp_compiler.fx.graph.rewrite import functionalize_inplace
from amp_compiler.fx.graph.views import is_float
from amp_compiler.targets import Target

__all__ = ["AmpBackend", "CompiledModule", "NoGraphWarning", "backend", "compile"]

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
        if self.target is Target.FP8:
            raise OptionError(
                "the torch.compile backend does not convert to fp8 (its FP8 layers are chosen from calibration "
                "samples): use amp_compiler.fx.convert(..., target='fp8', calibration=[...])", option="target",
            )
        self.inner = inner
        self.block_ops = tuple(block_ops)
        self.block_nodes = tuple(block_nodes)
        self.reports: list[FxReport] = []
        self.graphs: list[fx.GraphModule] = []
        self.calls = 0  # runs of the converted graphs

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        if not any(n.op == "call_function" for n in gm.graph.nodes):
            warnings.warn(
                "torch.compile gave amp-compiler's backend a graph without operations: nothing converted",
                NoGraphWarning, stacklevel=2,
            )
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
        return self._counted(self._compile(aten_gm, example_inputs))

    def _counted(self, compiled: Callable) -> Callable:
        """``compiled``, counting its runs in ``calls``: a call of the model that ran none of the converted
        graphs ran unconverted (dynamo fell back to the Python code, e.g. past its recompile limit)."""

        @functools.wraps(compiled)  # keeps the attributes dynamo reads (``_boxed_call``)
        def run(*args: Any) -> Any:
            self.calls += 1
            return compiled(*args)

        return run

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


class NoGraphWarning(UserWarning):
    """torch.compile ran a model without giving amp-compiler's backend a graph: nothing was converted."""


class CompiledModule(torch.nn.Module):
    """``torch.compile(module, backend=...)`` that warns (:class:`NoGraphWarning`) after every call that ran
    none of the backend's converted graphs: the first call of a model dynamo gave the backend no graph
    of, and any later call dynamo ran as Python code (past its recompile limit), which ran in FP32."""

    def __init__(self, module: torch.nn.Module, amp_backend: AmpBackend, allow_rnn: bool, **compile_kwargs: Any):
        super().__init__()
        self.compiled = torch.compile(module, backend=amp_backend, **compile_kwargs)
        self.amp_backend = amp_backend
        self.allow_rnn = allow_rnn
        self._rnns = sorted(type(m).__name__ for m in module.modules() if isinstance(m, torch.nn.RNNBase))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        ran = self.amp_backend.calls
        with torch._dynamo.config.patch(allow_rnn=self.allow_rnn):
            out = self.compiled(*args, **kwargs)
        if self.amp_backend.calls == ran:
            warnings.warn(self._unconverted(), NoGraphWarning, stacklevel=2)
        return out

    def _unconverted(self) -> str:
        """Why a call ran none of the converted graphs, as far as the backend can tell."""
        graphs = len(self.amp_backend.graphs)
        if not graphs:
            why = (
                f" It holds {', '.join(sorted(set(self._rnns)))}, which dynamo does not trace unless allowed "
                "(amp_compiler.fx.compile(..., allow_rnn=True))" if self._rnns and not self.allow_rnn else ""
            )
            return "torch.compile gave amp-compiler's backend no graph: the model ran unconverted, in FP32." + why
        limit = torch._dynamo.config.recompile_limit
        return (
            f"torch.compile ran this call without any of the {graphs} graph(s) amp-compiler converted: it ran "
            f"unconverted, in FP32 (dynamo runs the Python code once a function has {limit} compiled versions, "
            "torch._dynamo.config.recompile_limit: pass dynamic=True for inputs whose shapes vary, or raise the limit)"
        )


def compile(  # noqa: A001 - the name torch.compile users look for
    module: torch.nn.Module, target: Target | str = "fp16", *, inner: str | Callable = "inductor",
    block_ops: Iterable[str] = (), block_nodes: Iterable[str] = (), allow_rnn: bool = False, **compile_kwargs: Any,
) -> CompiledModule:
    """``torch.compile(module, backend=backend(target, ...))`` that warns (:class:`NoGraphWarning`) after
    a call that ran none of the converted graphs (it ran in FP32); ``allow_rnn`` lets dynamo trace
    nn.LSTM/GRU/RNN (it does not by default, and they then run unconverted). The backend is the
    wrapper's ``amp_backend``."""
    amp = AmpBackend(target, inner=inner, block_ops=block_ops, block_nodes=block_nodes)
    return CompiledModule(module, amp, allow_rnn, **compile_kwargs)


def backend(
    target: Target | str = "fp16", *, inner: str | Callable = "inductor",
    block_ops: Iterable[str] = (), block_nodes: Iterable[str] = (),
) -> AmpBackend:
    """A ``torch.compile`` backend: the mixed-precision pass, then ``inner`` (``"inductor"``, another
    registered backend name, ``"eager"`` to run the converted graph as it is, or a callable)."""
    return AmpBackend(target, inner=inner, block_ops=block_ops, block_nodes=block_nodes)
