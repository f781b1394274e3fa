"""`advisor mcp`: advisor's analyses as Model Context Protocol tools, on stdio.

Built on the official `mcp` SDK (``pip install 'advisor[mcp]'``). The tools:

    diagnose(target, rules?, gpu?)       ranked findings with savings, ranges, evidence and the
                                         report's notes: the JSON report as structured content
                                         (report.schema.json), a short summary as text
    summary(target, table, sort?, ...)   one summary table's rows, a page at a time
    compare(before, after)               what changed between two profiles, what multiplied
    explain(rule)                        a rule's documentation and thresholds
    verify(script, args?, ...)           RUNS THE USER'S SCRIPT: `advisor verify`, its findings
                                         with the fixes applied and measured

A target is a trace file, a saved session folder or a job's folder; only ``verify`` runs a
script, and says so in its description and annotations. Bad input is a tool error carrying
advisor's one-line message, and the server stays up. A target's diagnosis is kept while the
server runs (keyed by the file's size and modification time), so paging through its tables
reads it once.
"""

# No `from __future__ import annotations`: the SDK reads the tools' annotations, which name
# types imported inside build_server.
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

from advisor.api.target import Diagnosed, diagnose_target
from advisor.errors import AdvisorError

__all__ = ["build_server", "serve"]

PAGE_ROWS = 50
MAX_PAGE_ROWS = 500
_KEPT = 8  # diagnoses kept while the server runs


def _errors_as_tool_errors(call: Any) -> Any:
    """advisor's own errors as tool errors with its one-line message."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return call()
    except AdvisorError as exc:
        raise ToolError(f"advisor: {exc}") from None


class _Diagnoses:
    """The last few targets' diagnoses, while the file is unchanged."""

    def __init__(self) -> None:
        self._kept: dict[tuple, Diagnosed] = {}

    def get(self, target: str, rules: list[str] | None, gpu: str | None) -> Diagnosed:
        path = Path(target)
        try:
            stat = path.stat()
            key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, tuple(rules or ()), gpu)
        except OSError:
            key = None
        if key is not None and key in self._kept:
            return self._kept[key]
        done = diagnose_target(target, rules=rules, gpu=gpu)
        if key is not None:
            while len(self._kept) >= _KEPT:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = done
        return done


def shown_safely(text: str) -> str:
    """A tool's text with the control characters of names from traces escaped (advisor.units):
    an agent's client may show it in a terminal."""
    from advisor.units import shown_safely as safe

    return safe(text)


def safe_strings(value: Any) -> Any:
    from advisor.units import safe_strings as safe

    return safe(value)


def _summary_text(report: Any) -> str:
    """The report in a few lines: what was read, the top findings, the notes."""
    lines = [f"advisor diagnosed {report.session.source}: {len(report.findings)} findings."]
    for i, finding in enumerate(report.findings[:5], 1):
        saving = finding.saving
        span = (f" [{saving.low_ms_per_step:.3g}, {saving.high_ms_per_step:.3g}]"
                if saving.low_ms_per_step is not None and saving.high_ms_per_step is not None else "")
        lines.append(f"{i}. {finding.severity.value.upper()} {finding.rule}: {finding.title}; saves "
                     f"{saving.ms_per_step:.3g} ms/step{span} ({saving.share_of_step * 100:.0f}% of the step). "
                     f"Fix: {finding.recommendation}")
    lines += [f"Note: {note}" for note in report.notes]
    return "\n".join(lines)


