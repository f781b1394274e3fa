"""The rule-pack format: the pydantic models a YAML pack is read into.

These models are the one source of truth for the format: the JSON Schema in
rules/rulepack.schema.json is generated from them (``python -m advisor.rules.packs.schema``)
and a test checks the committed file equals what they generate.

A rule is either

- a *data rule*: it names a summary ``table`` and a ``condition`` over that table's
  columns (and its own ``derived`` columns, ``values`` read from single cells and its
  ``thresholds``); every row where the condition holds becomes a finding, with
  ``message``, ``recommendation`` and ``saving`` filled in from the row; or
- a *Python rule*: no condition; its check is code registered under the rule's id
  (``advisor.rules.register``), built in or from an installed package's ``advisor.rules``
  entry point. A YAML pack can never name code to run.

Both kinds share id, title, severity, lifecycle, thresholds, ``explains`` and the four
documentation sections. Which fields go with which kind, and everything that needs the
table catalogue (tables, columns, expressions, placeholders), is checked in
:mod:`advisor.rules.packs.validate`, which reports every problem with its file and line.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints

from advisor.findings import Severity

__all__ = [
    "FACTS",
    "NAME_PATTERN",
    "RULE_ID_PATTERN",
    "Escalation",
    "Lifecycle",
    "Requirement",
    "RuleDocs",
    "RulePack",
    "RuleSpec",
    "SavingSpec",
    "ValueRef",
]

RULE_ID_PATTERN = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
_PACK_PATTERN = r"^[a-z][a-z0-9_-]*$"

RuleId = Annotated[str, StringConstraints(pattern=RULE_ID_PATTERN)]
# Threshold and value names are read as @name in expressions: lowercase identifiers.
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
# A number, not a string that looks like one: "0.5" in a pack is a mistake worth naming.
Number = Annotated[float, Field(strict=True)]

# Facts about the session every expression may read as @name, and every message as {name}.
FACTS: dict[str, str] = {
    "step_count": "steps found in the profile (0 where there are none)",
    "steps": "step_count, or 1 where there are no steps (the whole window then counts as one step)",
    "mean_step_ns": "mean step time in ns: the step model's (advisor.step.timing), the job's own where steps ran "
                    "without the profiler; the window's length where there are no steps",
    "window_ns": "length of the profiled window in ns",
    "gpu_measured": "true where the GPU was measured",
}


class Lifecycle(str, Enum):
    """stable rules run by default; preview rules only when asked for (config ``preview =
    true``, ``--preview``, or ``enable``); deprecated rules only when named in ``enable``."""

    stable = "stable"
    preview = "preview"
    deprecated = "deprecated"


class Requirement(str, Enum):
    steps = "steps"
    gpu = "gpu"
    ranks = "ranks"  # a job of two ranks or more: the rule reads the cross-rank tables


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuleDocs(_Strict):
    """The rule's documentation, in the same four sections for every rule (``advisor rules
    show ID`` prints them)."""

    what: str = Field(min_length=1, title="What it does", description="What the rule measures and when it fires.")
    why: str = Field(min_length=1, title="Why it matters", description="Why the smell costs time.")
    example: str = Field(min_length=1, title="Example", description="Code that has the smell.")
    instead: str = Field(min_length=1, title="Use instead", description="The same code without it.")


class ValueRef(_Strict):
    """One cell of a summary table, read by a data rule as @name: for comparing a row with
    another row (the Optimization phase against Forward and Backward, say)."""

    table: str = Field(title="Table", description="A summary table (see `advisor summary`).")
    row: str = Field(title="Row key", description="The row's stable key; a row that is absent reads as NaN.")
    column: str = Field(title="Column", description="One of the table's columns.")


class SavingSpec(_Strict):
    """What fixing the smell would save, per matching row."""

    ns_per_step: str = Field(
        title="Saving expression",
        description="Expression over the row's columns (or just a column's name) giving the "
                    "nanoseconds per step a fix would save; NaN or below 0 counts as 0.",
    )
    basis: str = Field(default="", title="Basis", description="How the estimate is made, in one sentence.")


class Escalation(_Strict):
    """A higher (or lower) severity for the rows where ``when`` holds."""

    severity: Severity = Field(title="Severity", description="The severity of a finding whose row matches.")
    when: str = Field(title="Condition", description="Expression over the row, like the rule's condition.")


FIX_NAMES = ("dataloader", "batched_index", "optimizer", "zero_grad_set_to_none", "tf32", "cudnn_benchmark",
             "amp", "fp32", "compile")


class VerifyFix(_Strict):
    """A fix ``advisor verify`` can apply from outside the script, for this rule's findings."""

    apply: Literal[FIX_NAMES] = Field(  # type: ignore[valid-type]
        title="Fix", description="One of advisor's built-in fixes (advisor/verify/fixes.py): dataloader "
                                 "(num_workers, pin_memory, persistent_workers, prefetch_factor, torch_threads), "
                                 "batched_index, optimizer (foreach, fused), zero_grad_set_to_none, tf32, "
                                 "cudnn_benchmark, amp, fp32 (CPU autocast off), compile.")
    with_: dict[Name, str | Number | bool] = Field(
        default_factory=dict, alias="with", title="With",
        description="The fix's settings: a value, or '{metric}' for a figure of the finding's metrics "
                    "('{metric?}': left out where the finding has none).")
    requires: list[Name] = Field(default_factory=list, title="Requires",
                                 description="Metrics the finding must have for this fix to apply "
                                             "(else the next fix listed is tried).")


