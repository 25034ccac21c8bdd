"""The choice ``--tolerance`` makes per unit: its precision levels, measured on the probe, and the
nodes the picked level pins, keeps low or puts in FP8.

A unit (:mod:`amp_compiler.onnx.tolerance.units`) can be

- ``fp32``: every node of it in FP32 (pinned);
- ``low-root`` (a Tensor Core unit with followers): its Tensor Core op low, the cheap ops it feeds
  FP32: their roundings (a decomposed BatchNorm and HardSwish round five times after a convolution)
  go, the Tensor Core FLOPs stay;
- ``low``: everything low (FP16 or BF16);
- ``fp8-root`` / ``fp8`` (``--target fp8``, an FP8 candidate's unit): as the two before, with the
  Tensor Core op reading FP8 E4M3 inputs through Q/DQ.

Each level's error is measured alone on the probe (:mod:`amp_compiler.onnx.measure.probe`: only the
unit's switches on), but for ``low`` (``fp8``) when ``low-root`` (``fp8-root``) alone is already beyond
the room the tolerance leaves: the whole unit is assumed to move the outputs at least as much as its
root alone (its switches are the root's and more: every rounding the root level makes, and its
followers'), so it takes the root level's error, a lower bound, unmeasured. Checked in full on 217
units with followers (8 catalog models, 9 tolerances): the whole was below its root alone in 10 (errors
partly cancelling; at most to 0.39x, ppocr-cls), and never within the room where its root was beyond.
Its value is the GEMM time it saves against FP32 on an H100
(:data:`amp_compiler.targets.GEMM_RATE`: TF32 is half FP16's rate, FP8 twice it), so FP32 is avoided
first and FP8 taken where it also fits. The set of levels is chosen by the verified choice
(:class:`amp_compiler.core.choice.VerifiedChoice`: the knapsack for budgets around the tolerance,
measured on the probe, then single units moved up one level while the probe still finds the whole
within it), the FP8 budget's loop too.

Guarantees: :func:`decide` gives every node of every unit exactly one of pinned, kept low (and FP8
for the Tensor Core op of an FP8 level), each with a reason carrying the measured numbers.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Sequence

import onnx

from amp_compiler.core.knapsack import Option
from amp_compiler.onnx.tolerance.units import Unit
from amp_compiler.passes.onnx.split_products import SPLIT_PRODUCTS
from amp_compiler.targets import GEMM_RATE, Target

__all__ = ["Choice", "Decided", "Level", "decide", "decide_fp32", "switches_on", "unit_choices", "value"]


class Level(enum.Enum):
    FP32 = "fp32"
    LOW_ROOT = "low-root"
    LOW = "low"
    FP8_ROOT = "fp8-root"
    FP8 = "fp8"

    @property
    def fp8(self) -> bool:
        return self in (Level.FP8_ROOT, Level.FP8)

    @property
    def followers_low(self) -> bool:
        return self in (Level.LOW, Level.FP8)


@dataclasses.dataclass(frozen=True)
class Choice:
    level: Level
    option: Option  # its error alone at the outputs, and its value
    groups: frozenset[int]  # the probe's groups it switches on
    measured: bool = True  # False: not measured, its error is its root level's (a lower bound)


# The level that is the same unit with its followers in FP32: its error bounds the whole's from below.
_ROOT_LEVEL = {Level.LOW: Level.LOW_ROOT, Level.FP8: Level.FP8_ROOT}


def value(flops: int, target: Target, fp32_products: str = "plain") -> int:
    """The GEMM time ``flops`` save in ``target`` against FP32 (TF32 on Tensor Cores), in units of
    half an FP16 FLOP: 2 per FLOP in FP16/BF16, 3 in FP8. With ``fp32_products`` ``split`` an FP32
    level is written as :data:`~amp_compiler.passes.onnx.split_products.SPLIT_PRODUCTS` TF32 products
    (``--fp32-products split``): 14 per FLOP in FP16/BF16, 15 in FP8."""
    fp32 = (SPLIT_PRODUCTS if fp32_products == "split" else 1) / GEMM_RATE["fp32"]
    return round(2 * flops * (fp32 - 1 / GEMM_RATE[target.value]))


def unit_choices(
    error_alone: Callable[[frozenset[int]], float], unit: Unit, groups: Sequence[int], fp8_group: int | None,
    low: Target, room: float = math.inf, fp32_products: str = "plain",
) -> list[Choice]:
    """A unit's levels (see module doc), FP32 first. ``groups``: its probe groups, the root's first
    (a Tensor Core unit with followers has two); ``fp8_group``: its root's FP8 switch, if it has one;
    ``error_alone``: the error the groups switched on alone add at the outputs; ``room``: the error a
    level may add alone and still fit (a whole unit whose root level is beyond it is not measured);
    ``fp32_products``: how an FP32 level is written, which its price follows (:func:`value`)."""
    flops, root = unit.tensor_core_flops, frozenset(groups[:1])
    found = [Choice(Level.FP32, Option(0.0, 0), frozenset())]
    levels = [(Level.LOW, low, frozenset(groups))]
    if len(groups) > 1:
        levels.insert(0, (Level.LOW_ROOT, low, root))
    if fp8_group is not None:
        levels += [(Level.FP8_ROOT, Target.FP8, root | {fp8_group})] if len(groups) > 1 else []
        levels += [(Level.FP8, Target.FP8, frozenset(groups) | {fp8_group})]
    for level, target, on in levels:
        worth = max(value(flops, target, fp32_products) + (1 if level.followers_low else 0), 1)  # ties: fewer pins
        root_level = next((c for c in found if c.level is _ROOT_LEVEL.get(level)), None)
        if root_level is not None and root_level.option.error > room:
            found.append(Choice(level, Option(root_level.option.error, worth), on, measured=False))
        else:
            found.append(Choice(level, Option(error_alone(on), worth), on))
    return found


def switches_on(items: Sequence[Sequence[Choice]], picks: Sequence[int]) -> frozenset[int]:
    """The probe's switches the level picked per unit turns on."""
    return frozenset().union(*(item[k].groups for item, k in zip(items, picks, strict=True)))


