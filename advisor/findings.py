"""Findings: what a rule says about a session, with the evidence behind it.

A finding carries its estimated saving (time per step and share of the step) so findings
can be ranked, and evidence that points at the rows of summary tables, at trace events and
at source lines. A finding that a cause explains is nested under it in ``explains``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator


class Severity(str, Enum):
    info = "info"
    low = "low"
    medium = "medium"
    high = "high"
    critical = "critical"

    @property
    def rank(self) -> int:
        return list(Severity).index(self)


class Saving(BaseModel):
    """The time a fix would save, per step and as a share of the step: a point estimate
    (what findings are ranked by) between a lower and an upper bound, with how it was
    made and what the fix cannot remove."""

    ms_per_step: float = Field(ge=0, description="Estimated milliseconds saved per step (the point estimate).")
    share_of_step: float = Field(ge=0, le=1, description="The same as a share of the mean step time (0..1).")
    basis: str = Field(default="", description="How the estimate was made, in one sentence.")
    low_ms_per_step: float | None = Field(default=None, ge=0, description="The least the fix should save, ms "
                                                                           "per step (null: not estimated).")
    high_ms_per_step: float | None = Field(default=None, ge=0, description="The most it could save, ms per step "
                                                                            "(null: not estimated).")
    remains: str = Field(default="", description="What the fix cannot remove: the floor the step keeps after it.")
    per: Literal["step", "pass"] = Field(default="step", description=(
        "What the milliseconds are per: a step, or one pass where the profile shows its work once (no steps "
        "found; the report's headline says so)."))
    busy_share: float | None = Field(default=None, ge=0, le=1, description=(
        "The share of its run the job's main thread waited for a CPU core, where the machine was busy (null: "
        "quiet, or not measured): the milliseconds were measured under that load and stretch with it; the "
        "share of the step holds."))

    @model_validator(mode="after")
    def _ordered(self) -> "Saving":
        if self.low_ms_per_step is not None and self.low_ms_per_step > self.ms_per_step + 1e-9:
            raise ValueError("low_ms_per_step is above the point estimate")
        if self.high_ms_per_step is not None and self.high_ms_per_step + 1e-9 < self.ms_per_step:
            raise ValueError("high_ms_per_step is below the point estimate")
        return self


class Evidence(BaseModel):
    """One piece of evidence: a table row, a trace event or a source line."""

    kind: Literal["table_row", "event", "source_line"]
    table: str | None = Field(default=None, description="Summary table name, for table_row.")
    row: str | None = Field(default=None, description="The row's stable key in that table.")
    column: str | None = None
    value: Any = None
    unit: str | None = Field(default=None, description="The value's unit where the column name does not say it ('ns', 'bytes', ...).")
    event_id: int | None = Field(default=None, description="Row id in the session's events, for event.")
    name: str | None = Field(default=None, description="The event's or row's name, for people.")
    start_ns: int | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    note: str = ""


class Verification(BaseModel):
    """The finding's fix applied by ``advisor verify`` and measured: the script run again
    with the fix and without it, unprofiled, over the same steps, alternately."""

    applied: str = Field(description="The fix advisor applied from outside the script, in words "
                                     "(e.g. 'DataLoader num_workers=2, persistent_workers=True').")
    before_ms_per_step: float = Field(ge=0, description="Mean step without the fix, ms (mean of the runs' means).")
    after_ms_per_step: float = Field(ge=0, description="Mean step with the fix, ms (mean of the runs' means).")
    before_spread_ms: float = Field(default=0.0, ge=0, description="Standard deviation of the runs' mean step "
                                                                    "without the fix, ms.")
    after_spread_ms: float = Field(default=0.0, ge=0, description="The same with the fix, ms.")
    measured_saving_ms_per_step: float = Field(description="before - after, averaged over the pairs of runs "
                                                           "(negative: the fix made the step slower).")
    inside_range: bool = Field(description="Whether the measured saving lies inside the finding's predicted "
                                           "range (its point estimate where no range was given).")
    clear_of_noise: bool = Field(description="Whether the difference stood clear of the run-to-run noise before "
                                             "the trials stopped (else the time budget ran out first).")
    trials: int = Field(ge=0, description="Pairs of runs (one without the fix, one with it).")
    steps_timed: int = Field(ge=0, description="Steps timed in each run (after its warm-up steps).")


class NotVerified(BaseModel):
    """Why ``advisor verify`` did not measure a finding's fix."""

    reason: str = Field(description="One line: the fix needs an edit advisor cannot make from outside, a GPU, "
                                    "an opt-in (--try), or the trials failed.")


class Finding(BaseModel):
    rule: str = Field(description="The id of the rule that produced it.")
    title: str
    severity: Severity
    confidence: float = Field(ge=0, le=1)
    saving: Saving
    message: str = Field(description="What was found, with the figures.")
    recommendation: str = Field(description="What to do about it.")
    evidence: list[Evidence] = Field(default_factory=list)
    explains: list["Finding"] = Field(
        default_factory=list, description="Symptoms this finding is the cause of, nested here instead of ranked beside it."
    )
    metrics: dict[str, Any] = Field(default_factory=dict, description="The figures the rule computed.")
    verification: Verification | None = Field(default=None, title="Verification", description="The fix applied and measured by "
                                                                        "`advisor verify` (null: not verified).")
    not_verified: NotVerified | None = Field(default=None, title="Not verified", description="Why `advisor verify` did not measure this "
                                                                       "finding's fix (null: verified, or not asked).")
    # The fix as a change to the step model's graph (advisor.step.whatif.Fix), where the
    # rule made one: the engine replays every finding's fix at once for the combined
    # estimate. Not part of the report.
    _fix: Any = PrivateAttr(default=None)

    def with_fix(self, fix: Any) -> "Finding":
        """This finding, carrying ``fix`` (see ``_fix``)."""
        self._fix = fix
        return self
