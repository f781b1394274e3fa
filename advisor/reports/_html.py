"""The HTML report: one self-contained file to browse, send by email and open offline.

Ranked findings first, each with its saving and its evidence as links to the highlighted
rows of the summary tables; then charts drawn as inline SVG (step time per step by phase,
time by operator and by kernel, GPU busy and idle over the window, the roofline); then
every summary table, sortable and searchable. Styles and a small script are inlined; a
Content-Security-Policy forbids every network request and lets only that script run.

Like every renderer it reads a Report and computes nothing: the charts draw rows of the
tables (step_phases, gpu_timeline and roofline_ceilings exist for them). Every name from a
trace is escaped, and the report's JSON, embedded for the script and for anyone who wants
the data back, escapes "<" so it cannot close its script element.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advisor.findings import Evidence, Finding
from advisor.reports._common import (
    findings_heading,
    saving_verb,
    verification_line,
    cell_text,
    combined_text,
    command_text,
    device_label,
    evidence_segments,
    find_table,
    gpu_text,
    job_text,
    numeric_columns,
    other_notes,
    steps_text,
)
from advisor.reports._html_assets import CSS, SCRIPT, script_hash
from advisor.reports._html_charts import (
    BIDI_IN_JSON,
    Bar,
    Ceiling,
    Columns,
    Marker,
    Point,
    Series,
    bar_chart,
    esc,
    roofline_chart,
    stacked_columns,
)
from advisor.reports.report import Report, Table
from advisor.units import (
    format_count,
    format_ns,
    format_number,
    format_ratio,
    format_saving,
    is_number,
)

__all__ = ["render_html"]

Progress = Callable[[int, int], None]

# A table longer than this shows its first rows (and every row a finding cites); the
# embedded JSON keeps them all.
MAX_ROWS = 1000
TOP_BARS = 20
MAX_POINTS = 400
# Tables shown open; the others start folded (a click on evidence opens its table).
OPEN_TABLES = ("model", "perf", "device", "operator", "kernel", "memory", "gpu_idle", "host_sync", "ranks",
               "collectives")

PHASES = (
    ("Dataloader", "dataloader_ns", "s-dataloader", "--c-dataloader"),
    ("Forward", "forward_ns", "s-forward", "--c-forward"),
    ("Backward", "backward_ns", "s-backward", "--c-backward"),
    ("Optimization", "optimization_ns", "s-optimization", "--c-optimization"),
    ("Others", "others_ns", "s-others", "--c-others"),
)
GPU_STATES = (
    ("GPU busy", "busy_ns", "s-busy", "--c-busy"),
    ("idle: work queued", "idle_work_queued_ns", "s-idle-queued", "--c-idle-queued"),
    ("idle: blocking sync", "idle_blocking_sync_ns", "s-idle-sync", "--c-idle-sync"),
    ("idle: data loading", "idle_data_loading_ns", "s-idle-dl", "--c-idle-dl"),
    ("idle: communication", "idle_communication_ns", "s-idle-comm", "--c-idle-comm"),
    ("idle: launch calls", "idle_launch_calls_ns", "s-idle-launch", "--c-idle-launch"),
    ("idle: host in model", "idle_host_in_model_ns", "s-idle-model", "--c-idle-model"),
    ("idle: host outside model", "idle_host_outside_model_ns", "s-idle-host", "--c-idle-host"),
    ("idle: unrecorded", "idle_unrecorded_ns", "s-idle-other", "--c-idle-other"),
)


def json_for_script(value: Any) -> str:
    """JSON safe inside a <script type="application/json"> element: "<", ">" and "&" as
    unicode escapes, so no text in it can end the element or open a comment."""
    text = (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).translate(BIDI_IN_JSON)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# -- row anchors ---------------------------------------------------------------------------------


@dataclass
class Anchors:
    """Element ids for tables and rows: derived from positions, never from names, so any
    key (quotes, spaces, markup) gets a plain id that a URL fragment can carry."""

    table_ids: dict[str, str]
    rows: dict[str, dict[str, int]]
    linked: bool = True  # False: the tables are not on the page (a notebook cell), so nothing links to them

    @classmethod
    def of(cls, report: Report) -> Anchors:
        table_ids, rows = {}, {}
        used: set[str] = set()
        for i, (name, table) in enumerate(report.tables.items()):
            slug = re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-") or f"table{i}"
            tid = f"tbl-{slug}"
            if tid in used:
                tid = f"{tid}-{i}"
            used.add(tid)
            table_ids[name] = tid
            index: dict[str, int] = {}
            for j, row in enumerate(table.rows):
                index.setdefault(row["key"], j)
            rows[name] = index
        return cls(table_ids, rows)

    def row_id(self, table: str | None, key: str | None) -> str | None:
        """The id of a table's row, or None where there is no such row (or no table on the page)."""
        if not self.linked or table is None or key is None or table not in self.rows:
            return None
        position = self.rows[table].get(key)
        return None if position is None else f"{self.table_ids[table]}-r{position}"


# -- header ----------------------------------------------------------------------------------------


