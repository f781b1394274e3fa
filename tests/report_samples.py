"""A small GPU session built by hand, for the HTML, timeline and comparison tests.

Three steps of 100 ms: data loading, then a forward op (aten::mm, shapes and dtypes
recorded so the cost model prices it) launching a kernel, backward and an optimizer step.
The kernel's name carries markup and script (``NASTY``): every report must show it as text.
Relations (step, phase, launch, parent op) come from advisor's own attribution stage, as
for an imported trace.
"""

from __future__ import annotations

import pandas as pd

from advisor.diagnosis import report_steps
from advisor.findings import Evidence, Finding, Saving, Severity
from advisor.reports import build_report
from advisor.rules import run_rules
from advisor.session import CollectorInfo, DeviceInfo, Session, SessionMeta
from advisor.session.attribute import attribute
from advisor.step import build_step_model
from advisor.tables import TABLE_DOCS, compute_tables

MS = 1_000_000
NASTY = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">k<float>&amp;'
OTHER_KERNEL = "volta_sgemm_128x64_nn"


def sample_session(*, loader_ms: float = 40.0, gpu: bool = True, steps: int = 3) -> Session:
    """The session described above; ``loader_ms`` is the data loading per step."""
    rows: list[dict] = []
    correlation = 0

    def add(name, kind, start_ms, end_ms, **fields):
        rows.append({"name": name, "kind": kind, "start_ns": round(start_ms * MS), "end_ns": round(end_ms * MS),
                     "pid": 100, "tid": 100, **fields})

    for i in range(steps):
        t = 1_000.0 + i * (loader_ms + 60.0)
        add(f"ProfilerStep#{i + 1}", "annotation", t, t + loader_ms + 60.0)
        add("advisor::Dataloader", "annotation", t, t + loader_ms)
        f0 = t + loader_ms
        add("advisor::Forward", "annotation", f0, f0 + 20)
        add("aten::mm", "op", f0 + 1, f0 + 19, input_dims="[[512,1024],[1024,2048]]",
            input_types='["float","float"]', external_id=10 + i)
        for j, (kernel, length) in enumerate(((NASTY, 12.0), (OTHER_KERNEL, 3.0))):
            correlation += 1
            add("cudaLaunchKernel", "runtime", f0 + 2 + j, f0 + 2.5 + j, correlation=correlation,
                external_id=10 + i)
            if gpu:
                start = f0 + 3 + j * 13
                add(kernel, "kernel", start, start + length, pid=0, tid=7, device=0, stream=7,
                    correlation=correlation, external_id=10 + i, grid="[128,1,1]", block="[256,1,1]")
        add("advisor::Backward", "annotation", f0 + 20, f0 + 50)
        add("aten::add_", "op", f0 + 21, f0 + 49)
        add("advisor::Optimization", "annotation", f0 + 50, f0 + 60)
        add("aten::zero_", "op", f0 + 51, f0 + 59)
    events = attribute(pd.DataFrame(rows))
    devices = [DeviceInfo(id=-1, kind="cpu", name="x86_64")]
    if gpu:
        devices.append(DeviceInfo(id=0, kind="gpu", name="NVIDIA A100-SXM4-40GB", compute_capability="8.0",
                                  sm_count=108, total_memory_bytes=40 * 1024**3))
    meta = SessionMeta(
        source="sample <b>trace</b>.json",
        source_format="kineto",
        created="2024-01-01T00:00:00+00:00",
        collector=CollectorInfo(name="kineto-import", gpu_measured=gpu,
                                notes=[] if gpu else ["GPU not measured: the trace holds no GPU activity."]),
        devices=devices,
    )
    return Session(meta, events)


def nasty_finding(session: Session) -> Finding:
    """A finding that cites the kernel with the nasty name: its table rows and its first launch."""
    ev = session.events
    kernel = int(ev.loc[ev["name"] == NASTY, "id"].min()) if (ev["name"] == NASTY).any() else 0
    return Finding(
        rule="sample-rule",
        title="A <b>kernel</b> named with markup runs long",
        severity=Severity.medium,
        confidence=0.7,
        saving=Saving(ms_per_step=4.0, share_of_step=0.04, basis="made up for the test"),
        message=f"{NASTY} takes most of the GPU time.",
        recommendation="Escape <everything>.",
        evidence=[
            Evidence(kind="table_row", table="kernel", row=NASTY, column="gpu_total_ns", value=36 * MS),
            Evidence(kind="table_row", table="model", row="Backward", column="cpu_total_ns", value=90 * MS),
            Evidence(kind="table_row", table="operator_kernels", row=f"aten::mm -> {NASTY}", column="calls"),
            Evidence(kind="event", event_id=kernel, name=NASTY, note="the first launch"),
        ],
    )


def sample_parts(**kwargs):
    """(session, tables, findings): the built-in rules' findings plus :func:`nasty_finding`."""
    session = sample_session(**kwargs)
    tables = compute_tables(session)
    findings = run_rules(session, tables).findings
    return session, tables, [*findings, nasty_finding(session)]


def sample_report(**kwargs):
    session, tables, findings = sample_parts(**kwargs)
    return build_report(session, tables, findings, table_docs=TABLE_DOCS,
                        steps=report_steps(build_step_model(session)))
