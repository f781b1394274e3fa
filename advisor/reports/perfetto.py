"""`advisor timeline`: the session as a Chrome trace (Perfetto, chrome://tracing), with the
findings marked on it.

Every event of the session becomes a complete event (``"ph": "X"``) under the category
Kineto uses for its kind, on its process and thread (GPU work: the device as the process,
the stream as the thread), with the arguments Kineto writes (correlation, External id,
shapes, grid, bytes...), so the file reads back into advisor like the trace it came from.
Timestamps are microseconds from the session's first event with three decimals, written
as exact decimal text: a 400 ns kernel stays 0.400 us long, and ``baseTimeNanoseconds``
says where zero is on the session's clock.

Host samples (kind ``sample``) become counter events (``"ph": "C"``) on their process:
the process's CPU use in cores, the machine's CPU use in percent and the process's RSS,
each holding from the sample's start to the next; the importer reads no counter events,
so they too stay out of a re-read profile.

Findings are added for people looking at the timeline: each finding is a span over the
window on a track of its own in an "advisor findings" process, with its saving, message,
recommendation and evidence in the span's arguments; each trace event a finding cites as
evidence carries the finding in its arguments and gets an instant event ("ph": "i") at
its start. The phases advisor inferred (Dataloader, Forward, Backward, Optimization) are
drawn on a track of their own. Both use categories advisor's importer passes over, so
they never come back as events of the profile.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from advisor.errors import UsageError
from advisor.findings import Finding
from advisor.session import Session, text
from advisor.units import format_saving

__all__ = ["FINDING_CATEGORY", "PHASE_CATEGORY", "SAMPLE_CATEGORY", "flatten_findings", "timeline_events", "write_timeline"]

# Kineto's category for each event kind (today's spelling).
KIND_CATEGORY = {
    "op": "cpu_op",
    "python": "python_function",
    "annotation": "user_annotation",
    "gpu_annotation": "gpu_user_annotation",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "sync": "cuda_sync",
    "step": "user_annotation",
    "phase": "user_annotation",  # phases advisor's collector recorded; inferred ones go apart
}
GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
# Categories of what advisor adds; its importer knows none of them, so it skips them.
FINDING_CATEGORY = "advisor_finding"
PHASE_CATEGORY = "advisor_phase"
SAMPLE_CATEGORY = "advisor_sampler"
INFERRED = "advisor-inferred"
PROGRESS_EVERY = 20_000

Progress = Callable[[int, int], None]


def flatten_findings(findings: list[Finding], prefix: str = "") -> list[tuple[str, Finding]]:
    """Findings with their labels as the reports number them (1, 1.1, 2...), causes
    before the symptoms they explain."""
    out = []
    for i, finding in enumerate(findings, 1):
        label = f"{prefix}{i}"
        out.append((label, finding))
        out.extend(flatten_findings(finding.explains, f"{label}."))
    return out


def _us(ns: int) -> str:
    """Non-negative integer ns as exact microseconds text with three decimals."""
    whole, frac = divmod(int(ns), 1000)
    return f"{whole}.{frac:03d}"


def _finding_line(label: str, finding: Finding) -> str:
    return f"{label}. [{finding.severity.value.upper()}] {finding.title} (saves {format_saving(finding.saving)})"


def _evidence_text(finding: Finding) -> list[str]:
    """Evidence in words, as the text reports write it."""
    from advisor.reports._common import evidence_segments

    return ["".join(t for t, _ in evidence_segments(ev)) for ev in finding.evidence]


def _json_list(value: str) -> Any:
    """A JSON-text column value (shapes, grid) back as data; '' as None."""
    if not value:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


class _Columns:
    """The session's event columns as plain arrays, decoded once."""

    def __init__(self, session: Session):
        ev = session.events
        self.n = len(ev)
        for column in ("name", "kind", "category", "phase", "input_dims", "input_types", "input_strides",
                       "concrete_inputs", "call_stack", "grid", "block"):
            setattr(self, column, text(ev[column]))
        for column in ("start_ns", "end_ns", "pid", "tid", "device", "stream", "correlation", "external_id",
                       "bytes", "registers", "shared_memory", "step"):
            setattr(self, column, ev[column].to_numpy())
        self.flops = ev["flops"].to_numpy()
        self.value = ev["value"].to_numpy()
        self.system_value = ev["system_value"].to_numpy()