def _figure(name: str, value: str, sub: str = "", href: str | None = None, col: str | None = None) -> str:
    body = f'<div class="name">{esc(name)}</div><div class="value">{esc(value)}</div>'
    if sub:
        body += f'<div class="sub">{esc(sub)}</div>'
    if href:
        attr = f' data-col="{esc(col)}"' if col else ""
        body = f'<a href="#{esc(href)}"{attr}>{body}</a>'
    return f'<div class="figure">{body}</div>'


def _key_figures(report: Report, anchors: Anchors) -> str:
    """The handful of figures a reader looks for first, each linking to its table row."""
    cards = []
    steps = report.session.steps
    model = find_table(report, "model")
    if steps.mean_step_ns is not None:
        href = anchors.row_id(model[0], "ProfileStep") if model else None
        cards.append(_figure("Mean step", format_ns(steps.mean_step_ns), steps_text(report).split(",")[0], href,
                             "cpu_avg_ns"))
    perf = find_table(report, "perf")
    if perf:
        row = perf[1].row("ips")
        if row and is_number(row.get("avg")):
            unit = row.get("unit") or ""
            cards.append(_figure("Throughput", f"{format_number(row['avg'])} {unit}".strip(), "mean over steps",
                                 anchors.row_id(perf[0], "ips"), "avg"))
    device = find_table(report, "device")
    if device:
        for row in device[1].rows:
            if row.get("kind") == "gpu":
                value = format_ratio(row.get("utilization")) if is_number(row.get("utilization")) else "not measured"
                cards.append(_figure(f"GPU busy ({row['key']})", value, str(row.get("name") or ""),
                                     anchors.row_id(device[0], row["key"]), "utilization"))
    # The loader's share as the findings give it: of the job's own step (the steps timed
    # without the profiler) where the step timing has it, else of the recorded steps.
    timing = find_table(report, "step_timing")
    timed = timing[1].row("Dataloader") if timing else None
    if timed and is_number(timed.get("best_ratio")):
        cards.append(_figure("Data loader", format_ratio(timed["best_ratio"]), f"of step time ({timed.get('source')})",
                             anchors.row_id(timing[0], "Dataloader"), "best_ratio"))
    elif model:
        row = model[1].row("Dataloader")
        if row and is_number(row.get("cpu_ratio")):
            cards.append(_figure("Data loader", format_ratio(row["cpu_ratio"]), "of step time",
                                 anchors.row_id(model[0], "Dataloader"), "cpu_ratio"))
    n = len(report.findings)
    if n:
        top = report.findings[0]
        cards.append(_figure("Findings", str(n), f"top saves {format_saving(top.saving)}", None))
    else:
        cards.append(_figure("Findings", "0", "nothing to improve found"))
    return '<div class="figures">' + "".join(cards) + "</div>"


def _header(report: Report, anchors: Anchors) -> str:
    session = report.session
    rows = [("Source", f"{session.source} ({session.source_format})")]
    if report.job is not None:
        rows.append(("Job", job_text(report)))
    command = command_text(report)
    if command:
        rows.append(("Script", command))
    devices = "; ".join(device_label(d) for d in session.devices) or "none recorded"
    rows += [
        ("Devices", devices),
        ("Window", f"{format_ns(session.window.duration_ns)}; {steps_text(report)}"),
        ("GPU", gpu_text(report)),
        ("Generated", f"{report.generated} by advisor {report.advisor_version}"),
    ]
    warn = ' class="warn"'
    meta = "".join(f"<dt>{esc(k)}</dt><dd{warn if k == 'GPU' and not session.collector.gpu_measured else ''}>"
                   f"{esc(v)}</dd>" for k, v in rows)
    notes = list(other_notes(report))
    notes_html = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return (
        '<header id="top"><h1>advisor report</h1>'
        f'<div class="subtitle mono">{esc(session.source)}</div>'
        f'<dl class="meta">{meta}</dl>'
        + (f'<p class="headline">{esc(session.window.headline)}</p>' if session.window.headline else "")
        + (f'<ul class="notes">{notes_html}</ul>' if notes_html else "")
        + _key_figures(report, anchors)
        + "</header>"
    )


# -- findings ----------------------------------------------------------------------------------------


def _evidence(ev: Evidence, anchors: Anchors) -> str:
    segments = evidence_segments(ev)
    parts = []
    href = anchors.row_id(ev.table, ev.row) if ev.kind == "table_row" else None
    for i, (text, is_code) in enumerate(segments):
        piece = f"<code>{esc(text)}</code>" if is_code else esc(text)
        if i == 0 and href:
            col = f' data-col="{esc(ev.column)}"' if ev.column else ""
            piece = f'<a class="ev" href="#{esc(href)}"{col}>{piece}</a>'
        parts.append(piece)
    if ev.kind == "event":
        parts.append(' <span class="basis">(an event of the trace: <code>advisor timeline</code> marks it)</span>')
    return "<li>" + "".join(parts) + "</li>"


