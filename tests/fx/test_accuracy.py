"""The FX conversion measures before it returns (amp_compiler.fx.graph.accuracy): the converted graph's outputs
against the FP32 graph's on the inputs its ranges were observed on, in the report, its summary and, past the
ONNX path's line, its warnings."""

import pytest
import torch

import amp_compiler.fx as ampfx
from tests.support.fx_helpers import error_of_range, one_thread  # noqa: F401 - autouse: torch on one thread


class Cancelling(torch.nn.Module):
    """``(h + 1000) - 1000`` between two linears: no value is past FP16's range, but FP16 holds 1000 + h to
    0.5, so the small ``h`` is lost; the labels of its argmax change with it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        logits = self.b((self.a(x) + 1000.0) - 1000.0)
        return logits, logits.argmax(-1)


class Tame(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_an_output_past_the_line_is_measured_stated_and_warned_of():
    """Before, the FX conversion stated no error: this model's logits were 60% of their range off, silently."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)) * 0.01
    gm = ampfx.convert(Cancelling().eval(), (x,))
    rep = ampfx.report(gm)
    logits, labels = rep.accuracy
    assert not logits.exact and logits.error_of_range > 0.1
    assert labels.exact and labels.changed and labels.values == 8
    assert f"max error {logits.error_of_range:.2%} of range" in rep.summary()
    assert any(w.startswith(f"output {logits.name}: its max error") and "on the example inputs" in w
               for w in rep.warnings)
    assert any(w.startswith(f"output {labels.name}: ") for w in rep.warnings)


def test_a_tame_model_states_its_small_error_and_warns_of_nothing():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    model = Tame().eval()
    gm = ampfx.convert(model, (x,))
    rep = ampfx.report(gm)
    (out,) = rep.accuracy
    assert out.finite and out.error_of_range < 0.01
    assert abs(out.error_of_range - error_of_range(model, gm, (x,))) < 1e-6  # what the user's own run sees
    assert "output vs FP32 on them: max error" in rep.summary() and not rep.warnings


def test_calibration_samples_are_what_it_is_measured_on_and_no_run_no_measure():
    model = Tame().eval()
    samples = [torch.randn(8, 16, generator=torch.Generator().manual_seed(s)) for s in (2, 3)]
    rep = ampfx.report(ampfx.convert(model, (samples[0],), calibration=samples))
    assert rep.accuracy and rep.ranges_from == "2 calibration samples"
    rep = ampfx.report(ampfx.convert(model, (samples[0],), probe=False))
    assert rep.accuracy == [] and "output vs FP32" not in rep.summary()


class SizeFirst(torch.nn.Module):
    """Returns a size before its tensor: the graph's output holds a constant where the run holds an int."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 4)

    def forward(self, x):
        return x.shape[0], self.a(x)


def test_a_returned_constant_leaves_each_output_measured_under_its_own_name():
    gm = ampfx.convert(SizeFirst().eval(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),))
    rep = ampfx.report(gm)
    assert [(a.name, a.exact) for a in rep.accuracy] == [(rep.output_names[0], False)]
    assert rep.accuracy[0].error_of_range < 0.01


@pytest.mark.parametrize(("field", "quiet", "loud", "said"), [
    ("concentration", 1.5, 12.0, "12x the 90th percentile"),  # its worst position 12x its 90th percentile's
    ("tie_move", 0.01, 0.05, "up to 5.0%"),  # a tie between two classes would move it 5%
])
def test_an_output_within_the_line_that_other_inputs_can_take_past_it_is_warned_of(field, quiet, loud, said):
    """Within the line on the inputs, but its error sits in a few positions, or a tie would move it past the line."""
    from amp_compiler.core.measures import OutputAccuracy
    from amp_compiler.fx.graph.accuracy import accuracy_warnings

    def measured(value: float) -> OutputAccuracy:
        return OutputAccuracy("logits", 0.99999, 0.004, 1.0, True, 1e-3, **{field: value})

    assert accuracy_warnings([measured(quiet)], "the example inputs") == []
    (warning,) = accuracy_warnings([measured(loud)], "the example inputs")
    assert "0.40% of its range on the example inputs" in warning and said in warning


class Score(torch.nn.Module):
    """A confident binary classifier: one sigmoid score per example, its logits in the hundreds."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(16, 1)
        with torch.no_grad():
            self.fc.weight.mul_(300.0)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)).view(-1)


def test_a_sigmoid_score_is_a_probability_of_two_classes():
    """Scores of exactly 0 or 1 on the example inputs say nothing of the threshold: the output is measured as a
    probability (a sigmoid's, through a view), certain everywhere here."""
    rep = ampfx.report(ampfx.convert(Score().eval(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),)))
    (score,) = rep.accuracy
    assert score.saturated == 1.0 and score.tie_move is None, score