def _tracks(c: _Columns) -> tuple[np.ndarray, np.ndarray]:
    """pid and tid per event: GPU work on (device, stream), host events where recorded."""
    is_gpu = np.isin(c.kind, GPU_KINDS)
    pid = np.where(is_gpu & (c.pid < 0), c.device, c.pid)
    tid = np.where(is_gpu & (c.stream >= 0), c.stream, c.tid)
    return pid.astype(np.int64), tid.astype(np.int64)


def _args(c: _Columns, i: int, kind: str) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if c.correlation[i] >= 0:
        args["correlation"] = int(c.correlation[i])
    if c.external_id[i] >= 0:
        args["External id"] = int(c.external_id[i])
    if kind in GPU_KINDS:
        if c.device[i] >= 0:
            args["device"] = int(c.device[i])
        if c.stream[i] >= 0:
            args["stream"] = int(c.stream[i])
        if c.bytes[i] >= 0:
            args["bytes"] = int(c.bytes[i])
        for column, key in (("grid", "grid"), ("block", "block")):
            value = _json_list(getattr(c, column)[i])
            if value is not None:
                args[key] = value
        if c.registers[i] >= 0:
            args["registers per thread"] = int(c.registers[i])
        if c.shared_memory[i] >= 0:
            args["shared memory"] = int(c.shared_memory[i])
    if kind == "op":
        for column, key in (("input_dims", "Input Dims"), ("input_types", "Input type"),
                            ("input_strides", "Input Strides"), ("concrete_inputs", "Concrete Inputs")):
            value = _json_list(getattr(c, column)[i])
            if value is not None:
                args[key] = value
        if not np.isnan(c.flops[i]):
            args["flops"] = float(c.flops[i])
    if c.call_stack[i]:
        args["Call stack"] = c.call_stack[i]
    if c.step[i] >= 0 and kind not in ("step",):
        args["advisor step"] = int(c.step[i])
    if c.phase[i] and kind not in ("phase",):
        args["advisor phase"] = c.phase[i]
    return args


def _event(ph: str, name: str, cat: str, pid: int, tid: int, ts: str, dur: str | None = None,
           args: dict[str, Any] | None = None, extra: str = "") -> str:
    parts = [f'"ph":"{ph}"', f'"name":{json.dumps(name)}', f'"cat":{json.dumps(cat)}',
             f'"pid":{pid}', f'"tid":{tid}', f'"ts":{ts}']
    if dur is not None:
        parts.append(f'"dur":{dur}')
    if extra:
        parts.append(extra)
    if args:
        parts.append(f'"args":{json.dumps(args, default=str)}')
    return "{" + ",".join(parts) + "}"


def _counters(c: _Columns, i: int, pid: int, ts: str) -> list[str]:
    """A host sample as counter events: what it measured, from its start on."""
    out = []
    for name, value in (("process CPU (cores)", c.value[i]), ("system CPU (%)", c.system_value[i] * 100)):
        if np.isfinite(value):
            out.append(_event("C", name, SAMPLE_CATEGORY, pid, 0, ts, args={"value": round(float(value), 4)}))
    if c.bytes[i] >= 0:
        out.append(_event("C", "process RSS (bytes)", SAMPLE_CATEGORY, pid, 0, ts, args={"value": int(c.bytes[i])}))
    return out


