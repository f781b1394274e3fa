"""Builders the tests share: sessions row by row, trace files, synthetic traces.

``Trace`` builds a Session with known answers (times in ms); ``write_trace`` writes a
Kineto document of hand-made events; ``synth_trace`` a large synthetic training loop
(benchmarks/synth.py). Paths to the real traces and the fixtures are in conftest.py.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pandas as pd

from advisor.session import GPU_KINDS, CollectorInfo, DeviceInfo, Session, SessionMeta, conform_events

REPO = Path(__file__).resolve().parents[1]

MS = 1_000_000
GPU_PID = 0


class Trace:
    """Builds a session row by row with the relation columns filled the way the
    attribution stage fills them: ops nest through ``parent``; host rows take their step
    and phase from time; GPU rows take theirs from the call that launched them."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, name, kind, start_ms, end_ms, **fields) -> int:
        row = {"name": name, "kind": kind, "start_ns": round(start_ms * MS), "end_ns": round(end_ms * MS),
               "pid": 1, "tid": 1}
        row.update(fields)
        self.rows.append(row)
        return len(self.rows) - 1

    def step(self, number, start_ms, end_ms):
        return self.add(f"ProfilerStep#{number}", "step", start_ms, end_ms, step=number)

    def phase(self, name, start_ms, end_ms, **fields):
        return self.add(name, "phase", start_ms, end_ms, phase=name, **fields)

    def op(self, name, start_ms, end_ms, parent=None, **fields):
        i = self.add(name, "op", start_ms, end_ms, **fields)
        self._nest(i, parent)
        return i

    def call(self, name, start_ms, end_ms, parent=None, **fields):
        i = self.add(name, "runtime", start_ms, end_ms, **fields)
        self._nest(i, parent)
        return i

    def gpu(self, name, kind, start_ms, end_ms, launch=None, **fields):
        fields = {"device": 0, "stream": 7, "pid": GPU_PID, "tid": 7, **fields}
        i = self.add(name, kind, start_ms, end_ms, **fields)
        if launch is not None:
            src = self.rows[launch]
            self.rows[i].update(launch=launch, parent_op=src.get("parent_op", -1), top_op=src.get("top_op", -1))
        return i

    def _nest(self, i, parent):
        row = self.rows[i]
        if parent is None:
            row["parent_op"] = -1
            row["top_op"] = i if row["kind"] == "op" else -1
        else:
            row["parent_op"] = parent
            row["top_op"] = self.rows[parent]["top_op"]

    def session(self, *, gpu_measured=True, distributed=None, **metadata) -> Session:
        rows = [dict(r) for r in self.rows]
        steps = [r for r in rows if r["kind"] == "step"]
        phases = [r for r in rows if r["kind"] == "phase"]
        for r in rows:
            host = r["kind"] not in GPU_KINDS
            if host and "step" not in r:
                r["step"] = next((s["step"] for s in steps if s["start_ns"] <= r["start_ns"] < s["end_ns"]), -1)
            if host and "phase" not in r and r["step"] >= 0:
                r["phase"] = next((p["phase"] for p in phases if p["start_ns"] <= r["start_ns"] < p["end_ns"]), "Others")
        for r in rows:
            if r["kind"] in GPU_KINDS and r.get("launch", -1) >= 0:
                r.setdefault("step", rows[r["launch"]]["step"])
                r.setdefault("phase", rows[r["launch"]].get("phase", ""))
        devices = [DeviceInfo(id=-1, kind="cpu", name="test CPU")]
        if gpu_measured:
            devices.append(DeviceInfo(id=0, kind="gpu", name="Test GPU", sm_count=108, compute_capability="8.0"))
        meta = SessionMeta(
            source="test",
            source_format="test",
            collector=CollectorInfo(
                name="test", gpu_measured=gpu_measured,
                notes=[] if gpu_measured else ["no CUDA device on this machine"],
            ),
            devices=devices,
            distributed=distributed,
            trace_metadata=metadata,
        )
        frame = pd.DataFrame(rows) if rows else pd.DataFrame({"name": []})
        return Session(meta, conform_events(frame))


def write_trace(path: Path, events: list[dict], **top) -> Path:
    document = {"schemaVersion": 1, **top, "traceEvents": events}
    data = json.dumps(document).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def synth_trace(path: Path, events: int) -> Path:
    """A synthetic training-loop trace of about ``events`` events (benchmarks/synth.py):
    steps, a loader, ops that launch kernels, flow events."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("synth", REPO / "benchmarks" / "synth.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(path, events)
    return path


def one_line(done: subprocess.CompletedProcess) -> str:
    """The run failed with one advisor line on stderr and no traceback: that line."""
    assert done.returncode != 0, done.stdout[-500:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advisor"), done.stderr
    return lines[0]
