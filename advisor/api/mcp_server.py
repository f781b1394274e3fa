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
script, and says so in its description and annotations. It runs `advisor verify` in a
process session of its own, for at most its ``timeout_s`` (the diagnosis and the trials
together); the call's end, however it comes (done, out of time, cancelled by the client,
the client gone, the server stopped by a signal), ends the script and every process it
started (advisor.verify.processes).

Bad input is a tool error carrying advisor's one-line message, and any other failure one
line with its cause; the server stays up. Diagnoses are kept while the server runs (keyed
by the file's size and modification time), so paging through a target's tables reads it
once: the most recent first, within a memory budget in bytes (ADVISOR_MCP_KEEP_MB, 1024 MB
by default; each diagnosis's size estimated from all it holds), the oldest let go first.
"""

# No `from __future__ import annotations`: the SDK reads the tools' annotations, which name
# types imported inside build_server.
import gc
import json
import os
import sys
import threading
import types
from pathlib import Path
from typing import Annotated, Any

from advisor.api.mcp_verify import Runs, end_runs_on_signal, run_verify
from advisor.api.target import Diagnosed, diagnose_target
from advisor.errors import AdvisorError

__all__ = ["build_server", "serve"]

PAGE_ROWS = 50
MAX_PAGE_ROWS = 500
KEEP_MB = 1024  # the diagnoses kept while the server runs, at most (ADVISOR_MCP_KEEP_MB)


def _tool_error(exc: Exception) -> Exception:
    """Any failure as a tool error of one line that says its cause: advisor's own message,
    the system's words for an OSError, the exception's for anything else."""
    from mcp.server.mcpserver.exceptions import ToolError

    if isinstance(exc, AdvisorError):
        said = str(exc)
    elif isinstance(exc, MemoryError):
        said = ("out of memory: this profile needs more memory than the server has left (the diagnoses it kept "
                "were let go first); `advisor diagnose` on the command line reads it alone")
    elif isinstance(exc, OSError):
        said = f"{exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}"
    else:  # advisor's own bug: still its cause, in one line
        said = f"internal error ({type(exc).__name__}: {str(exc) or 'no message'})"
    return ToolError(shown_safely("advisor: " + " ".join(said.split())[:600]))


def _errors_as_tool_errors(call: Any) -> Any:
    """``call()``, its failures as tool errors with their one-line cause."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001  (each said in one line; the server stays up)
        raise _tool_error(exc) from None


class _Diagnoses:
    """Targets' diagnoses while their files are unchanged, the most recently used first,
    within ``budget_bytes`` (each one's size estimated by diagnosis_bytes). Tools
    run on worker threads: the lock guards the kept ones, not the diagnoses themselves."""

    def __init__(self, budget_bytes: int, in_flight: int = 2) -> None:
        self.budget_bytes = budget_bytes
        self._kept: dict[tuple, tuple[Diagnosed, int]] = {}
        self._lock = threading.Lock()
        # Diagnoses made at once: each holds a whole profile while it is read, which the
        # budget of kept ones does not count; more calls wait their turn.
        self._in_flight = threading.BoundedSemaphore(in_flight)

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(size for _, size in self._kept.values())

    def get(self, target: str, rules: list[str] | None, gpu: str | None) -> Diagnosed:
        path = Path(target)
        try:
            stat = path.stat()
            key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, tuple(rules or ()), gpu)
        except OSError:
            key = None
        with self._lock:
            if key is not None and key in self._kept:
                self._kept[key] = self._kept.pop(key)  # now the most recently used
                return self._kept[key][0]
        with self._in_flight:
            try:
                done = diagnose_target(target, rules=rules, gpu=gpu)
            except MemoryError:
                # What is kept makes room for what is asked now, and it is read once more.
                with self._lock:
                    if not self._kept:
                        raise
                    self._kept.clear()
                gc.collect()
                done = diagnose_target(target, rules=rules, gpu=gpu)
        if key is not None:
            self._keep(key, done)
        return done

    def _keep(self, key: tuple, done: Diagnosed) -> None:
        size = diagnosis_bytes(done)
        if size > self.budget_bytes:  # larger than the whole budget: read again when asked again
            return
        with self._lock:
            while self._kept and sum(kept for _, kept in self._kept.values()) + size > self.budget_bytes:
                self._kept.pop(next(iter(self._kept)))  # the least recently used
            self._kept[key] = (done, size)


# Objects a size estimate visits at most: a diagnosis holds a few thousand besides its
# frames, which count in bulk.
_MOST_OBJECTS = 1_000_000


def diagnosis_bytes(done: Diagnosed) -> int:
    """About how much memory a kept diagnosis holds: everything it reaches (the report, the
    session, the step model with its graph and frames, the tables), each object once; pandas
    counts its frames, strings included, numpy its arrays. Against what keeping one more
    diagnosis made the process's RSS grow by (three kept, after one made and dropped): 0.93x
    of it for the ResNet-50 trace (28.5 MB), more than it for smaller ones, whose frames
    share the session cache's categories."""
    import numpy as np
    import pandas as pd

    seen: set[int] = set()
    size, waiting = 0, [done]
    while waiting and len(seen) < _MOST_OBJECTS:
        value = waiting.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, (pd.DataFrame, pd.Series, pd.Index)):
            used = value.memory_usage(deep=True)
            size += int(used.sum()) if hasattr(used, "sum") else int(used)
        elif isinstance(value, np.ndarray):
            size += value.nbytes
        elif isinstance(value, (str, bytes, int, float, bool, type(None))):
            size += sys.getsizeof(value)
        elif isinstance(value, dict):
            size += sys.getsizeof(value)
            waiting.extend(value.keys())
            waiting.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            size += sys.getsizeof(value)
            waiting.extend(value)
        elif not (isinstance(value, (type, types.ModuleType)) or callable(value)):  # code is shared, not held
            size += sys.getsizeof(value)
            if hasattr(value, "__dict__"):
                waiting.append(vars(value))
            waiting.extend(getattr(value, name) for name in getattr(type(value), "__slots__", ())
                           if isinstance(name, str) and hasattr(value, name))
    return size


