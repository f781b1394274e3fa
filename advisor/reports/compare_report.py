"""The report of `advisor compare`: a Comparison in the terminal, as Markdown or as JSON.

It only words what :func:`advisor.tables.comparison.compare` worked out: before, after, the change
and whether it is for the better; names from traces are escaped as in the other reports.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

from advisor.errors import UsageError
from advisor.reports._markdown import md_code, md_escape
from advisor.reports._render import write_text
from advisor.units import MISSING, format_ms, format_ns, format_number, format_ratio

if TYPE_CHECKING:  # the comparison is worked out upstream (advisor.tables.comparison); this words it
    from advisor.tables.comparison import Change, Comparison, FindingChange, RowChange

__all__ = ["COMPARE_FORMATS", "comparison_markdown", "comparison_text", "render_comparison"]

COMPARE_FORMATS = ("terminal", "json", "markdown")
# What the before, after, change and verdict columns take, with their padding.
VALUES_WIDTH = 58
VERDICT_STYLE = {"better": "bold green", "worse": "bold red", "same": "dim", "new": "yellow", "gone": "cyan"}
STATUS_STYLE = {"appeared": "bold red", "gone": "bold green", "changed": "yellow", "unchanged": "dim"}


def _value(change: Change, value: float | None) -> str:
    if value is None:
        return MISSING
    if change.unit == "ns":
        return format_ns(value)
    if change.unit == "ratio":
        return format_ratio(value)
    return f"{format_number(value)} {change.unit}"


def _delta(change: Change) -> str:
    """``-35.1 ms (-20%)``; a share changes by percentage points."""
    if change.delta is None:
        return MISSING
    sign = "+" if change.delta > 0 else "-" if change.delta < 0 else "\u00b1"
    size = abs(change.delta)
    if change.unit == "ratio":
        return f"{sign}{size * 100:.1f} pp"
    text = sign + (format_ns(size) if change.unit == "ns" else f"{format_number(size)} {change.unit}")
    if change.relative is not None:
        pct = change.relative * 100
        text += f" ({pct:+.0f}%)" if abs(pct) >= 1 or pct == 0 else f" ({pct:+.1f}%)"
    return text


def _saving(ms: float | None) -> str:
    return MISSING if ms is None else f"{format_ms(ms)}/step"


def _finding_line(f: FindingChange) -> str:
    """``HIGH 69.3 ms/step → none``."""
    before = f"{(f.severity_before or '').upper()} {_saving(f.saving_before_ms)}" if f.severity_before else "none"
    after = f"{(f.severity_after or '').upper()} {_saving(f.saving_after_ms)}" if f.severity_after else "none"
    return f"{before} \u2192 {after}"


def _side_details(side) -> str:
    """``kineto; Tesla V100; 6 steps, mean step 175 ms; 3 findings``."""
    steps = f"{side.steps} steps, mean step {format_ns(side.mean_step_ns)}" if side.steps else "no steps"
    devices = ", ".join(side.devices) or "no GPU"
    findings = "1 finding" if side.findings == 1 else f"{side.findings} findings"
    return f"{side.source_format}; {devices}; {steps}; {findings}"


def _moved_groups(comparison: Comparison) -> list[tuple[tuple[str, str, str], list[RowChange]]]:
    groups: dict[tuple[str, str, str], list[RowChange]] = {}
    for row in comparison.rows:
        groups.setdefault((row.table, row.column, row.name), []).append(row)
    return list(groups.items())


# -- terminal -------------------------------------------------------------------------------------


def _view(first: str, width: int) -> RichTable:
    """A table of before, after, change and verdict; the first column takes what is left and
    wraps there, so a narrow terminal never cuts a figure or a verdict short."""
    view = RichTable(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    view.add_column(first, overflow="fold", max_width=max(20, width - VALUES_WIDTH))
    view.add_column("before", justify="right", no_wrap=True, min_width=9)
    view.add_column("after", justify="right", no_wrap=True, min_width=9)
    view.add_column("change", justify="right", no_wrap=True, min_width=16)
    view.add_column("", no_wrap=True, min_width=6)
    return view


def _changes_table(title: str, changes: list[Change], width: int) -> RenderableType:
    view = _view("", width)
    for c in changes:
        view.add_row(Text(c.name), _value(c, c.before), _value(c, c.after), _delta(c),
                     Text(c.verdict, style=VERDICT_STYLE.get(c.verdict, "")))
    return Group(Text(title, style="bold"), view)


def _rows_table(title: str, rows: list[RowChange], width: int) -> RenderableType:
    view = _view("key", width)
    for r in rows:
        view.add_row(Text(r.key), _value(r, r.before), _value(r, r.after), _delta(r),
                     Text(r.verdict, style=VERDICT_STYLE.get(r.verdict, "")))
    return Group(Text(title, style="bold"), view)


def _findings_table(comparison: Comparison, width: int) -> RenderableType:
    if not comparison.findings:
        return Text("Findings: none in either profile.", style="bold")
    # Below this width the title gets a column too narrow to read (a character a line in
    # an 80-column terminal): it goes under the rule instead.
    wide = width >= 100
    view = RichTable(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    view.add_column("status", no_wrap=True)
    if wide:
        view.add_column("rule", no_wrap=True)
        view.add_column("title")
    else:
        view.add_column("rule and title", min_width=max(len(f.rule) for f in comparison.findings))
    view.add_column("severity and saving, before \u2192 after", no_wrap=True)
    for f in comparison.findings:
        named = [Text(f.rule), Text(f.title)] if wide else [Text.assemble(f.rule, "\n", (f.title, "dim"))]
        view.add_row(Text(f.status, style=STATUS_STYLE[f.status]), *named, Text(_finding_line(f)))
    return Group(Text("Findings", style="bold"), view)


def render_comparison_terminal(comparison: Comparison, console: Console) -> None:
    parts: list[RenderableType] = [
        Text("advisor compare", style="bold"),
        Text(f"  before: {comparison.before.source} ({_side_details(comparison.before)})"),
        Text(f"  after:  {comparison.after.source} ({_side_details(comparison.after)})"),
    ]
    for note in comparison.notes:
        parts.append(Text(f"  Note: {note}", style="yellow"))
    width = console.width
    if comparison.multiplied:
        parts += [Text(""), Text("What multiplied (look here first)", style="bold red")]
        parts += [Text(f"  - {m.message}") for m in comparison.multiplied]
    parts += [Text(""), _changes_table("Headline", comparison.headline, width)]
    if comparison.phases:
        parts += [Text(""), _changes_table("Model Summary phases, mean per step", comparison.phases, width)]
    parts += [Text(""), _findings_table(comparison, width)]
    for (table, column, what), rows in _moved_groups(comparison):
        title = f"Moved most: {table}.{column} ({what}), per {comparison.per}"
        parts += [Text(""), _rows_table(title, rows, width)]
    console.print(Group(*parts))


def comparison_text(comparison: Comparison, *, width: int = 100) -> str:
    """The terminal comparison as plain text at a fixed width."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False, force_jupyter=False,
                      force_interactive=False, legacy_windows=False, highlight=False, emoji=False, markup=False)
    render_comparison_terminal(comparison, console)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


