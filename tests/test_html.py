"""The HTML report without a browser: self-contained, names escaped, evidence linked to rows,
charts drawn from the tables made for them (step_phases, gpu_timeline, roofline_ceilings),
and those tables adding up to the aggregate tables. tests/test_browser.py opens it in one."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from conftest import shared_trace
from hypothesis import given, settings
from hypothesis import strategies as st
from report_samples import MS, NASTY, sample_report, sample_session

from advisor.cli import main
from advisor.importers import load
from advisor.reports import _html, render, render_html, render_markdown
from advisor.session import intervals as iv
from advisor.tables import compute_tables
from advisor.tables.timeline import IDLE_COLUMNS, PHASE_COLUMNS, per_bucket


class Page(HTMLParser):
    """What the tests look at in a page: elements, attributes, row ids and their keys,
    evidence links, script bodies, and each chart's markup."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: dict[str, str] = {}  # tr id -> its first cell's text
        self.links: list[dict[str, str | None]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._row: str | None = None
        self._cell: list[str] | None = None
        self._script: dict[str, str | None] | None = None
        self._script_text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "tr" and attributes.get("id"):
            self._row = attributes["id"]
        elif tag == "td" and self._row is not None and self._row not in self.rows and self._cell is None:
            self._cell = []
        elif tag == "a" and "ev" in (attributes.get("class") or "").split():
            self.links.append(attributes)
        elif tag == "script":
            self._script, self._script_text = attributes, []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None and self._row is not None:
            self.rows[self._row] = "".join(self._cell)
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._script_text)))
            self._script = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._script is not None:
            self._script_text.append(data)


def _chart(html: str, chart_id: str) -> str:
    """The markup of one chart's figure."""
    start = html.rindex("<figure", 0, html.index(f'id="{chart_id}"'))
    return html[start:html.index("</figure>", start)]


@pytest.fixture(scope="module")
def report():
    return sample_report()


@pytest.fixture(scope="module")
def html(report):
    return render_html(report)


@pytest.fixture(scope="module")
def page(html):
    return Page(html)


# -- self-contained and safe ------------------------------------------------------------------------


def test_the_page_loads_nothing_from_anywhere(html, page):
    assert not [a for _, a in page.tags if "src" in a]
    assert all(a["href"].startswith("#") for t, a in page.tags if "href" in a)
    assert not [t for t, _ in page.tags if t in ("link", "iframe", "object", "embed", "img", "base")]
    style = html[html.index("<style>"):html.index("</style>")]
    code = page.scripts[-1][1]
    for needle in ("http:", "https:", "url(", "@import", "fetch(", "XMLHttpRequest"):
        assert needle not in style and needle not in code, needle


