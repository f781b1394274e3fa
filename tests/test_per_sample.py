"""per-sample-model-calls: a step that runs the model once per sample, from the Model
Summary's Forward calls, on hand-made tables and on the recorded case."""

from __future__ import annotations

import pandas as pd
import pytest

from advisor.rules import RuleContext, builtin_specs
from advisor.rules.engine import checks

MS = 1_000_000


def context(forward_calls: int, *, steps: int = 2) -> RuleContext:
    spec = next(s for s in builtin_specs() if s.id == "per-sample-model-calls")
    model = pd.DataFrame({"calls": [steps, forward_calls, steps, steps, steps],
                          "cpu_ratio": [1.0, 0.4, 0.3, 0.05, 0.2]},
                         index=["ProfileStep", "Forward", "Backward", "Optimization", "Others"])
    return RuleContext(tables={"model": model}, spec=spec, step_count=steps, mean_step_ns=10 * MS,
                       window_ns=steps * 10 * MS, gpu_measured=False)


def test_a_model_called_per_sample_is_named_with_the_batched_call_as_the_fix():
    (finding,) = checks()["per-sample-model-calls"](context(64))
    assert "runs 32 times a step" in finding.message and "model(batch)" in finding.recommendation
    # Forward and backward are 70 % of the 10 ms step; batched, 2 of the 32 calls remain.
    assert finding.saving.ms_per_step == pytest.approx(7.0 * (1 - 2 / 32))
    assert finding.saving.high_ms_per_step == pytest.approx(9.0 * (1 - 2 / 32))


def test_one_or_two_forward_passes_a_step_are_a_batched_loop():
    assert checks()["per-sample-model-calls"](context(4)) == []  # the model and the loss, twice a step