class RuleSpec(_Strict):
    """One rule: what it flags, how severe, its thresholds and documentation and, for a
    data rule, the condition, message, recommendation, saving and evidence."""

    id: str = Field(pattern=RULE_ID_PATTERN, title="Rule id",
                    description="Stable id in kebab-case; renaming one needs a redirect.")
    title: str = Field(min_length=1, title="Title", description="One line naming the smell.")
    severity: Severity = Field(title="Severity", description="The severity of its findings (see escalate).")
    lifecycle: Lifecycle = Field(default=Lifecycle.stable, title="Lifecycle",
                                 description="stable, preview (opt-in) or deprecated (only when enabled).")
    tables: list[str] = Field(default_factory=list, title="Tables",
                              description="The summary tables the rule reads.")
    explains: list[RuleId] = Field(default_factory=list, title="Explains",
                                description="Ids of rules whose findings this one's cause: "
                                            "they are shown nested under it.")
    thresholds: dict[Name, Number] = Field(default_factory=dict, title="Thresholds",
                                         description="Named numbers the rule compares against "
                                                     "(@name in expressions); users override them "
                                                     "in their config.")
    requires: list[Requirement] = Field(default_factory=list, title="Requires",
                                        description="Run only on sessions with steps and/or a measured GPU; "
                                                    "'ranks': only on a job of two ranks or more, "
                                                    "reading its cross-rank tables.")
    leads: bool = Field(default=False, title="Leads the report",
                        description="A rule about the profile itself (what it does not cover): its findings "
                                    "come before all others whatever their saving.")
    docs: RuleDocs = Field(title="Documentation", description="What it does, why it matters, an example "
                                                              "and what to do instead.")
    verify: list[VerifyFix] = Field(default_factory=list, title="Verify",
                                    description="Fixes `advisor verify` can apply from outside the script, in "
                                                "order: the first whose settings resolve is applied.")
    not_verifiable: str = Field(default="", title="Not verifiable",
                                description="Why this rule's fix cannot be applied from outside the script "
                                            "(it needs an edit), said by `advisor verify`.")
    # -- data rules ---------------------------------------------------------------------
    table: str | None = Field(default=None, title="Table",
                              description="Data rule: the table whose rows the condition is evaluated on.")
    condition: str | None = Field(default=None, title="Condition",
                                  description="Data rule: an expression over the table's columns "
                                              "(pandas eval syntax); each row where it holds is a finding.")
    values: dict[Name, ValueRef] = Field(default_factory=dict, title="Values",
                                        description="Data rule: single table cells, read as @name.")
    derived: dict[Name, str] = Field(default_factory=dict, title="Derived columns",
                                     description="Data rule: named expressions computed per row, in "
                                                 "order, and then read like the table's columns "
                                                 "(calls_per_step: calls / @steps).")
    saving: SavingSpec | None = Field(default=None, title="Saving",
                                      description="Data rule: the estimated saving per step.")
    message: str | None = Field(default=None, title="Message",
                                description="Data rule: what was found; {placeholders} are filled "
                                            "from the row, thresholds, values and facts.")
    recommendation: str | None = Field(default=None, title="Recommendation",
                                       description="Data rule: what to do, with {placeholders} as in message.")
    evidence: list[str] = Field(default_factory=list, title="Evidence columns",
                                description="Data rule: the row's columns cited as evidence.")
    escalate: list[Escalation] = Field(default_factory=list, title="Escalate",
                                       description="Data rule: severities for rows matching further "
                                                   "conditions; the first that holds wins.")
    confidence: Number = Field(default=0.7, ge=0, le=1, title="Confidence",
                              description="How sure a finding is (0..1).")
    limit: int = Field(default=5, ge=1, le=100, title="Limit",
                       description="Data rule: at most this many findings, largest saving first.")

    # Where the rule was read from, for messages; not part of the format.
    _source: str = PrivateAttr(default="")
    _line: int = PrivateAttr(default=0)

    @property
    def is_data_rule(self) -> bool:
        return self.condition is not None

    @property
    def source(self) -> str:
        """``FILE:LINE`` of the rule's definition where it was read from a file."""
        return f"{self._source}:{self._line}" if self._source else ""

    def located(self, source: str, line: int) -> RuleSpec:
        self._source, self._line = source, line
        return self


class RulePack(_Strict):
    """A rule pack: a named list of rules and the redirects of renamed rule ids."""

    pack: str = Field(pattern=_PACK_PATTERN, title="Pack name",
                      description="Short name of the pack (lowercase letters, digits, - and _).")
    version: Literal[1] = Field(default=1, title="Format version", description="The pack format's version: 1.")
    description: str = Field(default="", title="Description", description="What the pack is for.")
    redirects: dict[RuleId, RuleId] = Field(default_factory=dict, title="Redirects",
                                      description="Old rule id -> its new id, for renamed rules.")
    rules: list[RuleSpec] = Field(title="Rules", description="The pack's rules.")

    # The file it was read from, for messages; not part of the format.
    _source: str = PrivateAttr(default="")

    @property
    def source(self) -> str:
        return self._source
