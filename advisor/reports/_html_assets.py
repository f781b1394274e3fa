"""The HTML report's stylesheet and script, inlined into every report (no network)."""

from __future__ import annotations

import base64
import hashlib

__all__ = ["CSS", "SCRIPT", "script_hash"]

CSS = """
:root {
  --bg: #f6f7f9; --card: #ffffff; --text: #1d2330; --muted: #5c6577; --line: #e2e5eb;
  --accent: #2f6fdf; --accent-soft: #e8f0fd; --hl: #fff3b0; --hl-cell: #ffd84d;
  --critical: #9b1c1c; --high: #d43f3a; --medium: #e08a00; --low: #2f8fb0; --info: #7a8394;
  --c-dataloader: #e4575b; --c-forward: #4c78a8; --c-backward: #6fb3b8; --c-optimization: #59a14f;
  --c-others: #b9b1ab; --c-busy: #59a14f; --c-idle-dl: #e4575b; --c-idle-sync: #b07aa1;
  --c-idle-launch: #f28e2b; --c-idle-other: #c9c3bd; --c-idle-queued: #76b7b2; --c-idle-comm: #9c755f;
  --c-idle-model: #edc948; --c-idle-host: #ff9da7; --c-gpu: #4c78a8; --c-cpu: #a0c3e8;
  --c-kernel: #f28e2b; --c-op: #4c78a8;
  font-size: 14px;
}
@media (prefers-color-scheme: dark) {
  :root { --bg: #14171d; --card: #1d2129; --text: #e3e6ec; --muted: #98a1b3; --line: #323846;
          --accent: #7aa7ff; --accent-soft: #23304a; --hl: #4a4320; --hl-cell: #7a6a12; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--text);
       font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       line-height: 1.45; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
              font-size: 0.92em; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
.topbar { position: sticky; top: 0; z-index: 10; background: var(--card); border-bottom: 1px solid var(--line);
          display: flex; align-items: center; gap: 20px; padding: 8px 28px; }
.topbar .brand { font-weight: 700; letter-spacing: 0.02em; }
.topbar nav a { margin-right: 16px; color: var(--muted); font-weight: 500; }
.topbar nav a:hover { color: var(--accent); }
.topbar .spacer { flex: 1; }
.topbar button { font: inherit; border: 1px solid var(--line); background: var(--bg); color: var(--text);
                 border-radius: 6px; padding: 3px 10px; cursor: pointer; }
main { max-width: 1360px; margin: 0 auto; padding: 18px 28px 60px; }
h1 { font-size: 1.6rem; margin: 6px 0 2px; }
h2 { font-size: 1.25rem; margin: 30px 0 12px; padding-top: 8px; }
h3 { font-size: 1.05rem; margin: 0; }
.subtitle { color: var(--muted); margin-bottom: 14px; word-break: break-all; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0 0 14px; }
.meta dt { color: var(--muted); }
.meta dd { margin: 0; }
.meta dd.warn { color: #8a5a00; }
@media (prefers-color-scheme: dark) { .meta dd.warn { color: #f1d48a; } }
.headline { background: #fff7e0; color: #6b4b00; border-left: 5px solid var(--medium); padding: 8px 12px;
             margin: 8px 0; border-radius: 3px; font-weight: 650; }
@media (prefers-color-scheme: dark) { .headline { background: #3a3118; color: #f1d48a; } }
.notes { margin: 8px 0 0; padding: 0; list-style: none; }
.notes li { background: #fff7e0; color: #6b4b00; border-left: 3px solid var(--medium); padding: 5px 10px;
            margin: 4px 0; border-radius: 3px; }
@media (prefers-color-scheme: dark) { .notes li { background: #3a3118; color: #f1d48a; } }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(180px, 1fr)); gap: 12px; margin: 14px 0; }
.figure { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
.figure .name { color: var(--muted); font-size: 0.85rem; }
.figure .value { font-size: 1.45rem; font-weight: 650; margin: 2px 0; }
.figure .sub { color: var(--muted); font-size: 0.85rem; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; }
.finding { background: var(--card); border: 1px solid var(--line); border-left: 5px solid var(--info);
           border-radius: 8px; padding: 12px 16px; margin: 0 0 12px; }
.finding.sev-critical { border-left-color: var(--critical); }
.finding.sev-high { border-left-color: var(--high); }
.finding.sev-medium { border-left-color: var(--medium); }
.finding.sev-low { border-left-color: var(--low); }
.finding .head { display: flex; align-items: baseline; gap: 10px; flex-wrap: wrap; }
.finding .rank { font-weight: 700; color: var(--muted); min-width: 1.6em; }
.finding .rule { color: var(--muted); }
.sev { font-size: 0.72rem; font-weight: 700; letter-spacing: 0.05em; color: #fff; border-radius: 4px;
       padding: 1px 7px; background: var(--info); }
.sev.critical { background: var(--critical); } .sev.high { background: var(--high); }
.sev.medium { background: var(--medium); } .sev.low { background: var(--low); }
.saving { display: flex; align-items: center; gap: 10px; margin: 8px 0 6px; flex-wrap: wrap; }
.saving .meter { width: 160px; height: 8px; background: var(--line); border-radius: 4px; overflow: hidden; }
.saving .meter span { display: block; height: 100%; background: var(--c-busy); }
.saving b { font-size: 1.05rem; }
.saving .conf, .basis { color: var(--muted); font-size: 0.88rem; }
.finding p { margin: 6px 0; }
.finding .fix { background: var(--accent-soft); border-radius: 6px; padding: 6px 10px; }
.evidence { margin: 6px 0 0; padding-left: 20px; }
.evidence li { margin: 2px 0; }
.evidence a.ev code { color: var(--accent); }
.explains { margin: 10px 0 0 8px; }
.explains .finding { border-left-width: 4px; margin-bottom: 8px; }
.explained-tag { font-size: 0.8rem; font-style: italic; color: var(--muted); }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.charts .wide { grid-column: 1 / -1; }
@media (max-width: 1100px) { .charts { grid-template-columns: 1fr; } }
figure.card { margin: 0; }
figure.card p { margin: 4px 0 8px; color: var(--muted); font-size: 0.88rem; }
figure.card .source { font-size: 0.82rem; color: var(--muted); margin-top: 4px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 0.85rem; margin: 4px 0 6px; }
.legend span::before { content: ""; display: inline-block; width: 11px; height: 11px; border-radius: 2px;
                       margin-right: 5px; vertical-align: -1px; background: var(--sw); }
.legend .line::before { height: 3px; vertical-align: 3px; }
.legend .dot::before { border-radius: 50%; }
.empty { color: var(--muted); font-style: italic; }
svg.chart { width: 100%; height: auto; display: block; font-size: 12px; }
svg.chart text { fill: var(--text); }
svg.chart .tick, svg.chart .value { fill: var(--muted); font-size: 11px; }
svg.chart .label { font-size: 11.5px; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
svg.chart .grid { stroke: var(--line); stroke-width: 1; }
svg.chart .axis { stroke: var(--muted); stroke-width: 1; }
svg.chart .band { fill: transparent; }
svg.chart .bar:hover .band, svg.chart .col:hover .hit { fill: var(--accent-soft); }
svg.chart .hit { fill: transparent; }
svg.chart .marker { stroke: var(--muted); stroke-dasharray: 3 3; }
svg.chart .marker-label { fill: var(--muted); font-size: 10px; }
svg.chart .overlay { stroke: var(--text); stroke-width: 2.5; }
svg.chart .roof { fill: none; stroke: var(--text); stroke-width: 2; opacity: 0.75; }
svg.chart .roof-label { fill: var(--muted); font-size: 11px; }
svg.chart .axis-title { fill: var(--muted); font-size: 11.5px; }
svg.chart .pt-op { fill: var(--c-op); fill-opacity: 0.55; stroke: var(--c-op); }
svg.chart .pt-kernel { fill: var(--c-kernel); fill-opacity: 0.55; stroke: var(--c-kernel); }
svg.chart a:hover circle { fill-opacity: 0.95; }
.s-dataloader { fill: var(--c-dataloader); } .s-forward { fill: var(--c-forward); }
.s-backward { fill: var(--c-backward); } .s-optimization { fill: var(--c-optimization); }
.s-others { fill: var(--c-others); } .s-busy { fill: var(--c-busy); } .s-idle-dl { fill: var(--c-idle-dl); }
.s-idle-sync { fill: var(--c-idle-sync); } .s-idle-launch { fill: var(--c-idle-launch); }
.s-idle-other { fill: var(--c-idle-other); } .s-idle-comm { fill: var(--c-idle-comm); }
.s-idle-model { fill: var(--c-idle-model); } .s-idle-host { fill: var(--c-idle-host); } .s-idle-queued { fill: var(--c-idle-queued); } .s-gpu { fill: var(--c-gpu); } .s-cpu { fill: var(--c-cpu); }
.s-kernel { fill: var(--c-kernel); }
details.table { background: var(--card); border: 1px solid var(--line); border-radius: 8px; margin: 0 0 10px; }
details.table > summary { cursor: pointer; padding: 10px 14px; display: flex; gap: 10px; align-items: baseline; }
details.table > summary h3 { display: inline; }
details.table > summary .count { color: var(--muted); font-size: 0.88rem; }
details.table .body { padding: 0 14px 12px; }
details.table .desc { color: var(--muted); font-size: 0.88rem; margin: 0 0 8px; max-width: 110ch; }
.tools { display: flex; gap: 12px; align-items: center; margin: 6px 0; }
.tools input { font: inherit; padding: 4px 8px; border: 1px solid var(--line); border-radius: 6px; width: 280px;
               background: var(--bg); color: var(--text); }
.tools .shown { color: var(--muted); font-size: 0.85rem; }
.scroll { overflow: auto; max-height: 34em; border: 1px solid var(--line); border-radius: 6px; }
table.data { border-collapse: separate; border-spacing: 0; width: 100%; font-size: 0.86rem; }
table.data th, table.data td { padding: 3px 9px; border-bottom: 1px solid var(--line); white-space: nowrap;
                               text-align: left; max-width: 30em; overflow: hidden; text-overflow: ellipsis; }
table.data thead th { position: sticky; top: 0; background: var(--card); z-index: 1;
                      border-bottom: 2px solid var(--line); }
table.data th.num, table.data td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data td.key { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; max-width: 42em; }
table.data th button { font: inherit; font-weight: 600; background: none; border: 0; color: var(--text);
                       cursor: pointer; padding: 0; }
table.data th[aria-sort="ascending"] button::after { content: " \\25B2"; font-size: 0.7em; }
table.data th[aria-sort="descending"] button::after { content: " \\25BC"; font-size: 0.7em; }
table.data tbody tr:hover { background: var(--accent-soft); }
table.data tr.hl { background: var(--hl); }
table.data tr.hl td { border-bottom-color: var(--hl-cell); }
table.data td.hl-cell { background: var(--hl-cell); font-weight: 700; }
.defs dt { font-weight: 600; } .defs dd { margin: 0 0 6px 0; color: var(--muted); }
footer { color: var(--muted); font-size: 0.85rem; margin-top: 30px; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var doc = document;

  function bodyRows(table) { return Array.prototype.slice.call(table.tBodies[0].rows); }

  function sortValue(cell, numeric) {
    if (!cell) { return null; }
    if (numeric) {
      var raw = cell.getAttribute("data-v");
      if (raw === null || raw === "") { return null; }
      var n = Number(raw);
      return isNaN(n) ? null : n;
    }
    return cell.textContent;
  }

  function sortTable(table, index, numeric, descending) {
    var rows = bodyRows(table);
    rows.sort(function (a, b) {
      var x = sortValue(a.cells[index], numeric), y = sortValue(b.cells[index], numeric);
      if (x === null && y === null) { return a.getAttribute("data-i") - b.getAttribute("data-i"); }
      if (x === null) { return 1; }  // missing values last, whichever the direction
      if (y === null) { return -1; }
      var c = numeric ? x - y : x.localeCompare(y);
      if (c === 0) { return a.getAttribute("data-i") - b.getAttribute("data-i"); }
      return descending ? -c : c;
    });
    var body = table.tBodies[0];
    rows.forEach(function (row) { body.appendChild(row); });
  }

  doc.querySelectorAll("table.data thead th").forEach(function (th) {
    var button = th.querySelector("button");
    if (!button) { return; }
    button.addEventListener("click", function () {
      var table = th.closest("table");
      var numeric = th.classList.contains("num");
      var current = th.getAttribute("aria-sort");
      // Numbers first sort largest first (what costs most); text first sorts A to Z.
      var descending = current ? current === "ascending" : numeric;
      table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      sortTable(table, th.cellIndex, numeric, descending);
    });
  });

  function filterTable(table, query) {
    var terms = query.toLowerCase().split(/\s+/).filter(function (t) { return t.length > 0; });
    var rows = bodyRows(table), shown = 0;
    rows.forEach(function (row) {
      var text = row.textContent.toLowerCase();
      var match = terms.every(function (t) { return text.indexOf(t) >= 0; });
      row.hidden = !match;
      if (match) { shown += 1; }
    });
    var counter = doc.getElementById(table.id + "-shown");
    if (counter) {
      var noun = rows.length === 1 ? " row" : " rows";
      counter.textContent = terms.length ? shown + " of " + rows.length + noun : rows.length + noun;
    }
  }

  doc.querySelectorAll("input.search").forEach(function (input) {
    var table = doc.getElementById(input.getAttribute("data-table"));
    if (!table) { return; }
    input.addEventListener("input", function () { filterTable(table, input.value); });
  });

  function clearHighlights() {
    doc.querySelectorAll(".hl").forEach(function (el) { el.classList.remove("hl"); });
    doc.querySelectorAll(".hl-cell").forEach(function (el) { el.classList.remove("hl-cell"); });
  }

  function reveal(id, column) {
    var row = doc.getElementById(id);
    if (!row || row.tagName !== "TR") { return false; }
    var details = row.closest("details");
    if (details && !details.open) { details.open = true; }
    var table = row.closest("table");
    if (row.hidden && table) {
      var input = doc.querySelector("input.search[data-table='" + table.id + "']");
      if (input) { input.value = ""; }
      filterTable(table, "");
    }
    clearHighlights();
    row.classList.add("hl");
    if (column && table) {
      // The column's position from the header: cells carry no names of their own.
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
        if (th.getAttribute("data-col") === column && row.cells[index]) { row.cells[index].classList.add("hl-cell"); }
      });
    }
    var reduced = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
    row.scrollIntoView({ block: "center", behavior: reduced ? "auto" : "smooth" });
    return true;
  }

  doc.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a") : null;
    if (!link) { return; }
    var href = link.getAttribute("href") || "";
    if (href.charAt(0) !== "#") { return; }
    var id = decodeURIComponent(href.slice(1));
    var target = doc.getElementById(id);
    if (!target || target.tagName !== "TR") { return; }
    event.preventDefault();
    if (reveal(id, link.getAttribute("data-col"))) {
      history.pushState(null, "", "#" + id);
    }
  });

  function fromHash() {
    var id = decodeURIComponent(location.hash.slice(1));
    if (id) { reveal(id, null); }
  }
  window.addEventListener("hashchange", fromHash);
  fromHash();

  var download = doc.getElementById("download-json");
  var data = doc.getElementById("advisor-report");
  if (download && data) {
    download.addEventListener("click", function () {
      var text = JSON.stringify(JSON.parse(data.textContent), null, 2);
      var link = doc.createElement("a");
      link.href = URL.createObjectURL(new Blob([text], { type: "application/json" }));
      link.download = "advisor-report.json";
      doc.body.appendChild(link);
      link.click();
      link.remove();
    });
  }
  doc.documentElement.setAttribute("data-ready", "1");
})();
"""


def script_hash(script: str) -> str:
    """The Content-Security-Policy source for an inline script: only that exact script may
    run, so markup that slipped into a name could never execute."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"