def _finding(label: str, finding: Finding, anchors: Anchors, *, symptom: bool = False) -> str:
    sev = finding.severity.value
    share = max(0.0, min(finding.saving.share_of_step, 1.0))
    head = (
        f'<div class="head"><span class="rank">{esc(label)}</span><span class="sev {esc(sev)}">{esc(sev.upper())}</span>'
        f"<h3>{esc(finding.title)}</h3><code class=\"rule\">{esc(finding.rule)}</code>"
        + ('<span class="explained-tag">explained by the above</span>' if symptom else "")
        + "</div>"
    )
    saving = (
        f'<div class="saving"><span class="meter" title="share of the step"><span style="width:{share * 100:.1f}%">'
        f"</span></span><span>{esc(saving_verb(finding))} <b>{esc(format_saving(finding.saving))}</b></span>"
        f'<span class="conf">confidence {finding.confidence * 100:.0f}%</span></div>'
    )
    body = [head, saving]
    if finding.message:
        body.append(f"<p>{esc(finding.message)}</p>")
    if finding.recommendation:
        body.append(f'<p class="fix"><b>Fix:</b> {esc(finding.recommendation)}</p>')
    if finding.saving.basis:
        body.append(f'<p class="basis">How the saving is estimated: {esc(finding.saving.basis)}</p>')
    if finding.saving.remains:
        body.append(f'<p class="basis">After the fix: {esc(finding.saving.remains)}</p>')
    checked = verification_line(finding)
    if checked:
        body.append(f'<p class="basis">{esc(checked)}</p>')
    if finding.evidence:
        items = "".join(_evidence(ev, anchors) for ev in finding.evidence)
        body.append(f'<div><b>Evidence</b><ul class="evidence">{items}</ul></div>')
    if finding.explains:
        inner = "".join(
            _finding(f"{label}.{i}", s, anchors, symptom=True) for i, s in enumerate(finding.explains, 1)
        )
        body.append(f'<div class="explains">{inner}</div>')
    anchor = "finding-" + label.replace(".", "-")
    return f'<article class="finding sev-{esc(sev)}" id="{anchor}">' + "".join(body) + "</article>"


def _findings(report: Report, anchors: Anchors) -> str:
    out = [f'<section id="findings"><h2>{esc(findings_heading(report.findings))}</h2>']
    if not report.findings:
        out.append('<p class="card">No findings: no rule found anything to improve in this profile.</p>')
    for i, finding in enumerate(report.findings, 1):
        out.append(_finding(str(i), finding, anchors))
    combined = combined_text(report)
    if combined and len(report.combined.rules) > 1:
        out.append(f'<p class="card combined">{esc(combined)}</p>')
    out.append("</section>")
    return "".join(out)


# -- charts ------------------------------------------------------------------------------------------


def _legend(items: list[tuple[str, str]], extra: str = "") -> str:
    spans = "".join(f'<span style="--sw: var({var})">{esc(name)}</span>' for name, var in items)
    return f'<div class="legend">{spans}{extra}</div>'


def _chart_card(title: str, description: str, body: str, source: str, *, wide: bool = False,
                chart_id: str = "") -> str:
    cls = "card wide" if wide else "card"
    ident = f' id="{esc(chart_id)}"' if chart_id else ""
    return (
        f'<figure class="{cls}"{ident}><h3>{esc(title)}</h3><p>{esc(description)}</p>{body}'
        f'<div class="source">{source}</div></figure>'
    )


def _table_link(report: Report, anchors: Anchors, name: str) -> str:
    table = report.tables.get(name)
    if table is None:
        return ""
    if not anchors.linked:
        return esc(table.title)
    return f'<a href="#{esc(anchors.table_ids[name])}">{esc(table.title)}</a>'


def _why_empty(report: Report, name: str, fallback: str) -> str:
    table = report.tables.get(name)
    reason = table.notes[0] if table is not None and table.notes else fallback
    return f'<p class="empty">{esc(reason)}</p>'


def _num(value: Any) -> float | None:
    return float(value) if is_number(value) and math.isfinite(float(value)) else None


def _step_chart(report: Report, anchors: Anchors) -> str:
    name = "step_phases"
    table = report.tables.get(name)
    title = "Step time by phase"
    description = "Each step's wall time split into the host's phases (stacked)."
    if table is None or not table.rows:
        return _chart_card(title, description, _why_empty(report, name, "No steps in this profile."),
                           _table_link(report, anchors, name), wide=True, chart_id="chart-steps")
    rows = table.rows
    overlay = [_num(r.get("gpu_busy_ns")) for r in rows]
    has_gpu = any(v is not None for v in overlay)
    if has_gpu:
        description += " The black tick is the GPU busy time of the work launched in the step."
    data = _phase_columns(rows, name, anchors, labels=[str(r.get("step")) for r in rows],
                          heads=[f"Step {r.get('step')}: {format_ns(r.get('duration_ns'))}" for r in rows],
                          overlay=overlay if has_gpu else None, overlay_label="GPU busy")
    legend = _legend([(p, var) for p, _, _, var in PHASES],
                     '<span class="line" style="--sw: var(--text)">GPU busy</span>' if has_gpu else "")
    svg = stacked_columns(data, label=f"{title}, {len(rows)} steps", height=280)
    return _chart_card(title, description, legend + svg,
                       f"From the {_table_link(report, anchors, name)} table; x: step number.",
                       wide=True, chart_id="chart-steps")


