"""Mixed-precision training on an FX graph: FP32 master parameters cast at use, the loss scale as a
node of the graph, and a :class:`~amp_compiler.fx.scaler.LossScaler` around the optimizer step.

    step = prepare_training(model, loss_fn, (x, y), target="fp16", loss_scale="dynamic")
    for x, y in data:
        loss = step(x, y, optimizer)      # forward, scaled backward, unscale, (clip), step or skip, update

The model and its loss are captured together with ``torch.export`` (training IR) and converted with
the same analysis as inference, except that parameters stay FP32 (the optimizer's master copy) and
every low-precision use reads a cast of them, so gradients flow back through the cast in FP32. The
graph returns the loss and ``loss * scale``, where ``scale`` is a buffer of the graph module that the
scaler updates in place; backward starts from the scaled loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx as fx

from amp_compiler.errors import OptionError
from amp_compiler.fx.fp8.scaling import DelayedScaling, DelayedScalingState
from amp_compiler.fx.fp8.training import rewrite_training, training_gemms, training_report
from amp_compiler.fx.graph.pipeline import capture, transform
from amp_compiler.fx.graph.policy import AtenPolicy, default_policy, op_name, policy_name
from amp_compiler.fx.graph.report import FxReport
from amp_compiler.fx.scaler import LossScaler
from amp_compiler.passes.analysis import compile_patterns
from amp_compiler.targets import Target

__all__ = ["TrainStep", "prepare_training"]

SCALE_BUFFER = "amp_loss_scale"


class _LossGraph(torch.nn.Module):
    """model + loss, returning (loss, loss * scale)."""

    def __init__(self, model: torch.nn.Module, loss_fn, scale: torch.Tensor):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.register_buffer(SCALE_BUFFER, scale)

    def forward(self, *args):
        *inputs, target = args
        loss = self.loss_fn(self.model(*inputs), target)
        return loss, loss * getattr(self, SCALE_BUFFER)


def make_scaler(target: Target, loss_scale: LossScaler | str | float | None) -> LossScaler:
    """The scaler for ``loss_scale``: "auto" (dynamic for FP16 and FP8, whose other ops run in FP16;
    none for BF16), "dynamic", a number
    (a static scale), None or "none" (no scaling), or a :class:`LossScaler`."""
    if isinstance(loss_scale, LossScaler):
        return loss_scale
    if loss_scale == "auto":
        loss_scale = "dynamic" if target.fallback is Target.FP16 else None
    if loss_scale is None or loss_scale == "none":
        return LossScaler(enabled=False)
    if loss_scale == "dynamic":
        return LossScaler()
    if isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool) and loss_scale > 0:
        return LossScaler(init_scale=float(loss_scale), dynamic=False)
    raise ValueError(
        f"loss_scale must be 'auto', 'dynamic', None, a positive number or a LossScaler, got {loss_scale!r}"
    )


class TrainStep:
    """One training step over the converted graph; ``step(x, y, optimizer)`` returns the loss."""

    def __init__(
        self, graph_module: fx.GraphModule, scaler: LossScaler, parameters: list, clip_grad_norm: float | None,
        fp8: DelayedScalingState | None = None,
    ):
        self.graph_module = graph_module
        self.scaler = scaler
        self.fp8 = fp8  # target fp8: the delayed-scaling state, updated after every step
        self.parameters = parameters
        self.clip_grad_norm = clip_grad_norm
        self.steps = 0
        self.skipped = 0  # steps skipped because a gradient was inf/NaN
        self.last_skipped = False

    @property
    def report(self) -> FxReport:
        return self.graph_module.meta["amp_compiler"]

    def forward(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, scaled loss) without a backward pass or a step."""
        inputs = x if isinstance(x, tuple) else (x,)
        return self.graph_module(*inputs, y)

    def __call__(
        self, x: Any, y: Any, optimizer: torch.optim.Optimizer, *, clip_grad_norm: float | None = None
    ) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss, scaled = self.forward(x, y)
        scaled.backward()
        self.scaler.unscale_(optimizer)  # before clipping: clip the true gradients
        clip = self.clip_grad_norm if clip_grad_norm is None else clip_grad_norm
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, clip)
        self.last_skipped = self.scaler.found_inf(optimizer)
        self.scaler.step(optimizer)
        self.scaler.update()
        if self.fp8 is not None:
            self.fp8.update(skipped=self.last_skipped)
        self.steps += 1
        self.skipped += self.last_skipped
        return loss.detach()

    def state_dict(self) -> dict:
        state = {"scaler": self.scaler.state_dict(), "steps": self.steps, "skipped": self.skipped}
        if self.fp8 is not None:
            state["fp8"] = self.fp8.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])
        if self.fp8 is not None and "fp8" in state:
            self.fp8.load_state_dict(state["fp8"])
        self.steps = state.get("steps", 0)
        self.skipped = state.get("skipped", 0)