def test_the_policy_allows_only_the_report_script(html, page):
    policies = [a.get("content") for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert len(policies) == 1
    policy = policies[0]
    assert "default-src 'none'" in policy and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    code = [body for attrs, body in page.scripts if "type" not in attrs]
    assert len(code) == 1
    digest = base64.b64encode(hashlib.sha256(code[0].encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy


def test_names_from_the_trace_are_text_never_markup(html, page):
    assert NASTY not in html
    assert "&lt;/script&gt;&lt;script&gt;window.__pwned=1" in html
    assert html.count("<script") == 2  # the JSON data and the report's own script
    assert not any(t == "img" for t, _ in page.tags)
    assert not any("onerror" in attrs for _, attrs in page.tags)
    # The kernel's row shows the name exactly as the trace spelled it.
    assert NASTY in page.rows.values()


def test_the_embedded_json_is_the_report(report, page):
    data = [body for attrs, body in page.scripts if attrs.get("type") == "application/json"]
    assert len(data) == 1
    assert "</" not in data[0] and "<" not in data[0]
    assert json.loads(data[0]) == json.loads(report.model_dump_json())


# -- findings and their evidence --------------------------------------------------------------------


def _table_evidence(findings):
    for finding in findings:
        for ev in finding.evidence:
            if ev.kind == "table_row":
                yield ev
        yield from _table_evidence(finding.explains)


def test_every_cited_row_is_a_link_to_that_row(report, page):
    cited = list(_table_evidence(report.findings))
    assert len(cited) >= 8
    assert len(page.links) == len(cited)
    for ev, link in zip(cited, page.links, strict=True):
        target = link["href"].removeprefix("#")
        assert page.rows[target] == ev.row, (ev.table, ev.row)
        assert target.startswith(f"tbl-{ev.table}-r")
        assert link.get("data-col") == ev.column


def test_findings_come_ranked_with_their_savings(report, html):
    positions = [html.index(f'id="finding-{i}"') for i in range(1, len(report.findings) + 1)]
    assert positions == sorted(positions)
    assert 'id="finding-1-1"' in html  # the symptom nested under its cause
    # 100 ms steps, 40 ms of loading: the other 60 ms stay, a quarter slower beside workers
    # (a trace does not say how many cores they get; at worst half slower, at best 0.6 as fast)
    assert "Saves <b>25.0 ms/step (25% of step; between 10.0 ms and 64.0 ms)</b>" in html
    assert html.index('id="findings"') < html.index('id="charts"') < html.index('id="tables"')


def test_a_long_table_keeps_the_rows_findings_cite(report, monkeypatch):
    monkeypatch.setattr(_html, "MAX_ROWS", 1)
    html = render_html(report)
    page = Page(html)
    for ev in _table_evidence(report.findings):
        shown = {key for row, key in page.rows.items() if row.startswith(f"tbl-{ev.table}-r")}
        assert ev.row in shown, (ev.table, ev.row)
    assert 'id="tbl-gpu_timeline-r0"' in html and 'id="tbl-gpu_timeline-r1"' not in html
    assert "Showing 1 of 120 rows" in html


# -- charts -------------------------------------------------------------------------------------------


def test_step_chart_has_a_stacked_column_per_step(html):
    chart = _chart(html, "chart-steps")
    assert chart.count('<g class="col">') == 3
    assert chart.count('class="s-dataloader"') == 3
    assert chart.count('class="overlay"') == 3  # GPU busy per step
    assert 'href="#tbl-step_phases-r0"' in chart


def test_gpu_chart_has_a_column_per_slice_and_the_step_starts(report, html):
    chart = _chart(html, "chart-gpu")
    assert chart.count('<g class="col">') == len(report.tables["gpu_timeline"].rows) == 120
    assert chart.count('class="marker-label"') == 3
    assert ">100%<" in chart and ">0%<" in chart


def test_operator_and_kernel_charts_rank_by_gpu_time(html):
    kernels = _chart(html, "chart-kernels")
    assert kernels.count('<g class="bar">') == 2
    # The longer kernel first; its label cut and escaped, its full name in the tooltip.
    assert kernels.index("&lt;/script&gt;") < kernels.index("volta_sgemm")
    operators = _chart(html, "chart-operators")
    assert operators.count('<g class="bar">') == 3
    assert "aten::mm" in operators


def test_roofline_draws_the_op_under_its_ceiling(html):
    chart = _chart(html, "chart-roofline")
    assert chart.count("<circle") == 1
    assert chart.count('class="roof"') == 1
    assert "cuda cores fp32" in chart and 'href="#tbl-roofline-r0"' in chart


def test_without_a_gpu_the_charts_say_what_was_not_measured():
    html = render_html(sample_report(gpu=False))
    assert "GPU not measured" in _chart(html, "chart-gpu")
    assert "No kernels recorded" in _chart(html, "chart-kernels") or "no GPU" in _chart(html, "chart-kernels")
    assert _chart(html, "chart-steps").count('<g class="col">') == 3
    assert 'class="overlay"' not in _chart(html, "chart-steps")


def test_every_table_is_searchable_and_sortable(report, page):
    searches = [a for t, a in page.tags if t == "input" and "search" in (a.get("class") or "")]
    tables = [a for t, a in page.tags if t == "table" and "data" in (a.get("class") or "")]
    with_rows = [name for name, table in report.tables.items() if table.rows]
    assert len(searches) == len(tables) == len(with_rows)
    assert all(s["data-table"] == t["id"] for s, t in zip(searches, tables, strict=True))
    sortable = [a for t, a in page.tags if t == "th" and a.get("data-col")]
    assert len(sortable) == sum(len(report.tables[n].columns) for n in with_rows)


def test_numbers_sort_by_their_exact_value(html):
    # 40.0 ms shown, 40000000 to sort on and to read in the tooltip.
    assert re.search(r'<td class="num" data-v="40000000" title="40000000">40.0 ms</td>', html)


# -- files and the command line -------------------------------------------------------------------------


def test_render_writes_the_page(report, tmp_path):
    out = tmp_path / "deep" / "report.html"
    render(report, "html", out)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_diagnose_writes_html(tmp_path, capsys):
    folder = sample_session().save(tmp_path / "session")
    out = tmp_path / "report.html"
    assert main(["diagnose", str(folder), "--format", "html", "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and 'id="chart-roofline"' in text
    assert "report written" in capsys.readouterr().err


def test_markdown_report_is_fit_for_a_pull_request(report):
    text = render_markdown(report)
    for finding in report.findings:
        assert finding.title.replace("<", "&lt;").replace(">", "&gt;") in text
    assert "25.0 ms/step (25% of step; between 10.0 ms and 64.0 ms)" in text
    assert "#### Kernel Summary" in text and "#### Operator Summary" in text
    # Markup from the trace is shown as text: in code spans (which GitHub prints as they
    # are) or backslash-escaped in table cells, never as raw HTML.
    outside_code = re.sub(r"`[^`]*`", "", text)
    assert not re.search(r"(?<!\\)<(/?script|img)", outside_code)
    assert "\\<script\\>" in outside_code


# -- the tables the charts draw ---------------------------------------------------------------------------


def _check_over_time(tables):
    steps, model = tables["step_phases"], tables["model"]
    for phase, column in PHASE_COLUMNS.items():
        assert steps[column].sum() == model.loc[phase, "cpu_total_ns"], phase
    assert steps["duration_ns"].sum() == model.loc["ProfileStep", "cpu_total_ns"]
    assert steps["gpu_busy_ns"].sum() == model.loc["ProfileStep", "gpu_total_ns"]
    timeline, idle = tables["gpu_timeline"], tables["gpu_idle"]
    for state, column in IDLE_COLUMNS.items():
        assert timeline[column].sum() == idle.loc[state, "idle_ns"], state
    parts = timeline["busy_ns"] + timeline[list(IDLE_COLUMNS.values())].sum(axis=1)
    assert (parts == timeline["duration_ns"]).all()
    assert timeline["duration_ns"].sum() == tables["device"].loc["gpu:0", "window_ns"]
    assert timeline["busy_ns"].sum() == tables["device"].loc["gpu:0", "busy_ns"]


def test_tables_over_time_add_up_to_the_aggregates():
    tables = compute_tables(sample_session())
    _check_over_time(tables)
    assert list(tables["step_phases"].index) == ["1", "2", "3"]
    assert (tables["step_phases"]["dataloader_ns"] == 40 * MS).all()
    ceilings = tables["roofline_ceilings"]
    assert list(ceilings.index) == ["cuda cores fp32"]
    assert ceilings.loc["cuda cores fp32", "peak_flops_per_s"] == pytest.approx(19.5e12)
    assert ceilings.loc["cuda cores fp32", "ridge_flops_per_byte"] == pytest.approx(19.5e12 / 1.555e12, rel=0.05)


def test_tables_over_time_on_the_real_resnet_trace():
    tables = compute_tables(load(shared_trace("resnet50_v100_num_workers_0.pt.trace.json.gz")))
    _check_over_time(tables)
    assert len(tables["step_phases"]) == 6 and len(tables["gpu_timeline"]) == 120
    assert "cuda cores fp32" in tables["roofline_ceilings"].index


def test_without_gpu_or_steps_the_tables_are_empty_and_say_why():
    tables = compute_tables(sample_session(gpu=False))
    assert tables["gpu_timeline"].empty and tables["gpu_timeline"].attrs["notes"]
    assert np.isnan(tables["step_phases"]["gpu_busy_ns"]).all()
    empty = compute_tables(sample_session(steps=0))
    assert empty["step_phases"].empty


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), max_size=12),
       st.lists(st.integers(0, 1200), min_size=2, max_size=8, unique=True))
def test_per_bucket_is_the_covered_time_of_each_bucket(spans, edges):
    normal = iv.union(([s for s, _ in spans], [s + d for s, d in spans]))
    edges = np.sort(np.asarray(edges, dtype=np.int64))
    got = per_bucket(normal, edges)
    want = [iv.intersection_length(normal, ([a], [b])) for a, b in itertools.pairwise(edges)]
    assert got.tolist() == want


def test_the_real_resnet_report_draws_every_chart():
    session = load(shared_trace("resnet50_v100_num_workers_0.pt.trace.json.gz"))
    from advisor.reports import build_report
    from advisor.rules import run_rules
    from advisor.tables import TABLE_DOCS

    tables = compute_tables(session)
    report = build_report(session, tables, run_rules(session, tables).findings, table_docs=TABLE_DOCS)
    html = render_html(report)
    assert _chart(html, "chart-steps").count('<g class="col">') == 6
    assert _chart(html, "chart-kernels").count('<g class="bar">') == 20
    assert _chart(html, "chart-operators").count('<g class="bar">') == 20
    assert _chart(html, "chart-roofline").count("<circle") > 100
    page = Page(html)
    assert all(page.rows.get(link["href"][1:]) is not None for link in page.links)
    assert len(html) < 3_000_000


def test_row_ids_never_come_from_names(page):
    assert page.rows and all(re.fullmatch(r"tbl-[a-z0-9_-]+-r\d+", row) for row in page.rows)


def test_the_data_loader_card_gives_the_share_the_finding_gives(tmp_path):
    """The summary card and the loader finding speak of the same step: the job's own (the
    steps timed without the profiler), not the recorded window's."""
    from pathlib import Path

    case = Path(__file__).resolve().parents[1] / "cases" / "cpu_in_memory_loop" / "session"
    out = tmp_path / "r.json"
    assert main(["diagnose", str(case), "--format", "json", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    timing = {r["key"]: r for r in report["tables"]["step_timing"]["rows"]}
    share = timing["Dataloader"]["best_ratio"]
    page = tmp_path / "r.html"
    assert main(["diagnose", str(case), "--format", "html", "-o", str(page)]) == 0
    card = re.search(r'<div class="name">Data loader</div><div class="value">([^<]*)</div>', page.read_text())
    assert card is not None and card.group(1) == f"{share * 100:.1f}%", card
    finding = next(f for f in report["findings"] if f["rule"] == "dataloader-starvation")
    assert f"{share * 100:.1f}% of each step" in finding["message"]
