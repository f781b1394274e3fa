"""The terminal report (rich): header, ranked findings, a compact look at the tables.

Pure: it reads a Report and prints to the Console it is given. Layout depends only on the
console's width, so the same report renders the same text at the same width (the golden
test renders at width 100 with no colour).
"""

from __future__ import annotations

import io
import re

from rich import box
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table as RichTable
from rich.text import Text

from advisor.findings import Finding, Severity
from advisor.reports._common import (
    findings_heading,
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
    other_notes,
    steps_text,
)
from advisor.reports.report import Report, Table
from advisor.units import format_ns, format_saving

__all__ = ["render_terminal", "terminal_text"]

SEVERITY_STYLE = {
    Severity.critical: "bold white on red",
    Severity.high: "bold red",
    Severity.medium: "bold yellow",
    Severity.low: "cyan",
    Severity.info: "dim",
}

TOP_ROWS = 5
INDENT = 4
# A text cell longer than this (shapes, kernel lists) is cut.
MAX_CELL = 30
KEY_MIN = 12


def _header(report: Report) -> RenderableType:
    session = report.session
    grid = RichTable.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("Source", Text(f"{session.source} ({session.source_format})"))
    if report.job is not None:
        grid.add_row("Job", Text(job_text(report)))
    command = command_text(report)
    if command:
        grid.add_row("Script", Text(command))
    grid.add_row("Devices", Text(devices_text(report)))
    grid.add_row("Window", Text(f"{format_ns(session.window.duration_ns)}; {steps_text(report)}"))
    gpu = gpu_text(report)
    grid.add_row("GPU", Text(gpu, style="" if session.collector.gpu_measured else "yellow"))
    for note in other_notes(report):
        grid.add_row("Note", Text(note, style="yellow"))
    title = Text("advisor report", style="bold")
    parts: list[RenderableType] = [title, Padding(grid, (0, 0, 0, 2), expand=False)]
    if session.window.headline:
        # Before every finding: what the profile cannot show changes how each one reads.
        parts += [Text(""), Text(session.window.headline, style="bold yellow")]
    return Group(*parts)


def _finding(label: str, finding: Finding, *, symptom: bool = False) -> RenderableType:
    head = Text()
    head.append(f"{label}. ", style="bold")
    head.append(finding.severity.value.upper(), style=SEVERITY_STYLE[finding.severity])
    head.append("  ")
    head.append(finding.title, style="bold")
    head.append(f"  [{finding.rule}]", style="dim")
    if symptom:
        head.append("  explained by the above", style="italic")

    body: list[RenderableType] = []
    saving = Text(f"{saving_verb(finding)} ")
    saving.append(format_saving(finding.saving), style="bold green")
    saving.append(f"; confidence {finding.confidence * 100:.0f}%", style="dim")
    body.append(saving)
    if finding.message:
        body.append(Text(finding.message))
    if finding.recommendation:
        rec = Text("Fix: ", style="bold")
        rec.append(finding.recommendation, style="")
        body.append(rec)
    if finding.saving.remains:
        body.append(Text(f"After the fix: {finding.saving.remains}", style="dim"))
    checked = verification_line(finding)
    if checked:
        body.append(Text(checked, style="bold" if finding.verification is not None else "dim"))
    if finding.evidence:
        body.append(Text("Evidence:", style="bold"))
        for ev in finding.evidence:
            line = Text("- ")
            for text, is_code in evidence_segments(ev):
                line.append(text, style="cyan" if is_code else "")
            body.append(Padding(line, (0, 0, 0, 2), expand=False))
    for i, symptom in enumerate(finding.explains, 1):
        body.append(_finding(f"{label}.{i}", symptom, symptom=True))
    return Group(head, Padding(Group(*body), (0, 0, 0, INDENT), expand=False))


def _findings(report: Report) -> list[RenderableType]:
    if not report.findings:
        return [Text("No findings: no rule found anything to improve in this profile.", style="bold green")]
    out: list[RenderableType] = [Text(findings_heading(report.findings), style="bold underline")]
    for i, finding in enumerate(report.findings, 1):
        out.append(_finding(str(i), finding))
        out.append(Text(""))
    combined = combined_text(report)
    if combined and len(report.combined.rules) > 1:
        out.append(Text(combined, style="bold"))
        out.append(Text(""))
    return out[:-1]


# A character of a name as the report shows it: an escaped control character (\x1b) is one.
_KEY_UNIT = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)|.", re.S)