def prepare_training(
    model: torch.nn.Module,
    loss_fn: Callable,
    example_inputs: tuple,
    *,
    target: Target | str = "fp16",
    loss_scale: LossScaler | str | float | None = "auto",
    clip_grad_norm: float | None = None,
    block_ops: Iterable[str] = (),
    block_nodes: Iterable[str] = (),
    dynamic_shapes: Any = None,
    policy: AtenPolicy | None = None,
    fp8_recipe: DelayedScaling | None = None,
) -> TrainStep:
    """A mixed-precision training step for ``model`` and ``loss_fn(model(*x), y)``.

    ``example_inputs`` is an example batch ``(x, y)`` as the step takes it (``x`` a tensor or a
    tuple of model inputs). ``dynamic_shapes`` is given the same way, one spec per input:
    ``(x_spec, y_spec)``, e.g. ``({0: batch}, {0: batch})``. The model is put in training mode and
    captured with its loss. Parameters
    are the model's own (build the optimizer over ``model.parameters()``). ``loss_scale``: ``"auto"``
    (dynamic for FP16, none for BF16), ``"dynamic"``, a number (static scale), ``None``, or a
    :class:`LossScaler`. ``clip_grad_norm``: clip the unscaled gradients to this norm each step.

    ``target="fp8"``: Transformer Engine's recipe (:mod:`amp_compiler.fx.fp8.training`): the GEMMs
    of weights run in FP8 with delayed scaling (``fp8_recipe``, a :class:`DelayedScaling`: history
    length, margin, format), everything else as for FP16, with FP16's loss scaling.
    """
    target = Target.parse(target) if isinstance(target, str) else target
    if fp8_recipe is not None and target is not Target.FP8:
        raise OptionError("fp8_recipe is for target fp8 only", option="fp8_recipe")
    scaler = make_scaler(target, loss_scale)
    x, y = example_inputs
    inputs = x if isinstance(x, tuple) else (x,)
    model.train()
    wrapper = _LossGraph(model, loss_fn, scaler.scale_tensor)
    gm = capture(wrapper, (*inputs, y), dynamic_shapes=_step_dynamic_shapes(dynamic_shapes, x, len(inputs)))
    _share_state(gm, wrapper)
    scale_nodes = [n for n in gm.graph.nodes if n.op == "get_attr" and str(n.target) == SCALE_BUFFER]
    muls = [u.name for n in scale_nodes for u in n.users]
    policy = policy or default_policy()
    fp8 = None
    if target is Target.FP8:
        recipe = fp8_recipe or DelayedScaling()
        patterns = compile_patterns(block_nodes)
        blocked = {n for n in gm.graph.nodes
                   if policy_name(op_name(n.target) or "") in set(block_ops) or any(p.search(n.name) for p in patterns)}
        gemms, others = training_gemms(gm, policy, blocked)
    base = transform(
        gm, target.fallback, mode="training", block_ops=block_ops, block_nodes=block_nodes, policy=policy,
        unchecked_constants=scale_nodes,
        notes={m: "the loss-scale node: the loss times the scaler's buffer; backward starts here" for m in muls},
    )
    if target is Target.FP8:
        fp8 = rewrite_training(gm, gemms, recipe)
        training_report(gm, base, fp8, others, policy)
    params = [p for p in model.parameters() if p.requires_grad]
    return TrainStep(gm, scaler, params, clip_grad_norm, fp8)


def _step_dynamic_shapes(dynamic_shapes: Any, x: Any, n_inputs: int) -> Any:
    """``dynamic_shapes`` as given for the step's inputs, made the spec of the captured wrapper, whose
    ``forward(*args)`` takes the model's inputs and ``y`` as one varargs input.

    Accepted: one spec per input as the example is given, ``(x_spec, y_spec)`` (with ``x`` a tuple,
    ``x_spec`` a tuple of one spec per model input, or the specs flat: ``(*x_specs, y_spec)``), and
    the wrapper's own form, a 1-tuple holding that flat tuple. The per-input form
    ``({0: b, 1: t}, {0: b, 1: t})`` was refused by torch.export ("`inputs` has 1 elements, but
    `dynamic_shapes` has 2 elements")."""
    if dynamic_shapes is None or isinstance(dynamic_shapes, dict):
        return dynamic_shapes
    specs = tuple(dynamic_shapes)
    if len(specs) == 1:
        return specs  # the wrapper's varargs form
    if len(specs) == n_inputs + 1 and not (isinstance(x, tuple) and n_inputs == 1):
        return (specs,)  # flat: one spec per model input, then y's
    if len(specs) == 2 and isinstance(x, tuple):
        x_specs = specs[0]
        if x_specs is None:
            x_specs = (None,) * n_inputs
        elif n_inputs == 1 and not (isinstance(x_specs, (tuple, list)) and len(x_specs) == 1):
            x_specs = (x_specs,)
        if isinstance(x_specs, (tuple, list)) and len(x_specs) == n_inputs:
            return ((*x_specs, specs[1]),)
    raise OptionError(
        f"dynamic_shapes has {len(specs)} entries for a step of {n_inputs} model input(s) and y: give one spec "
        "per input as example_inputs is given, (x_spec, y_spec), e.g. ({0: batch}, {0: batch})",
        option="dynamic_shapes",
    )


def _share_state(gm: fx.GraphModule, wrapper: torch.nn.Module) -> None:
    """Make the graph module hold the wrapper's own parameters and buffers (the optimizer's tensors,
    the scaler's scale), whatever copies export made."""
    for name, t in list(wrapper.named_parameters(remove_duplicate=False)) + list(
        wrapper.named_buffers(remove_duplicate=False)
    ):
        *path, leaf = name.split(".")
        try:
            module = gm.get_submodule(".".join(path)) if path else gm
        except AttributeError:
            continue
        if leaf in module._parameters and module._parameters[leaf] is not t:
            module._parameters[leaf] = t  # type: ignore[assignment]  # t is the wrapper's own Parameter
        elif leaf in module._buffers and module._buffers[leaf] is not t:
            module._buffers[leaf] = t