def _phase_columns(rows: list[dict[str, Any]], name: str, anchors: Anchors, *, labels: list[str],
                   heads: list[str], overlay: list[float | None] | None, overlay_label: str) -> Columns:
    """Stacked columns of the host phases (a step's, or a rank's mean step), one per row of
    table ``name``, each linked to its row, with an optional tick per column."""
    tooltips = []
    for head, r, tick in zip(heads, rows, overlay or [None] * len(rows), strict=True):
        text = head + "\n" + "\n".join(f"{p} {format_ns(r.get(c))}" for p, c, _, _ in PHASES)
        if overlay is not None:
            text += f"\n{overlay_label} {format_ns(tick)}"
        tooltips.append(text)
    return Columns(
        labels=labels,
        tooltips=tooltips,
        hrefs=[anchors.row_id(name, r["key"]) for r in rows],
        series=[Series(p, cls, [_num(r.get(c)) or 0.0 for r in rows]) for p, c, cls, _ in PHASES],
        overlay=overlay,
        label_every=max(1, math.ceil(len(rows) / 30)),
    )


def _ranks_chart(report: Report, anchors: Anchors) -> str:
    """A job's ranks side by side: each rank's mean step split into its host phases, with
    the time it waited in collectives for the last rank marked."""
    name = "ranks"
    table = report.tables.get(name)
    title = "Step time by rank"
    description = ("Each rank's mean step split into the host's phases (stacked); the black tick is the time "
                   "per step the rank waited in collectives for the last rank to arrive.")
    if table is None or not table.rows:
        return _chart_card(title, description, "<p>No ranks.</p>", "", wide=True, chart_id="chart-ranks")
    rows = table.rows
    overlay = [_num(r.get("wait_ns")) for r in rows]
    data = _phase_columns(rows, name, anchors, labels=[str(r.get("rank")) for r in rows],
                          heads=[f"{r['key']}: {format_ns(r.get('step_mean_ns'))} a step" for r in rows],
                          overlay=overlay if any(v is not None for v in overlay) else None,
                          overlay_label="waiting in collectives")
    legend = _legend([(p, var) for p, _, _, var in PHASES],
                     '<span class="line" style="--sw: var(--text)">waiting in collectives</span>')
    svg = stacked_columns(data, label=f"{title}, {len(rows)} ranks", height=260)
    return _chart_card(title, description, legend + svg,
                       f"From the {_table_link(report, anchors, name)} table; x: rank.", wide=True,
                       chart_id="chart-ranks")


def _job(report: Report, anchors: Anchors) -> str:
    """The job first: the ranks chart, then each rank's own top findings."""
    job = report.job
    if job is None:
        return ""
    items = []
    for rank in job.ranks:
        found = "".join(f"<li>{esc(f.title)} <code class=\"rule\">{esc(f.rule)}</code>: saves "
                        f"{esc(format_saving(f.saving))}</li>" for f in rank.findings) or "<li>no findings</li>"
        ended = f"; exit code {rank.exit_code} ({rank.ending})" if rank.exit_code not in (None, 0) else ""
        source = f' <span class="mono">{esc(rank.source)}</span>' if rank.source else ""
        items.append(f'<div class="card"><h3>Rank {rank.rank}{source}</h3>'
                     f'<p class="desc">{rank.steps} steps, mean step {esc(format_ns(rank.mean_step_ns))}; '
                     f"numbered by {esc(rank.rank_from)}{esc(ended)}</p><ul>{found}</ul></div>")
    return ('<section id="job"><h2>The job</h2><div class="charts">' + _ranks_chart(report, anchors) + "</div>"
            + '<div class="charts">' + "".join(items) + "</div></section>")


def _gpu_chart(report: Report, anchors: Anchors) -> str:
    name = "gpu_timeline"
    table = report.tables.get(name)
    title = "GPU busy and idle over the window"
    description = ("The window in equal slices: when the GPU ran work, and while it idled, what the host "
                   "was doing. Dashed lines mark step starts.")
    if table is None or not table.rows:
        return _chart_card(title, description, _why_empty(report, name, "The GPU was not measured."),
                           _table_link(report, anchors, name), wide=True, chart_id="chart-gpu")
    rows = table.rows
    window = report.session.window.duration_ns or 1
    markers = []
    steps = report.tables.get("step_phases")
    if steps is not None:
        for r in steps.rows:
            offset = _num(r.get("offset_ns"))
            if offset is not None:
                markers.append(Marker(offset / window * len(rows), f"step {r.get('step')}"))
        if len(markers) > 40:
            markers = []
    tooltips = []
    for r in rows:
        span = f"{format_ns(r.get('offset_ns'))} + {format_ns(r.get('duration_ns'))}"
        step = r.get("step")
        head = f"{span}" + (f" (step {step})" if is_number(step) and step >= 0 else "")
        lines = [f"{label} {format_ns(r.get(c))}" for label, c, _, _ in GPU_STATES if (_num(r.get(c)) or 0) > 0]
        tooltips.append(head + f"\nGPU busy {format_ratio(r.get('utilization'))}\n" + "\n".join(lines))
    every = max(1, math.ceil(len(rows) / 10))
    data = Columns(
        labels=[format_ns(r.get("offset_ns")) if r.get("offset_ns") else "0" for r in rows],
        tooltips=tooltips,
        hrefs=[anchors.row_id(name, r["key"]) for r in rows],
        series=[Series(label, cls, [_num(r.get(c)) or 0.0 for r in rows]) for label, c, cls, _ in GPU_STATES],
        markers=markers,
        label_every=every,
    )
    legend = _legend([(label, var) for label, _, _, var in GPU_STATES])
    # Slices are equal, so each column shows its states as shares of the slice.
    svg = stacked_columns(data, label=title, height=260, full_scale=_num(rows[0].get("duration_ns")))
    return _chart_card(title, description, legend + svg,
                       f"From the {_table_link(report, anchors, name)} table; x: time from the window start. "
                       f"Totals by host state: {_table_link(report, anchors, 'gpu_idle')}.",
                       wide=True, chart_id="chart-gpu")