def _cut_keys(keys: list[str], width: int) -> list[str]:
    """Each key cut to ``width`` (``_cut_key``), the cut moved toward the start where two
    different keys would read the same: three autograd nodes cut to 'autograd:…kward0'
    read as one row three times."""
    for head_share in (3 / 5, 1 / 4, 0.0):
        cut = [_cut_key(k, width, head_share) for k in keys]
        if len(set(cut)) == len(set(keys)):
            break
    return cut


def _cut_key(key: str, width: int, head_share: float = 3 / 5) -> str:
    """``key`` in at most ``width`` characters, cut in the middle: a name's end says as much
    as its start ('autograd::engine::evaluate_function: AddmmBackward0' cut at its end lost
    which backward it was). An escaped control character is kept whole or left out, never
    cut in two."""
    if len(key) <= width:
        return key
    head = max(int((width - 1) * head_share), 1)
    tail = max(width - 1 - head, 0)
    units = _KEY_UNIT.findall(key)
    front, used = [], 0
    for unit in units:
        if used + len(unit) > head:
            break
        front.append(unit)
        used += len(unit)
    back, used = [], 0
    for unit in reversed(units[len(front):]):
        if used + len(unit) > tail:
            break
        back.append(unit)
        used += len(unit)
    # What a whole unit left of either side's share goes to the start, where it fits.
    room = width - 1 - sum(map(len, front)) - sum(map(len, back))
    for unit in units[len(front):len(units) - len(back)]:
        if len(unit) > room:
            break
        front.append(unit)
        room -= len(unit)
    return "".join(front) + "…" + "".join(reversed(back))


def _table(table: Table, *, columns: list[str], rows: int | None, width: int) -> RichTable:
    view = RichTable(
        title=table.title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    shown = table.rows if rows is None else table.rows[:rows]
    cells = [[cell_text(row, c, max_chars=MAX_CELL) for c in columns] for row in shown]
    # Values keep their full width; a long key (a templated kernel name) is what gets cut.
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    key_width = max(KEY_MIN, width - sum(widths) - 3 * len(columns) - 2)
    view.add_column("key", overflow="ellipsis", no_wrap=True, max_width=key_width)
    numeric = numeric_columns(table, columns)
    for c, w in zip(columns, widths, strict=True):
        view.add_column(c, justify="right" if numeric[c] else "left", no_wrap=True, overflow="ellipsis", min_width=w)
    keys = _cut_keys([str(row["key"]) for row in shown], key_width)
    for key, values in zip(keys, cells, strict=True):
        # Text, not str: names from traces may hold "[...]", which rich would take as markup.
        view.add_row(Text(key), *(Text(v) for v in values))
    caption = list(table.notes)
    if rows is not None and len(table.rows) > rows:
        caption.insert(0, f"top {rows} of {len(table.rows)} rows")
    if caption:
        view.caption = Text("\n".join(caption))
        view.caption_justify = "left"
    return view


def _tables(report: Report, width: int) -> list[RenderableType]:
    out: list[RenderableType] = []
    if report.job is not None:
        for name, columns, rows in (("ranks", RANK_COLUMNS, None), ("collectives", COLLECTIVE_COLUMNS, TOP_ROWS)):
            table = report.tables.get(name)
            if table is None or not table.rows:
                continue
            shown = [c for c in columns if any(r.get(c) is not None for r in table.rows)]
            out.append(_table(table, columns=shown, rows=rows, width=width))
        return out
    for canonical, limit, rows in (("model", 5, None), ("operator", 5, TOP_ROWS), ("kernel", 5, TOP_ROWS)):
        found = find_table(report, canonical)
        if found is None:
            continue
        _, table = found
        if not table.rows:
            continue
        out.append(_table(table, columns=compact_columns(table, limit), rows=rows, width=width))
    return out


def render_terminal(report: Report, console: Console) -> None:
    """Print the report to ``console``."""
    parts: list[RenderableType] = [_header(report), Text(""), *_findings(report)]
    for table in _tables(report, console.width):
        parts += [Text(""), table]
    console.print(Group(*parts))


def terminal_text(report: Report, *, width: int = 100, color: bool = False) -> str:
    """The terminal report as text at a fixed width (no colour unless ``color``, and then
    no trailing blanks)."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        color_system="truecolor" if color else None,
        force_terminal=color,
        force_jupyter=False,
        force_interactive=False,
        legacy_windows=False,
        highlight=False,
        emoji=False,
        markup=False,
    )
    render_terminal(report, console)
    text = buffer.getvalue()
    if color:
        return text
    # rich pads indented blocks to the full width; a file needs no trailing blanks.
    return "".join(line.rstrip() + "\n" for line in text.splitlines())
