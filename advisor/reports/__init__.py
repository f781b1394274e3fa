"""Reports: render a diagnosis (session summary, ranked findings, summary tables).

Reports compute nothing: ``build_report`` copies what the earlier stages produced into a
:class:`Report`, and each renderer reads only that Report. The step model's window and
steps (the mean step among them) come in as they are stated (advisor.diagnosis builds them:
``report_window``, ``report_steps``); a report works out no step time of its own.

    report = build_report(session, tables, findings, table_docs=TABLE_DOCS, steps=steps)
    render(report, "terminal")                     # rich, to the console
    render(report, "json", Path("report.json"))     # valid against report.schema.json
    text = render_markdown(report)                  # for a pull-request comment
    html = render_html(report)                      # one self-contained page, charts and all
    cell = render_html_fragment(report)             # findings and charts for a notebook, no script

``report`` holds the Report, a pydantic model (no pandas), ``build`` assembles one from a
session, its tables and findings, and ``schema`` holds the JSON Schema the JSON
report validates against. Besides the report formats (``_terminal``, ``_json``,
``_markdown``, ``_html``; a new format is a module beside them and an entry in
``_render``), this room holds

    summary          the summary tables alone (`advisor summary`)
    perfetto         the session as a Chrome / Perfetto trace with the findings marked
    compare_report   two profiles set side by side (`advisor compare`), in words: what
                     advisor.tables.comparison worked out
"""

from __future__ import annotations

from advisor._lazy import lazy_exports

# Lazily: a command imports the renderer of the format it writes, and nothing of the
# reports before its trace is read.
_EXPORTS = {
    "FORMATS": "_render",
    "render": "_render",
    "render_html": "_html",
    "render_html_fragment": "_html",
    "render_json": "_json",
    "render_markdown": "_markdown",
    "render_terminal": "_terminal",
    "terminal_text": "_terminal",
    "METRIC_DEFINITIONS": "report",
    "Report": "report",
    "Table": "report",
    "TableColumn": "report",
    "build_report": "build",
}

__all__ = [
    "FORMATS",
    "METRIC_DEFINITIONS",
    "Report",
    "Table",
    "TableColumn",
    "build_report",
    "render",
    "render_html",
    "render_html_fragment",
    "render_json",
    "render_markdown",
    "render_terminal",
    "terminal_text",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