def build_server() -> Any:
    """The MCP server with advisor's tools (not yet running)."""
    from mcp.server.mcpserver import MCPServer
    from mcp_types import CallToolResult, TextContent, ToolAnnotations

    from advisor._version import __version__
    from advisor.reports import Report

    server = MCPServer("advisor", version=__version__, log_level="WARNING",
                       instructions="advisor diagnoses deep-learning performance profiles (PyTorch profiler / "
                                    "Kineto traces, saved advisor sessions, folders of rank traces): ranked "
                                    "findings, each with the time its fix saves per step and its evidence. "
                                    "Start with diagnose; summary pages through one table; explain says what a "
                                    "rule checks; verify runs the user's script to measure fixes.")
    kept = _Diagnoses()
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=reads)
    def diagnose(target: str, rules: list[str] | None = None,
                 gpu: str | None = None) -> Annotated[CallToolResult, Report]:
        """Diagnose a profile: a trace file (.json / .json.gz), a saved session folder or a folder of
        rank traces. Returns the ranked findings with savings (ms per step, a range), evidence and the
        report's notes as the JSON report, its summary tables left out (the text names them; the
        summary tool pages through one). rules: paths of rule packs of your own; gpu: judge against
        this GPU (A100, h100-sxm, ...). Runs no code."""
        done = _errors_as_tool_errors(lambda: kept.get(target, rules, gpu))
        text = (_summary_text(done.report) + "".join(f"\nadvisor: {line}" for line in done.said)
                + f"\nTables (page through one with summary): {', '.join(done.report.tables)}")
        return CallToolResult(content=[TextContent(type="text", text=shown_safely(text))],
                              structured_content=_without_tables(done.report))

    @server.tool(annotations=reads)
    def summary(target: str, table: str, sort: str | None = None, descending: bool = True, offset: int = 0,
                limit: int = PAGE_ROWS) -> dict[str, Any]:
        """One summary table of a profile (as `advisor summary`), a page of rows at a time: offset and
        limit (at most 500) page through it, next_offset is null on the last page; sort by a column.
        Tables: the names `diagnose` lists under tables (model, operator, kernel, step_timing, ...)."""
        done = _errors_as_tool_errors(lambda: kept.get(target, None, None))
        return _errors_as_tool_errors(lambda: safe_strings(_page(done, table, sort, descending, offset, limit)))

    @server.tool(annotations=reads)
    def compare(before: str, after: str) -> dict[str, Any]:
        """Compare two profiles (traces or saved sessions): step time, phases, the rows that moved and
        multiplied, the findings that went, came and changed."""
        return _errors_as_tool_errors(lambda: safe_strings(_compare(kept, before, after)))

    @server.tool(annotations=reads)
    def explain(rule: str) -> dict[str, Any]:
        """What a rule checks, why it matters, an example and what to do instead, with its thresholds
        (`advisor rules show ID`)."""
        return _errors_as_tool_errors(lambda: _explain(rule))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=True))
    def verify(script: str, args: list[str] | None = None, budget_s: float = 300.0,
               max_fixes: int = 3) -> Annotated[CallToolResult, Report]:
        """RUNS THE USER'S SCRIPT, several times: `advisor verify SCRIPT ARGS`. Diagnoses the training
        script, then applies each finding's fix that advisor can apply from outside the script and
        measures it (runs with and without the fix, alternately, within budget_s seconds). Whatever the
        script does (files, checkpoints, downloads) happens on every run. ``script`` must be an existing
        file; the whole run is bounded by budget_s plus 600 s for the diagnosis before the trials, and
        the script's processes end with it. Returns the JSON report, each finding with its verification
        (measured saving, inside the predicted range?) or why not."""
        return _errors_as_tool_errors(lambda: _verify(script, args or [], budget_s, max_fixes, CallToolResult,
                                                      TextContent))

    return server


def _without_tables(report: Any) -> dict[str, Any]:
    """The JSON report without its tables (most of its size; the summary tool pages them;
    the text names them). Still valid against the report's schema."""
    return json.loads(report.model_copy(update={"tables": {}}).model_dump_json())


def _page(done: Diagnosed, table: str, sort: str | None, descending: bool, offset: int,
          limit: int) -> dict[str, Any]:
    from advisor.errors import UsageError

    frame = done.tables.get(table)
    if frame is None:
        raise UsageError(f"no table {table!r} in this profile; its tables: {', '.join(done.tables)}")
    if offset < 0 or not 1 <= limit <= MAX_PAGE_ROWS:
        raise UsageError(f"offset must be 0 or more and limit 1 to {MAX_PAGE_ROWS}")
    # A table keyed by its index (an op's name, a phase) gives the key as its first column.
    rows = frame if type(frame.index).__name__ == "RangeIndex" else frame.reset_index()
    if sort is not None:
        if sort not in rows.columns:
            raise UsageError(f"no column {sort!r} in {table}; its columns: {', '.join(map(str, rows.columns))}")
        rows = rows.sort_values(sort, ascending=not descending, kind="stable")
    page = rows.iloc[offset:offset + limit]
    records = json.loads(page.to_json(orient="records", default_handler=str))
    end = offset + len(page)
    return {"table": table, "columns": [str(c) for c in rows.columns], "rows": records, "total_rows": len(rows),
            "offset": offset, "next_offset": end if end < len(rows) else None}