def _top(rows: list[dict[str, Any]], columns: list[str], limit: int) -> list[dict[str, Any]]:
    """The ``limit`` rows with the most of ``columns[0]``, ties (an op that launched no GPU
    work) broken by the next column; rows with none of any left out."""
    ranked = [r for r in rows if any((_num(r.get(c)) or 0) > 0 for c in columns)]
    ranked.sort(key=lambda r: tuple(-(_num(r.get(c)) or 0) for c in columns))
    return ranked[:limit]


def _operator_chart(report: Report, anchors: Anchors) -> str:
    title = "Time by operator"
    found = find_table(report, "operator")
    if found is None or not found[1].rows:
        return _chart_card(title, "", _why_empty(report, found[0] if found else "operator", "No operators recorded."),
                           "", chart_id="chart-operators")
    name, table = found
    rows = [r for r in table.rows if r.get("level", "top") == "top"]
    gpu = report.session.collector.gpu_measured and any(_num(r.get("gpu_total_ns")) for r in rows)
    top = _top(rows, ["gpu_total_ns", "cpu_total_ns"] if gpu else ["cpu_total_ns"], TOP_BARS)
    bars = []
    for r in top:
        g, c = _num(r.get("gpu_total_ns")), _num(r.get("cpu_total_ns"))
        text = f"{format_ns(g)} GPU \u00b7 {format_ns(c)} CPU" if gpu else format_ns(c)
        tip = f"{r['key']}\n{r.get('calls')} calls; CPU {format_ns(c)}" + (f"; GPU {format_ns(g)}" if gpu else "")
        bars.append(Bar(str(r["key"]), [g, c] if gpu else [c], text, tip, anchors.row_id(name, r["key"]),
                        cut_middle=True))
    series = [("GPU", "s-gpu"), ("CPU", "s-cpu")] if gpu else [("CPU", "s-cpu")]
    legend = _legend([("GPU time of the work launched", "--c-gpu"), ("CPU time", "--c-cpu")] if gpu
                     else [("CPU time", "--c-cpu")])
    description = (f"Top-level operators by {'GPU time, then CPU time' if gpu else 'CPU time'}, the top "
                   f"{len(top)} of {len(rows)}.")
    svg = bar_chart(bars, series, label=title)
    return _chart_card(title, description, legend + svg,
                       f"From the {_table_link(report, anchors, name)} table.", chart_id="chart-operators")


def _kernel_chart(report: Report, anchors: Anchors) -> str:
    title = "Time by kernel"
    found = find_table(report, "kernel")
    if found is None or not found[1].rows:
        return _chart_card(title, "", _why_empty(report, found[0] if found else "kernel",
                                                 "No kernels recorded: the GPU was not measured."),
                           "", chart_id="chart-kernels")
    name, table = found
    top = _top(table.rows, ["gpu_total_ns"], TOP_BARS)
    bars = []
    for r in top:
        total = _num(r.get("gpu_total_ns"))
        share = format_ratio(r.get("ratio")) if is_number(r.get("ratio")) else ""
        text = f"{format_ns(total)}" + (f" \u00b7 {share}" if share else "")
        tip = f"{r['key']}\n{r.get('calls')} launches; {format_ns(total)} in all, {format_ns(r.get('gpu_avg_ns'))} each"
        bars.append(Bar(str(r["key"]), [total], text, tip, anchors.row_id(name, r["key"])))
    description = f"Kernels by GPU time, the top {len(top)} of {len(table.rows)}; the share is of all kernel time."
    svg = bar_chart(bars, [("GPU", "s-kernel")], label=title)
    return _chart_card(title, description, svg, f"From the {_table_link(report, anchors, name)} table.",
                       chart_id="chart-kernels")