def shown_safely(text: str) -> str:
    """A tool's text with the control characters of names from traces escaped (advisor.units):
    an agent's client may show it in a terminal."""
    from advisor.units import shown_safely as safe

    return safe(text)


def safe_strings(value: Any) -> Any:
    from advisor.units import safe_strings as safe

    return safe(value)


def summary_text(report: Any) -> str:
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


def build_server(*, keep_bytes: int | None = None) -> Any:
    """The MCP server with advisor's tools (not yet running); ``keep_bytes``: the memory its
    kept diagnoses may hold (default: ADVISOR_MCP_KEEP_MB, else 1024 MB)."""
    return _build(keep_bytes)[0]


def _build(keep_bytes: int | None) -> tuple[Any, Any]:
    """The server, and the runs of `advisor verify` it has going (ended when it is stopped)."""
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
    kept = _Diagnoses(keep_bytes if keep_bytes is not None else _keep_bytes_from_environment())
    runs = Runs()
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=reads)
    def diagnose(target: str, rules: list[str] | None = None,
                 gpu: str | None = None) -> Annotated[CallToolResult, Report]:
        """Diagnose a profile: a trace file (.json / .json.gz), a saved session folder or a folder of
        rank traces. Returns the ranked findings with savings (ms per step, a range), evidence and the
        report's notes as the JSON report, its summary tables left out (the text names them; the
        summary tool pages through one). rules: paths of rule packs of your own; gpu: judge against
        this GPU (A100, h100-sxm, ...). Runs no code: a script is refused (verify runs one)."""
        def diagnosed() -> Any:
            done = kept.get(target, rules, gpu)
            text = (summary_text(done.report) + "".join(f"\nadvisor: {line}" for line in done.said)
                    + f"\nTables (page through one with summary): {', '.join(done.report.tables)}")
            return CallToolResult(content=[TextContent(type="text", text=shown_safely(text))],
                                  structured_content=_without_tables(done.report))

        return _errors_as_tool_errors(diagnosed)

    @server.tool(annotations=reads)
    def summary(target: str, table: str, sort: str | None = None, descending: bool = True, offset: int = 0,
                limit: int = PAGE_ROWS) -> dict[str, Any]:
        """One summary table of a profile (as `advisor summary`), a page of rows at a time: offset and
        limit (at most 500) page through it, next_offset is null on the last page; sort by a column.
        Tables: the names `diagnose` lists under tables (model, operator, kernel, step_timing, ...)."""
        return _errors_as_tool_errors(
            lambda: safe_strings(_page(kept.get(target, None, None), table, sort, descending, offset, limit)))

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
    async def verify(script: str, args: list[str] | None = None, budget_s: float = 300.0, max_fixes: int = 3,
                     timeout_s: float | None = None) -> Annotated[CallToolResult, Report]:
        """RUNS THE USER'S SCRIPT, several times: `advisor verify SCRIPT ARGS`, on this machine, as the
        server's user. Diagnoses the training script (one run), then applies each finding's fix that
        advisor can apply from outside the script and measures it (runs with and without the fix,
        alternately, in what is left of budget_s seconds, at most 3600, after the diagnosis). Whatever
        the script does (files, checkpoints, downloads) happens on every run. ``script`` must be an
        existing file. The whole call runs for at most timeout_s seconds (default: budget_s plus 600 s,
        for a diagnosis that runs the script past the budget; at most 4200): then advisor verify is
        asked to stop (it reports what it measured, given 30 s).
        Cancelling the call, or closing the connection, ends the script and every process it started.
        Returns the JSON report, each finding with its verification (measured saving, inside the
        predicted range?) or why not."""
        try:
            report, stopped = await run_verify(script, args or [], budget_s, max_fixes, timeout_s, runs)
        except Exception as exc:  # noqa: BLE001  (a cancelled call is not an Exception: it goes on up)
            raise _tool_error(exc) from None
        return CallToolResult(content=[TextContent(type="text", text=shown_safely(_verified_text(report, stopped)))],
                              structured_content=json.loads(report.model_dump_json()))

    return server, runs


