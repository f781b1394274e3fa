"""advisor in a notebook: ``advisor.diagnose(target)``.

    import advisor
    d = advisor.diagnose("trace.json.gz")       # a trace, a saved session, a job's folder
    d                                           # the findings and charts, inline (_repr_html_)
    d.findings[0].saving.ms_per_step            # the ranked findings (advisor.findings.Finding)
    d.tables["operator"].head()                 # every summary table as a DataFrame
    d.to_json()                                 # the JSON report (report.schema.json)

The cell shows the HTML report's findings and charts, styled inside the cell only and
without a script, so a notebook viewer that strips scripts shows it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from advisor.api.target import diagnose_target

__all__ = ["Diagnosis", "diagnose"]


@dataclass
class Diagnosis:
    """A target's diagnosis, for a notebook: the report, its findings and its tables."""

    report: Any  # advisor.reports.Report
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What the rules said on the way (a pack's problems, a rule that could not run)."""

    @property
    def findings(self) -> list[Any]:
        """The ranked findings (advisor.findings.Finding), largest saving first."""
        return list(self.report.findings)

    def to_json(self) -> str:
        """The JSON report, as `advisor diagnose --format json` writes it."""
        from advisor.reports import render_json

        return render_json(self.report)

    def _repr_html_(self) -> str:
        from advisor.reports import render_html_fragment

        return render_html_fragment(self.report)

    def __repr__(self) -> str:
        top = self.findings[0] if self.findings else None
        head = (f"{top.rule}, saves {top.saving.ms_per_step:.3g} ms/step" if top is not None else "no findings")
        return f"<advisor Diagnosis of {self.report.session.source}: {len(self.findings)} findings; top: {head}>"


def diagnose(target: str | Path, *, rules: list[str] | None = None, gpu: str | None = None) -> Diagnosis:
    """Diagnose a trace, a saved session or a job's folder as `advisor diagnose` does.
    ``rules``: rule packs of your own (paths); ``gpu``: judge against this GPU (A100, ...).
    Bad input raises advisor.errors.AdvisorError with the command's one-line message."""
    done = diagnose_target(target, rules=rules, gpu=gpu)
    return Diagnosis(done.report, done.tables, done.said)