@dataclasses.dataclass
class Decided:
    """What the conversion must do: nodes pinned to FP32, kept low, and Tensor Core ops in FP8, each
    ``(position, why)``."""

    pinned: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    kept: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    fp8: list[tuple[int, str]] = dataclasses.field(default_factory=list)


def decide(graph: onnx.GraphProto, units: Sequence[Unit], items: Sequence[Sequence[Choice]], picks: Sequence[int],
           tolerance: float, low: Target) -> Decided:
    """The nodes of each unit as its picked level has them (see module doc), with reasons."""
    out = Decided()
    tol = f"--tolerance {tolerance:g}"
    for unit, item, pick in zip(units, items, picks, strict=True):
        root = graph.node[unit.root]
        name = f"{root.op_type} '{root.name}'" if root.name else root.op_type
        whole = f"{name} and the {len(unit.nodes) - 1} op(s) it feeds" if len(unit.nodes) > 1 else name
        whole_low = next(c for c in item if c.level is Level.LOW)
        effect = f"in {low.value} alone {whole} move(s) the outputs by {whole_low.option.error:.2e} (relative L2)"
        if not whole_low.measured:
            effect = (f"in {low.value} alone {name} moves the outputs by {whole_low.option.error:.2e} (relative L2) "
                      f"before the {len(unit.nodes) - 1} op(s) it feeds round it again")
        cost = (f"{unit.tensor_core_flops:.3g} Tensor Core FLOPs" if unit.tensor_core_flops
                else "no Tensor Core FLOPs")
        chosen = item[pick]
        if chosen.level is Level.FP32:
            out.pinned += [(i, f"pinned by {tol}: {effect}, too much for {cost}") for i in unit.nodes]
            continue
        if chosen.level.fp8:
            fp8 = f"{chosen.option.error:.2e} with FP8 E4M3 inputs" + ("" if chosen.level.followers_low else
                                                                       " and the ops it feeds in FP32")
            out.fp8.append((unit.root, f"FP8 by {tol}: {effect}; {fp8}, within the budget for {cost}"))
            why = f"kept by {tol} for its FP8 GEMM {name}"
        elif chosen.level is Level.LOW_ROOT:
            why = (f"kept by {tol}: {effect}; with the ops it feeds in FP32, {chosen.option.error:.2e}, "
                   f"within the budget for {cost}")
        else:
            why = f"kept by {tol}: {effect}, within the budget for {cost}"
        out.kept.append((unit.root, why))
        followers = unit.nodes[1:]
        if chosen.level.followers_low:
            out.kept += [(i, why) for i in followers]
        else:
            out.pinned += [(i, f"pinned by {tol} after {name}: {effect}; with them in FP32 it moves them by "
                            f"{chosen.option.error:.2e}, enough to keep its {cost} low") for i in followers]
    out.pinned.sort()
    out.kept.sort()
    return out


def decide_fp32(units: Sequence[Unit], tolerance: float, base: float, low: Target) -> Decided:
    """Every node of every unit pinned, unmeasured: with every unit in FP32 the probe already moves
    the outputs by ``base``, beyond ``tolerance``."""
    why = (f"pinned by --tolerance {tolerance:g}: with every unit in FP32 the probe already moves the outputs by "
           f"{base:.2e}, beyond it (what no unit controls), so no unit can stay {low.value}")
    return Decided(pinned=sorted((i, why) for unit in units for i in unit.nodes))