def _roofline_points(report: Report, anchors: Anchors) -> list[Point]:
    points: list[Point] = []
    roofline = report.tables.get("roofline")
    if roofline is not None:
        for r in roofline.rows:
            flops, nbytes, achieved = _num(r.get("flops")), _num(r.get("bytes")), _num(r.get("achieved_flops_per_s"))
            measured = _num(r.get("measured_ns"))
            if not (flops and nbytes and achieved and measured):
                continue
            tip = (f"{r['key']}\n{r.get('kind')} {r.get('dtype')}, {r.get('calls')} calls\n"
                   f"{flops / nbytes:.3g} FLOP/byte; achieved {format_count(achieved)}FLOP/s\n"
                   f"measured {format_ns(measured)}, ideal {format_ns(r.get('ideal_ns'))}, "
                   f"efficiency {format_ratio(r.get('efficiency'))} ({r.get('bound') or '?'} bound, {r.get('unit')})")
            points.append(Point(flops / nbytes, achieved, measured, "pt-op", tip, anchors.row_id("roofline", r["key"])))
    found = find_table(report, "kernel")
    if found is not None:
        name, table = found
        for r in table.rows:
            flops, nbytes, achieved = _num(r.get("flops")), _num(r.get("bytes")), _num(r.get("achieved_flops_per_s"))
            if not (flops and nbytes and achieved):
                continue
            total = _num(r.get("gpu_total_ns")) or 0.0
            tip = (f"{r['key']}\nkernel, {r.get('calls')} launches\n{flops / nbytes:.3g} FLOP/byte; achieved "
                   f"{format_count(achieved)}FLOP/s; efficiency {format_ratio(r.get('efficiency'))}")
            points.append(Point(flops / nbytes, achieved, total, "pt-kernel", tip, anchors.row_id(name, r["key"])))
    points.sort(key=lambda p: -p.weight_ns)
    return points[:MAX_POINTS]


def _roofline_chart(report: Report, anchors: Anchors) -> str:
    title = "Roofline"
    description = ("Ops (by name and shapes) and kernels whose FLOPs and bytes are known: achieved FLOP/s "
                   "against FLOPs per byte, sized by time. The lines are the target's ceilings; the "
                   "further below them, the more time above the ideal.")
    points = _roofline_points(report, anchors)
    ceilings_table = report.tables.get("roofline_ceilings")
    ceilings, bandwidth = [], None
    target = ""
    if ceilings_table is not None:
        for r in ceilings_table.rows:
            bandwidth = bandwidth or _num(r.get("peak_bytes_per_s"))
            target = target or str(r.get("target") or "")
            peak = _num(r.get("peak_flops_per_s"))
            if peak:
                ceilings.append(Ceiling(f"{r.get('unit')} {r.get('dtype')}", peak))
    source = (f"From the {_table_link(report, anchors, 'roofline')}"
              + (f", {_table_link(report, anchors, 'kernel')}" if any(p.kind == "pt-kernel" for p in points) else "")
              + f" and {_table_link(report, anchors, 'roofline_ceilings')} tables"
              + (f"; ceilings of {esc(target)}." if target else "."))
    if not points:
        why = "No op or kernel has both a known cost (FLOPs and bytes) and a measured time."
        if report.tables.get("roofline") is not None and report.tables["roofline"].notes:
            why += " " + report.tables["roofline"].notes[0]
        return _chart_card(title, description, f'<p class="empty">{esc(why)}</p>', source, wide=True,
                           chart_id="chart-roofline")
    highest = max((c.peak_flops for c in ceilings), default=None)
    if highest and any(p.achieved > highest for p in points):
        description += (" A point above its ceiling did fewer FLOPs than the cost model counts for its shapes "
                        "(a Winograd or FFT convolution, say).")
    legend = _legend([("op (name and shapes)", "--c-op")]
                     + ([("kernel", "--c-kernel")] if any(p.kind == "pt-kernel" for p in points) else []),
                     '<span class="line" style="--sw: var(--text)">ceilings</span>')
    svg = roofline_chart(points, ceilings, bandwidth, label=title)
    return _chart_card(title, description, legend + svg, source, wide=True, chart_id="chart-roofline")


COUNTER_COLUMNS = (("SM %", "sm_pct"), ("memory %", "memory_pct"), ("DRAM %", "dram_pct"),
                   ("occupancy %", "achieved_occupancy"), ("waves", "waves"), ("registers", "registers"),
                   ("tensor %", "tensor_pct"), ("FMA %", "fma_pct"))