# -- markdown -------------------------------------------------------------------------------------


def _md_changes(changes: list[Change], first: str = "") -> list[str]:
    lines = [f"| {first} | before | after | change | |", "| --- | ---: | ---: | ---: | --- |"]
    for c in changes:
        verdict = f"**{c.verdict}**" if c.verdict in ("better", "worse") else c.verdict
        lines.append(f"| {md_escape(c.name)} | {md_escape(_value(c, c.before))} | {md_escape(_value(c, c.after))} "
                     f"| {md_escape(_delta(c))} | {verdict} |")
    return lines + [""]


def comparison_markdown(comparison: Comparison) -> str:
    """The comparison as GitHub-flavoured Markdown (a pull-request comment)."""
    lines = ["## advisor compare", ""]
    for label, side in (("before", comparison.before), ("after", comparison.after)):
        lines.append(f"- **{label}**: {md_code(side.source)} ({md_escape(_side_details(side))})")
    lines.append("")
    for note in comparison.notes:
        lines += [f"> {md_escape(note)}", ""]
    if comparison.multiplied:
        lines += ["### What multiplied (look here first)", ""]
        lines += [f"- {md_escape(m.message)}" for m in comparison.multiplied] + [""]
    lines += ["### Headline", ""] + _md_changes(comparison.headline)
    if comparison.phases:
        lines += ["### Model Summary phases, mean per step", ""] + _md_changes(comparison.phases, "phase")
    lines += ["### Findings", ""]
    if not comparison.findings:
        lines += ["None in either profile.", ""]
    else:
        lines += ["| status | rule | title | severity and saving, before \u2192 after |", "| --- | --- | --- | --- |"]
        for f in comparison.findings:
            lines.append(f"| {f.status} | {md_code(f.rule)} | {md_escape(f.title)} | {md_escape(_finding_line(f))} |")
        lines.append("")
    for (table, column, what), rows in _moved_groups(comparison):
        lines += [f"### Moved most: {md_escape(table)}.{md_escape(column)} ({md_escape(what)}), per {comparison.per}",
                  "", "| key | before | after | change | |", "| --- | ---: | ---: | ---: | --- |"]
        for r in rows:
            key = r.key if len(r.key) <= 120 else r.key[:117] + "..."
            lines.append(f"| {md_escape(key)} | {md_escape(_value(r, r.before))} | {md_escape(_value(r, r.after))} "
                         f"| {md_escape(_delta(r))} | {r.verdict} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# -- entry point ----------------------------------------------------------------------------------


def render_comparison(comparison: Comparison, fmt: str, out: Path | str | None = None,
                      console: Console | None = None) -> None:
    """Render as ``fmt`` ("terminal", "json" or "markdown") to ``out`` or the console."""
    if fmt not in COMPARE_FORMATS:
        raise UsageError(f"unknown comparison format {fmt!r}; choose one of {', '.join(COMPARE_FORMATS)}")
    if fmt != "json":  # names from the traces reach a terminal or Markdown: no control characters
        from advisor.units import safe_strings

        dumped = comparison.model_dump()
        cleaned = safe_strings(dumped)
        comparison = comparison if cleaned == dumped else type(comparison).model_validate(cleaned)
    if fmt == "terminal" and out is None:
        render_comparison_terminal(comparison, console if console is not None else Console())
        return
    if fmt == "terminal":
        text = comparison_text(comparison)
    elif fmt == "json":
        text = comparison.model_dump_json(indent=2) + "\n"
    else:
        text = comparison_markdown(comparison)
    write_text(text, out, console, what="the comparison")