def _compare(kept: _Diagnoses, before: str, after: str) -> dict[str, Any]:
    from advisor.errors import UsageError
    from advisor.tables.comparison import compare

    sides = []
    for target in (before, after):
        done = kept.get(target, None, None)
        if done.session is None:
            raise UsageError(f"{target} is a job: compare jobs with `advisor compare` on the command line")
        sides.append((done.session, done.tables, list(done.report.findings)))
    return json.loads(compare(sides[0], sides[1]).model_dump_json())


def _explain(rule: str) -> dict[str, Any]:
    from advisor.api.target import selection
    from advisor.errors import UsageError

    chosen = selection(None, [])
    specs = {spec.id: spec for spec in chosen.specs}
    spec = specs.get(rule)
    if spec is None:
        raise UsageError(f"no rule {rule!r}; the rules: {', '.join(sorted(specs))}")
    return {"id": spec.id, "title": spec.title, "severity": spec.severity.value, "lifecycle": spec.lifecycle.value,
            "docs": spec.docs.model_dump(), "thresholds": dict(spec.thresholds), "tables": list(spec.tables),
            "explains": list(spec.explains), "verify": [entry.apply for entry in spec.verify],
            "not_verifiable": spec.not_verifiable}


# The diagnosis that comes before verify's trials runs the script once more: this long at
# most, beside the trials' budget, before the whole command is stopped.
VERIFY_DIAGNOSIS_S = 600.0
MAX_VERIFY_BUDGET_S = 3600.0


def _verify(script: str, args: list[str], budget_s: float, max_fixes: int, result_type: Any,
            text_type: Any) -> Any:
    """`advisor verify` in a process of its own (the script must not run in the server's)."""
    from advisor.errors import UsageError
    from advisor.reports import Report

    import math
    import os
    import signal

    path = Path(script)
    if not script or not path.is_file():
        # Only a script that exists runs; a name starting with "-" is never read as an option.
        raise UsageError(f"script {script!r} is not a file")
    if not (isinstance(budget_s, (int, float)) and math.isfinite(budget_s) and 0 < budget_s <= MAX_VERIFY_BUDGET_S):
        raise UsageError(f"budget_s must be a number of seconds between 0 and {MAX_VERIFY_BUDGET_S:g}")
    with tempfile.TemporaryDirectory(prefix="advisor-mcp-") as folder:
        out = Path(folder) / "report.json"
        # "--" ends advisor's options: the script and its arguments are never read as them.
        command = [sys.executable, "-m", "advisor", "verify", "--format", "json", "-o", str(out),
                   "--budget", str(budget_s), "--max-fixes", str(int(max_fixes)), "--", str(path), *map(str, args)]
        # The whole run is bounded (the diagnosis before the trials too), and the script's
        # whole process tree ends with it.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   stdin=subprocess.DEVNULL, env=_no_progress(), start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=budget_s + VERIFY_DIAGNOSIS_S)
        except BaseException:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
            process.communicate()
            raise UsageError(f"advisor verify did not finish within {budget_s + VERIFY_DIAGNOSIS_S:.0f} s "
                             "(its budget and the diagnosis before it); the script's processes were ended") from None
        done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
        if not out.is_file():  # the script's own last words too: an agent sees no terminal
            lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
            said = " | ".join(line.strip() for line in lines[-4:] if line.strip())
            raise UsageError(said.removeprefix("advisor: "))
        report = Report.model_validate_json(out.read_text())
    text = _summary_text(report)
    for finding in report.findings:
        v = finding.verification
        if v is not None:
            text += (f"\n{finding.rule}: verified, {v.applied} saved {v.measured_saving_ms_per_step:.3g} ms/step "
                     f"measured ({'inside' if v.inside_range else 'outside'} the predicted range"
                     f"{'' if v.clear_of_noise else ', not clear of the noise'})")
        elif finding.not_verified is not None:
            text += f"\n{finding.rule}: not verified: {finding.not_verified.reason}"
    return result_type(content=[text_type(type="text", text=shown_safely(text))],
                       structured_content=json.loads(report.model_dump_json()))


def _no_progress() -> dict[str, str]:
    import os

    return {**os.environ, "ADVISOR_NO_PROGRESS": "1"}


def serve() -> None:
    """Run the server on stdio until the client closes it."""
    build_server().run("stdio")