def _counters_chart(report: Report, anchors: Anchors) -> str:
    """The kernels Nsight Compute profiled, with their counters, beside the roofline chart:
    nothing where the session carries no ncu export."""
    name = "kernel_counters"
    table = report.tables.get(name)
    if table is None or not table.rows:
        return ""
    head = "".join(f'<th scope="col" class="num">{esc(label)}</th>' for label, _ in COUNTER_COLUMNS)
    body = []
    for r in table.rows[:MAX_POINTS]:
        cells = []
        for _, column in COUNTER_COLUMNS:
            value = _num(r.get(column))
            cells.append(f'<td class="num">{"" if value is None else f"{value:.3g}"}</td>')
        limiter = str(r.get("limiter") or "")
        rule = str(r.get("top_rule") or "")
        speedup = _num(r.get("top_speedup_pct"))
        verdict = f"{rule} ({speedup:.0f} %)" if rule and speedup is not None else rule
        kernel = str(r.get("kernel") or r["key"])
        label = str(r["key"]) + ("" if r.get("matched") else " (not in the session)")
        row_id = anchors.row_id(name, r["key"])
        link = f'<a href="#{esc(row_id)}">{esc(label)}</a>' if row_id else esc(label)
        body.append(
            f'<tr><td class="key" title="{esc(kernel)}">{link}</td><td>{esc(str(r.get("op") or ""))}</td>{"".join(cells)}'
            f'<td>{esc(limiter)}</td><td>{esc(verdict)}</td></tr>')
    description = ("Each kernel Nsight Compute profiled: throughput as % of the GPU's peak, achieved "
                   "occupancy and what limits it, waves per SM, registers a thread, the tensor and FMA "
                   "pipes' utilisation, and ncu's rule with the largest estimated speedup.")
    grid = ('<div class="scroll"><table class="data"><thead><tr><th scope="col">kernel</th>'
            f'<th scope="col">op</th>{head}<th scope="col">occupancy limit</th>'
            '<th scope="col">ncu\'s top rule</th></tr></thead><tbody>' + "".join(body) + "</tbody></table></div>")
    sources = sorted({str(r.get("source") or "") for r in table.rows} - {""})
    source = (f"From the {_table_link(report, anchors, name)} table"
              + (f"; ncu export {esc(', '.join(sources))}." if sources else "."))
    return _chart_card("Kernel counters (Nsight Compute)", description, grid, source, wide=True,
                       chart_id="chart-kernel-counters")


CHARTS = (_step_chart, _gpu_chart, _operator_chart, _kernel_chart, _roofline_chart, _counters_chart)


# -- tables -----------------------------------------------------------------------------------------


def _sort_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if is_number(value) and math.isfinite(float(value)):
        return repr(value)
    return ""


def _cell_title(value: Any, shown: str) -> str:
    """The full value where the cell shows less: a rounded number's exact value, a long
    text's whole."""
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        text = json.dumps(value, separators=(",", ":"), default=str)
    else:
        text = str(value)
    return "" if text == shown else text


def _table(name: str, table: Table, anchors: Anchors, cited: set[str], open_: bool) -> str:
    tid = anchors.table_ids[name]
    columns = [c.name for c in table.columns]
    numeric = numeric_columns(table, columns)
    keep = set(range(min(len(table.rows), MAX_ROWS)))
    keep |= {anchors.rows[name][k] for k in cited if k in anchors.rows[name]}
    head = ['<th scope="col"><button type="button" title="the row key: ' + esc(table.key or "key") + '">key</button></th>']
    for c in table.columns:
        cls = ' class="num"' if numeric[c.name] else ""
        head.append(f'<th scope="col"{cls} data-col="{esc(c.name)}"><button type="button" '
                    f'title="{esc(c.description)}">{esc(c.name)}</button></th>')
    body = []
    for i in sorted(keep):
        row = table.rows[i]
        cells = [f'<td class="key" title="{esc(row["key"])}">{esc(row["key"])}</td>']
        for c in columns:
            value = row.get(c)
            shown = cell_text(row, c)
            attrs = []
            if numeric[c]:
                attrs.append('class="num"')
                attrs.append(f'data-v="{esc(_sort_value(value))}"')
            title = _cell_title(value, shown)
            if title:
                attrs.append(f'title="{esc(title)}"')
            cells.append(f"<td{''.join(' ' + a for a in attrs)}>{esc(shown)}</td>")
        body.append(f'<tr id="{tid}-r{i}" data-i="{i}">' + "".join(cells) + "</tr>")
    count = _rows_text(len(table.rows))
    parts = [
        f'<details class="table" id="{tid}"{" open" if open_ else ""}>',
        (f'<summary><h3>{esc(table.title)}</h3><code class="count">{esc(name)}</code>'
         f'<span class="count">{esc(count)}</span></summary><div class="body">'),
    ]
    if table.description:
        parts.append(f'<p class="desc">{esc(table.description)}</p>')
    for note in table.notes:
        parts.append(f'<p class="desc"><b>Note:</b> {esc(note)}</p>')
    if not table.rows:
        parts.append('<p class="empty">No rows.</p></div></details>')
        return "".join(parts)
    if len(keep) < len(table.rows):
        parts.append(f'<p class="desc">Showing {len(keep)} of {len(table.rows)} rows; the embedded JSON '
                     "(Download JSON, above) holds them all.</p>")
    parts.append(
        f'<div class="tools"><input class="search" type="search" data-table="{tid}-data" '
        f'placeholder="Search {esc(table.title)}" aria-label="Search {esc(table.title)}">'
        f'<span class="shown" id="{tid}-data-shown">{_rows_text(len(keep))}</span></div>'
    )
    parts.append(
        f'<div class="scroll"><table class="data" id="{tid}-data"><thead><tr>{"".join(head)}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table></div></div></details>'
    )
    return "".join(parts)


def _rows_text(n: int) -> str:
    return "1 row" if n == 1 else f"{n} rows"


