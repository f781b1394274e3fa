"""The JSON report: the Report model as JSON, valid against advisor/schemas/report.schema.json."""

from __future__ import annotations

from advisor.reports.report import Report

__all__ = ["render_json"]


def render_json(report: Report) -> str:
    """The report as JSON text (indent 2, UTF-8 characters kept, a final newline)."""
    return report.model_dump_json(indent=2) + "\n"
