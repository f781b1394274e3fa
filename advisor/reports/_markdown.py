"""The Markdown report, fit for a pull-request comment (GitHub-flavoured Markdown).

Findings as a numbered list (symptoms nested under their cause), then the Model, Perf and
Device tables and the top Operator and Kernel rows. Text that came from a trace (kernel
names, file names) is escaped, so ``void k<a|b>`x``` cannot break a table or a code span.
"""

from __future__ import annotations

import re

from advisor.findings import Finding
from advisor.reports._common import (
    saving_verb,
    verification_line,
    COLLECTIVE_COLUMNS,
    RANK_COLUMNS,
    cell_text,
    combined_text,
    command_text,
    compact_columns,
    devices_text,
    evidence_segments,
    find_table,
    gpu_text,
    job_text,
    numeric_columns,
    steps_text,
)
from advisor.reports.report import Report, Table
from advisor.units import format_ns, format_saving

__all__ = ["md_code", "md_escape", "render_markdown"]

TOP_ROWS = 10
MAX_COLUMNS = 8
# Cut a cell at this many characters: templated kernel names run to hundreds.
MAX_CELL = 120

# The characters that mean something inside a line (a table cell never starts a line, so
# the block markers # + - . need no escape there).
_ESCAPE = re.compile(r"([\\`*_\[\]<>|~&$])")


def md_escape(text: str) -> str:
    """``text`` as literal Markdown inline text, safe in a table cell: every character
    Markdown might read as syntax is backslash-escaped, line breaks become spaces."""
    text = str(text).replace("\r", " ").replace("\n", " ")
    return _ESCAPE.sub(r"\\\1", text)


def _md_prose(text: str) -> str:
    """Text written by a rule (messages, recommendations): its Markdown kept, but no raw
    HTML and no line that ends the list item."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return " ".join(text.split())


def md_code(text: str) -> str:
    """``text`` as a code span, whatever backticks it holds (for prose and lists: inside
    a table cell use :func:`md_escape`, whose ``\\|`` a table reads back as ``|``)."""
    text = str(text).replace("\r", " ").replace("\n", " ")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _summary(report: Report) -> str:
    session = report.session
    parts = [
        f"{md_code(session.source)} ({md_escape(session.source_format)})",
        *([md_escape(job_text(report))] if report.job is not None else []),
        md_escape(devices_text(report)),
        f"window {format_ns(session.window.duration_ns)}",
        md_escape(steps_text(report)),
        f"GPU {md_escape(gpu_text(report))}",
    ]
    return " · ".join(parts)


def _finding(label: str, finding: Finding, indent: str, *, symptom: bool = False) -> list[str]:
    number = label.rsplit(".", 1)[-1]
    marker = f"{number}. "
    inner = indent + " " * len(marker)
    lines = [
        f"{indent}{marker}**{_md_prose(finding.title)}** ({finding.severity.value}, "
        f"{saving_verb(finding).lower()} {format_saving(finding.saving)}) {md_code(finding.rule)}"
        + (", *explained by the above*" if symptom else ""),
        "",
    ]
    if finding.message:
        lines += [f"{inner}{_md_prose(finding.message)}", ""]
    if finding.recommendation:
        lines += [f"{inner}**Recommendation:** {_md_prose(finding.recommendation)}", ""]
    if finding.saving.remains:
        lines += [f"{inner}*After the fix:* {_md_prose(finding.saving.remains)}", ""]
    checked = verification_line(finding)
    if checked:
        lines += [f"{inner}{_md_prose(checked)}", ""]
    if finding.evidence:
        lines.append(f"{inner}Evidence:")
        lines.append("")
        for ev in finding.evidence:
            text = "".join(md_code(t) if code else md_escape(t) for t, code in evidence_segments(ev))
            lines.append(f"{inner}- {text}")
        lines.append("")
    for i, explained in enumerate(finding.explains, 1):
        lines += _finding(f"{label}.{i}", explained, inner, symptom=True)
    return lines


def _table(table: Table, *, rows: int | None, columns: list[str]) -> list[str]:
    shown = table.rows if rows is None else table.rows[:rows]
    title = f"#### {md_escape(table.title)}"
    if rows is not None and len(table.rows) > rows:
        title += f" (top {rows} of {len(table.rows)})"
    header = ["key"] + [md_escape(c) for c in columns]
    lines = [title, ""]
    if table.description:
        lines += [_md_prose(table.description), ""]
    for note in table.notes:
        lines += [f"> {_md_prose(note)}", ""]
    lines.append("| " + " | ".join(header) + " |")
    numeric = numeric_columns(table, columns)
    lines.append("|" + "|".join([" --- "] + [" ---: " if numeric[c] else " --- " for c in columns]) + "|")
    for row in shown:
        cells = [md_escape(cell_text(row, "key", max_chars=MAX_CELL))]
        cells += [md_escape(cell_text(row, c, max_chars=MAX_CELL)) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured Markdown."""
    lines = ["## advisor report", "", _summary(report), ""]
    if report.session.window.headline:
        lines += [f"> **{_md_prose(report.session.window.headline)}**", ""]
    command = command_text(report)
    if command:
        lines += [f"Script: {md_code(command)}", ""]
    for note in report.notes:
        lines.append(f"> {_md_prose(note)}")
    if report.notes:
        lines.append("")

    lines += ["### Findings", ""]
    if not report.findings:
        lines += ["No findings: no rule found anything to improve in this profile.", ""]
    for i, finding in enumerate(report.findings, 1):
        lines += _finding(str(i), finding, "")
    combined = combined_text(report)
    if combined and len(report.combined.rules) > 1:
        lines += [f"**{md_escape(combined)}**", ""]

    tables = []
    if report.job is not None:
        # A job: the ranks and the collectives, then each rank's own top findings.
        for name, columns in (("ranks", RANK_COLUMNS + ["top_finding"]), ("collectives", COLLECTIVE_COLUMNS)):
            table = report.tables.get(name)
            if table is not None and table.rows:
                tables += _table(table, rows=None, columns=[c for c in columns
                                                          if any(r.get(c) is not None for r in table.rows)])
        for rank in report.job.ranks:
            tables += [f"**Rank {rank.rank}** ({md_code(rank.source) if rank.source else 'not kept'}): "
                       + ("; ".join(f"{md_escape(f.title)}, {format_saving(f.saving)}"
                                    for f in rank.findings) or "no findings"), ""]
    # Model, Perf and Device whole; Operator and Kernel cut to their top rows and main columns.
    sections = [] if report.job is not None else [("model", None), ("perf", None), ("device", None),
                                                  ("operator", TOP_ROWS), ("kernel", TOP_ROWS)]
    for canonical, rows in sections:
        found = find_table(report, canonical)
        if found is None or not found[1].rows:
            continue
        table = found[1]
        columns = [c.name for c in table.columns] if rows is None else compact_columns(table, MAX_COLUMNS)
        tables += _table(table, rows=rows, columns=columns)
    if tables:
        lines += ["### Tables", ""] + tables

    if report.metrics:
        lines += ["<details><summary>Metric definitions</summary>", ""]
        lines += [f"- **{md_escape(name)}**: {_md_prose(text)}" for name, text in report.metrics.items()]
        lines += ["", "</details>", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