def _verified_text(report: Any, stopped: str) -> str:
    """The summary, each finding's verification or why not; first, where verify ran out of
    time, that it was stopped."""
    text = summary_text(report) if not stopped else f"{stopped}; what it measured by then:\n{summary_text(report)}"
    for finding in report.findings:
        v = finding.verification
        if v is not None:
            text += (f"\n{finding.rule}: verified, {v.applied} saved {v.measured_saving_ms_per_step:.3g} ms/step "
                     f"measured ({'inside' if v.inside_range else 'outside'} the predicted range"
                     f"{'' if v.clear_of_noise else ', not clear of the noise'})")
        elif finding.not_verified is not None:
            text += f"\n{finding.rule}: not verified: {finding.not_verified.reason}"
    return text


def _keep_bytes_from_environment() -> int:
    from advisor.errors import UsageError

    value = os.environ.get("ADVISOR_MCP_KEEP_MB", "").strip()
    if not value:
        return KEEP_MB << 20
    try:
        megabytes = float(value)
    except ValueError:
        megabytes = -1.0
    if not 0 <= megabytes < 1 << 30:
        raise UsageError(f"ADVISOR_MCP_KEEP_MB={value!r}: give the megabytes of diagnoses the server may keep "
                         "(0 keeps none)")
    return int(megabytes * (1 << 20))


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
        if done.model is None:
            raise UsageError(f"{target} is a job: compare jobs with `advisor compare` on the command line")
        sides.append((done.model, done.tables, list(done.report.findings)))
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


def serve() -> None:
    """Run the server on stdio until the client closes it. Stopped by SIGTERM, SIGHUP or
    Ctrl-C, it first ends the runs of `advisor verify` it has going, then ends as the
    signal says."""
    import anyio

    server, runs = _build(None)

    async def until_stopped() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(end_runs_on_signal, runs)
            await server.run_stdio_async()
            group.cancel_scope.cancel()

    anyio.run(until_stopped)
