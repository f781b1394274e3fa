"""The registry of Python checks, and what a check may read.

A rule is a spec in a YAML pack (:mod:`advisor.rules.packs`); a rule without a condition
of its own is evaluated by the check function registered under its id:

    from advisor.rules import RuleContext, register

    @register("my-rule")
    def my_rule(ctx: RuleContext) -> list[Finding]: ...

The built-in checks (:mod:`advisor.rules.checks`) and those of plugins register here;
the engine looks them up here. This module imports neither, so both can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from advisor.findings import Finding
from advisor.rules.packs.spec import RuleSpec

if TYPE_CHECKING:
    from advisor.step import StepModel
    from advisor.step.whatif import Fix, WhatIf

__all__ = ["Check", "RuleContext", "register", "registered"]


@dataclass
class RuleContext:
    """What a check may read: the tables, the step model (its window, the partition of the
    step's time by cause, the graph fixes are replayed on), a few facts about the session,
    its spec."""

    tables: dict[str, pd.DataFrame]
    spec: RuleSpec
    step_count: int
    # The mean step, ns: the step model's ``mean_step_ns`` (advisor.step.timing), the job's own
    # step where steps ran without the profiler; savings are shares of it. A check that
    # divides what the window measured per step reads ``model.recorded_step_ns`` instead.
    mean_step_ns: float
    window_ns: int
    gpu_measured: bool
    facts: dict[str, Any] = field(default_factory=dict)
    model: StepModel | None = None

    def threshold(self, name: str) -> float:
        return float(self.spec.thresholds[name])

    @property
    def run_step_ns(self) -> float:
        """The step as the run averages it: the mean step and, where steps run extra work
        every N steps, that work spread over the steps (``StepTimes.beside_ns``; what a
        user's own timer reads). A saving's share of the step is of this."""
        beside = self.model.times.beside_ns if self.model is not None else 0.0
        return (self.mean_step_ns or 0.0) + beside

    def table(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())

    def what_if(self, fix: Fix, *, base: Fix | None = None) -> WhatIf | None:
        """``fix`` replayed on the step model's graph (advisor.step.whatif): the step
        before and after, per step; None where there is no model."""
        if self.model is None:
            return None
        from advisor.step.whatif import what_if

        return what_if(self.model.graph, fix, base=base)


Check = Callable[[RuleContext], list[Finding]]
_CHECKS: dict[str, Check] = {}


def register(rule_id: str) -> Callable[[Check], Check]:
    """Decorator: register the check that evaluates rule ``rule_id``."""

    def wrap(func: Check) -> Check:
        _CHECKS[rule_id] = func
        return func

    return wrap


def registered() -> dict[str, Check]:
    """The checks registered so far, by rule id."""
    return dict(_CHECKS)