def _cited_rows(findings: list[Finding]) -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}

    def walk(items: list[Finding]) -> None:
        for f in items:
            for ev in f.evidence:
                if ev.kind == "table_row" and ev.table and ev.row is not None:
                    cited.setdefault(ev.table, set()).add(ev.row)
            walk(f.explains)

    walk(findings)
    return cited


def _definitions(report: Report) -> str:
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in report.metrics.items())
    return f'<section id="definitions"><h2>Metric definitions</h2><dl class="defs card">{items}</dl></section>'


# -- the page ---------------------------------------------------------------------------------------


def render_html(report: Report, *, progress: Progress | None = None) -> str:
    """The report as one self-contained HTML document. ``progress(done, total)``, where
    given, hears of each section rendered."""
    anchors = Anchors.of(report)
    cited = _cited_rows(report.findings)
    total = 3 + (len(CHARTS) if report.job is None else 0) + len(report.tables)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    parts = [_header(report, anchors), _job(report, anchors)]
    tick()
    parts.append(_findings(report, anchors))
    tick()
    charts = []
    for chart in CHARTS if report.job is None else ():  # a job's charts are its ranks', above
        charts.append(chart(report, anchors))
        tick()
    if charts:
        parts.append('<section id="charts"><h2>Charts</h2><div class="charts">' + "".join(charts)
                     + "</div></section>")
    tables = [('<section id="tables"><h2>Summary tables</h2>'
               '<p class="desc">Click a column to sort (numbers largest first); type to filter rows. '
               "Hover a value for its exact figure.</p>")]
    for name, table in report.tables.items():
        tables.append(_table(name, table, anchors, cited.get(name, set()), name in OPEN_TABLES or name in cited))
        tick()
    tables.append("</section>")
    parts.append("".join(tables))
    parts.append(_definitions(report))
    tick()

    csp = (f"default-src 'none'; style-src 'unsafe-inline'; script-src {script_hash(SCRIPT)}; "
           "base-uri 'none'; form-action 'none'")
    title = f"advisor report: {report.session.source}"
    nav = ('<nav>' + ('<a href="#job">Job</a>' if report.job is not None else "")
           + '<a href="#findings">Findings</a>' + ('<a href="#charts">Charts</a>' if report.job is None else "")
           + '<a href="#tables">Tables</a><a href="#definitions">Definitions</a></nav>')
    document = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="advisor {esc(report.advisor_version)}">',
        f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        (f'<div class="topbar"><span class="brand">advisor</span>{nav}<span class="spacer"></span>'
         '<button type="button" id="download-json" title="the whole report as JSON">Download JSON</button></div>'),
        "<main>",
        *parts,
        (f'<footer>advisor {esc(report.advisor_version)} \u00b7 {esc(report.generated)} \u00b7 '
         "self-contained: opens offline, loads nothing.</footer>"),
        "</main>",
        f'<script type="application/json" id="advisor-report">{json_for_script(report.model_dump_json())}</script>',
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(document) + "\n"



NOTEBOOK_SCOPE = "advisor-report"


def render_html_fragment(report: Report) -> str:
    """The report's header, findings and charts as one ``<div>`` for a notebook cell: its
    styles scoped to that div (the notebook's own page is left as it is), no script, no
    tables (``Diagnosis.tables`` holds them as DataFrames), so nothing links to them."""
    anchors = dataclasses.replace(Anchors.of(report), linked=False)
    parts = [_header(report, anchors), _job(report, anchors), _findings(report, anchors)]
    charts = [chart(report, anchors) for chart in (CHARTS if report.job is None else ())]
    if charts:
        parts.append('<section id="charts"><h2>Charts</h2><div class="charts">' + "".join(charts)
                     + "</div></section>")
    return (f'<div class="{NOTEBOOK_SCOPE}"><style>{scoped_css(CSS, "." + NOTEBOOK_SCOPE)}</style><main>'
            + "".join(parts) + "</main></div>")


def scoped_css(css: str, scope: str) -> str:
    """``css`` with every rule limited to the elements under ``scope``: ``:root``, ``html``
    and ``body`` become the scope itself, other selectors are prefixed; @media blocks are
    scoped inside."""
    out: list[str] = []
    i, n = 0, len(css)
    while i < n:
        brace = css.find("{", i)
        if brace < 0:
            break
        head = css[i:brace].strip()
        depth, j = 1, brace + 1
        while j < n and depth:
            depth += {"{": 1, "}": -1}.get(css[j], 0)
            j += 1
        body = css[brace + 1:j - 1]
        if head.startswith("@media"):
            out.append(f"{head} {{{scoped_css(body, scope)}}}")
        elif head.startswith("@"):
            out.append(f"{head} {{{body}}}")
        else:
            selectors = []
            for selector in head.split(","):
                selector = selector.strip()
                if selector in (":root", "html", "body"):
                    selectors.append(scope)
                elif selector.startswith(("body ", "html ")):
                    selectors.append(f"{scope} {selector.split(' ', 1)[1]}")
                else:
                    selectors.append(f"{scope} {selector}")
            out.append(f"{', '.join(selectors)} {{{body}}}")
        i = j
    return "\n".join(out)