def _metadata(kind: str, pid: int, tid: int, args: Any) -> str:
    return json.dumps({"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args})


def timeline_events(session: Session, findings: list[Finding], *,
                    progress: Progress | None = None) -> tuple[list[str], dict[str, Any]]:
    """The trace's events, each as JSON text, and its top-level metadata."""
    c = _Columns(session)
    pid, tid = _tracks(c)
    base = int(c.start_ns.min()) if c.n else 0
    lo, hi = session.window()
    labelled = flatten_findings(findings)

    # What each cited event is cited by.
    cited: dict[int, list[tuple[str, Finding, str]]] = {}
    for label, finding in labelled:
        for ev in finding.evidence:
            if ev.kind == "event" and ev.event_id is not None and 0 <= ev.event_id < c.n:
                cited.setdefault(int(ev.event_id), []).append((label, finding, ev.note))

    inferred = (c.kind == "phase") & (c.category == INFERRED)
    used_pids = set(pid.tolist())
    advisor_pid = max(used_pids | {0}) + 1
    phase_tid = 1 << 20  # a thread id no recorded thread uses, for the inferred phases
    out: list[str] = []
    for i in range(c.n):
        kind = c.kind[i]
        start, end = int(c.start_ns[i]), int(c.end_ns[i])
        name = c.name[i]
        if kind == "sample":
            out.extend(_counters(c, i, int(pid[i]), _us(start - base)))
            continue
        if kind == "phase" and inferred[i]:
            out.append(_event("X", name, PHASE_CATEGORY, int(pid[i]), phase_tid, _us(start - base),
                              _us(max(end - start, 0)), {"advisor step": int(c.step[i])}))
            continue
        # Steps and recorded phases under the names advisor's importer knows them by.
        if kind == "step" and not name.startswith("ProfilerStep#"):
            name = f"ProfilerStep#{int(c.step[i])}"
        if kind == "phase" and not name.startswith("advisor::"):
            name = f"advisor::{c.phase[i] or name}"
        category = KIND_CATEGORY.get(kind) or c.category[i] or kind or "other"
        args = _args(c, i, kind)
        for label, finding, note in cited.get(i, ()):
            args.setdefault("advisor findings", []).append(_finding_line(label, finding) + (f": {note}" if note else ""))
        out.append(_event("X", name, category, int(pid[i]), int(tid[i]), _us(start - base),
                          _us(max(end - start, 0)), args))
        if progress is not None and (i + 1) % PROGRESS_EVERY == 0:
            progress(i + 1, c.n)
    if progress is not None:
        progress(c.n, c.n)

    # Findings: a span per finding over the window, and a mark on each event it cites.
    for n, (label, finding) in enumerate(labelled, 1):
        details = {
            "rule": finding.rule,
            "severity": finding.severity.value,
            "saving": format_saving(finding.saving),
            "confidence": finding.confidence,
            "message": finding.message,
            "recommendation": finding.recommendation,
            "evidence": _evidence_text(finding),
        }
        out.append(_event("X", _finding_line(label, finding), FINDING_CATEGORY, advisor_pid, n,
                          _us(max(lo - base, 0)), _us(max(hi - lo, 0)), details))
        out.append(_metadata("thread_name", advisor_pid, n, {"name": f"finding {label}: {finding.rule}"}))
        out.append(_metadata("thread_sort_index", advisor_pid, n, {"sort_index": n}))
    for event_id, marks in sorted(cited.items()):
        for label, finding, note in marks:
            out.append(_event("i", f"advisor {label}: {finding.title}", FINDING_CATEGORY, int(pid[event_id]),
                              int(tid[event_id]), _us(int(c.start_ns[event_id]) - base),
                              args={"finding": _finding_line(label, finding), "rule": finding.rule,
                                    "note": note, "event": c.name[event_id]}, extra='"s":"t"'))
    out.extend(_names(session, pid, tid, c, advisor_pid, phase_tid, inferred, bool(labelled)))

    meta = session.meta
    top: dict[str, Any] = {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": int(meta.base_time_ns) + base,
        "deviceProperties": [
            d.properties or {"id": d.id, "name": d.name} for d in meta.devices if d.kind == "gpu"
        ],
        "advisor": {
            "source": meta.source,
            "note": "Timestamps are microseconds from the session's first event; the 'advisor findings' "
                    "process holds the findings, and events a finding cites carry it in their args.",
            "findings": [_finding_line(label, f) for label, f in labelled],
        },
    }
    if meta.distributed is not None and meta.distributed.raw:
        top["distributedInfo"] = meta.distributed.raw
    return out, top


def _names(session: Session, pid: np.ndarray, tid: np.ndarray, c: _Columns, advisor_pid: int, phase_tid: int,
           inferred: np.ndarray, has_findings: bool) -> Iterator[str]:
    """Process and thread names ("M" events): the source's own where it recorded them."""
    recorded = session.meta.trace_metadata.get("process_names") or {}
    named: set[tuple[str, int, int]] = set()
    pids = set(pid.tolist())
    for key, value in recorded.items():
        kind, _, rest = str(key).partition(":")
        p, _, t = rest.partition(":")
        try:
            p_i, t_i = int(p), int(t)
        except ValueError:
            continue
        if p_i in pids:
            named.add((kind, p_i, t_i if kind.startswith("thread") else 0))
            yield _metadata(kind, p_i, t_i, value if isinstance(value, dict) else {"name": value})
    is_gpu = np.isin(c.kind, GPU_KINDS)
    devices = {d.id: d.name for d in session.meta.devices if d.kind == "gpu"}
    gpu_pids = set(pid[is_gpu].tolist())
    for p in sorted(pids):
        if ("process_name", p, 0) not in named:
            label = f"GPU {p}" + (f" ({devices[p]})" if devices.get(p) else "") if p in gpu_pids else f"host (pid {p})"
            yield _metadata("process_name", p, 0, {"name": label})
        # Host processes first, then the GPUs in order.
        yield _metadata("process_sort_index", p, 0, {"sort_index": 100 + p if p in gpu_pids else 0})
    for p, t in sorted(set(zip(pid[is_gpu].tolist(), tid[is_gpu].tolist()))):
        if ("thread_name", p, t) not in named:
            yield _metadata("thread_name", p, t, {"name": f"stream {t}"})
    for p in sorted(set(pid[inferred].tolist())):
        yield _metadata("thread_name", p, phase_tid, {"name": "advisor: phases (inferred)"})
        yield _metadata("thread_sort_index", p, phase_tid, {"sort_index": -1})
    if has_findings:
        yield _metadata("process_name", advisor_pid, 0, {"name": "advisor findings"})
        yield _metadata("process_sort_index", advisor_pid, 0, {"sort_index": -1})


def write_timeline(session: Session, findings: list[Finding], path: str | Path, *,
                   progress: Progress | None = None) -> Path:
    """Write the trace to ``path`` (gzipped where it ends in .gz); returns the path."""
    out = Path(path)
    events, top = timeline_events(session, findings, progress=progress)
    head = json.dumps(top)[:-1]  # the metadata object, left open for traceEvents
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        raw = out.open("wb")
    except OSError as exc:
        raise UsageError(f"cannot write the timeline to {out}: {exc.strerror or exc}") from None
    with raw:
        stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) \
            if out.name.endswith(".gz") else raw  # type: ignore[assignment]
        try:
            stream.write(head.encode("utf-8"))
            stream.write(b', "traceEvents": [\n')
            for i in range(0, len(events), 10_000):
                chunk = ",\n".join(events[i:i + 10_000])
                stream.write(("" if i == 0 else ",\n").encode("utf-8") + chunk.encode("utf-8"))
            stream.write(b"\n]}\n")
        finally:
            if stream is not raw:
                stream.close()
    return out
