"""``--tolerance`` on inputs it never saw (issue 23): chosen on half the calibration samples and checked
on the other half, the result stays within the tolerance on fresh samples of the same kind (neither
chosen on nor held out), or says honestly that it did not meet it. The rows are
:mod:`benchmarks.holdout_table`'s (its table in ``benchmarks/RESULTS.md``)."""

from __future__ import annotations

import pytest

from benchmarks.holdout_table import tolerance_row
from models import catalog

#: Small entries where half the plain conversion's error makes the choice pin units (seconds each).
FAST = ("decomposed-activations", "seg-sigmoid-edge", "text-det-sigmoid")


@pytest.mark.parametrize("name", FAST)
def test_a_tolerance_that_needs_a_choice_holds_on_held_out_and_fresh_inputs(name):
    row = tolerance_row(name, 0.5, 4, 8, relative=True)  # half the plain conversion's error
    assert row.runs > 4, f"{name}: the plain conversion met half its own error: no choice was made ({row})"
    assert row.met, f"{name}: the choice did not meet {row.limit:.2e} on its own samples ({row})"
    assert row.choice <= row.limit and row.held <= row.limit, row
    assert row.fresh <= row.limit, f"{name}: {row.fresh:.3%} on fresh inputs against a tolerance of {row.limit:.3%}"


#: Entries where --tolerance 0.01 is met on the calibration samples and missed on fresh ones, and why
#: (measured). A miss not recorded here fails; a record that holds again fails too (drop it).
MISSES_ON_FRESH: dict[str, str] = {
    "llama-massive-activations-small": (
        "heavy-tailed per-sample error: 0.03-0.05% on 16 calibration samples (seeds 0-15), but 3 of 16 fresh "
        "samples reach 0.9-35% (4 of 64 others above 0.5%); on the worst the error appears at the final RMSNorm's "
        "product (node_mul_858, FP32: 35% relative L2 from inputs within 0.4%). No calibration sample showed "
        "it, and choosing with the worst fresh one among them fits that one only (4.4% on 64 others)"
    ),
    "massive-swiglu-tail": (
        "the same pattern, hand-built (models/tail_patterns.py): 0.15% chosen, 0.32% held out, 3.4% on 16 fresh "
        "samples of 512 tokens; the few tokens that amplify FP16 rounding 1000x are not in every sample, and "
        "the default conversion warns of it (output_error.concentrated)"
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [e.name for e in catalog.entries("small")])
def test_tolerance_one_percent_holds_on_fresh_inputs_across_the_catalog(name):
    row = tolerance_row(name, 0.01, 4, 16)
    if row.met:
        assert row.choice <= 0.01 and row.held <= 0.01, row
    if name in MISSES_ON_FRESH:
        assert not row.holds, f"{name}: holds on fresh inputs now ({row}): drop it from MISSES_ON_FRESH"
        return
    assert row.holds, f"{name}: {row.fresh:.3%} on 16 fresh samples against --tolerance 0.01, met on its own ({row})"
