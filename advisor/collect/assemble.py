"""From a script run to a Session: the events the collectors recorded, the host samples
(CPU use, RSS) taken while it ran, and how the run went (command, exit code, how it ended)
and what was not measured."""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from advisor.collect.sampler import DEFAULT_INTERVAL_S, HostSamples
from advisor.collect.script import ScriptRun, run_script
from advisor.errors import TraceError
from advisor.session import (
    CollectorInfo,
    DeviceInfo,
    Session,
    SessionMeta,
    empty_events,
    insert_unrelated,
)


@dataclass
class CollectedRun:
    session: Session
    exit_code: int
    run: ScriptRun


def _host_device(notes: list[str] | None = None) -> DeviceInfo:
    """This machine's CPU, with its peaks where `advisor calibrate` has measured them (the
    CPU roofline needs them; the session keeps them so a saved session is judged alike)."""
    from advisor.errors import AdvisorError  # noqa: PLC0415
    from advisor.knowledge.calibrate import load_calibration  # noqa: PLC0415

    name = platform.processor() or platform.machine() or "host CPU"
    device = DeviceInfo(id=-1, kind="cpu", name=f"{name} ({os.cpu_count()} logical cores)",
                        total_memory_bytes=_host_memory_bytes(),
                        properties={"platform": platform.platform(), "logical_cores": os.cpu_count()})
    try:
        calibration = load_calibration()
    except AdvisorError as exc:
        calibration = None
        if notes is not None:
            notes.append(f"the calibration file could not be read ({exc})")
    measured = calibration.device("cpu") if calibration is not None else None
    if measured is not None and measured.matmul_flops:
        device.peak_flops = dict(measured.matmul_flops)
        if measured.memory_bandwidth:
            device.memory_bandwidth_gbps = measured.memory_bandwidth / 1e9
    elif notes is not None:
        notes.append("no CPU roofline: `advisor calibrate` has not measured this machine's peaks")
    return device


def _host_memory_bytes() -> int | None:
    try:
        import psutil  # noqa: PLC0415

        return int(psutil.virtual_memory().total)
    except Exception:
        return None


def _with_samples(events: pd.DataFrame, samples: HostSamples | None, base_time_ns: int,
                  notes: list[str]) -> pd.DataFrame:
    """The events with the host samples added as rows of kind ``sample``, on the events'
    clock (both are realtime ns; see advisor.collect.sampler). Samples and events were
    both recorded around the script's run, so their spans overlap for the most part (the
    profiler's own start and stop lie outside the samples, a trace with few events inside
    them); samples that do not are on another clock and are left out, said in ``notes``:
    a sample placed wrongly would charge CPU use to the wrong steps."""
    if samples is None or not len(samples):
        return events
    frame = samples.events(base_time_ns)
    if len(events):
        lo, hi = int(events["start_ns"].min()), int(events["end_ns"].max())
        s_lo, s_hi = int(frame["start_ns"].min()), int(frame["end_ns"].max())
        shared = min(hi, s_hi) - max(lo, s_lo)
        if shared <= 0 or shared < 0.5 * min(hi - lo, s_hi - s_lo):
            notes.append("the host samples do not line up with the profile's clock and were left out: "
                         "CPU use and RSS were not measured")
            return events
    return insert_unrelated(events, frame)


def _gpu_not_measured(reason: str | None) -> str:
    from advisor.collect.cupti import not_measured_line  # noqa: PLC0415

    return not_measured_line(reason or "no GPU collector ran")


def collect_script(script: Path, args: list[str], *, keep_trace: Path | None = None, gpu: bool = True,
                   steps: Any = "default", sample_interval_s: float | None = DEFAULT_INTERVAL_S) -> CollectedRun:
    """Run ``script`` under the collectors and return its Session and exit code.

    Whatever the script did (raised, exited, was interrupted), the events collected up to
    then are in the Session; a trace that cannot be read is said in the notes, not raised,
    so the script's own outcome is never hidden behind advisor's.
    """
    run = run_script(script, args, save_trace_to=keep_trace, gpu=gpu, steps=steps,
                     sample_interval_s=sample_interval_s)
    notes = list(run.notes)
    capture = run.gpu_capture
    session = None
    if capture is None and run.trace_path is not None:
        try:
            from advisor.importers import load_kineto  # noqa: PLC0415

            session = load_kineto(run.trace_path)
        except TraceError as exc:
            notes.append(f"the host profile could not be read back ({exc})")
        finally:
            if keep_trace is None:
                shutil.rmtree(run.trace_path.parent, ignore_errors=True)

    trace_metadata: dict[str, Any] = dict(session.meta.trace_metadata) if session is not None else {}
    trace_metadata.pop("traceName", None)  # the temporary file it names is gone
    facts = trace_metadata.get("advisor") or dict(run.host_facts)
    if run.batch_size is not None:
        trace_metadata["batch_size"] = run.batch_size
    trace_metadata.update({"advisor": facts, "wall_time_s": run.wall_time_s,
                           "step_source": run.step_source, "ending": run.ending})
    if run.host_samples is not None:
        trace_metadata["host_sampler"] = run.host_samples.summary()

    if capture is not None:
        base_time_ns = capture.base_time_ns
        events = _with_samples(capture.events, run.host_samples, base_time_ns, notes)
        collector = capture.collector.model_copy(update={"notes": [*capture.collector.notes, *notes]})
        devices = [_host_device(), *capture.devices]
    else:
        if session is not None:
            base_time_ns = session.meta.base_time_ns
        elif run.host_samples is not None and len(run.host_samples):
            base_time_ns = int(run.host_samples.time_ns[0])  # samples alone: time from the first read
        else:
            base_time_ns = 0
        events = _with_samples(session.events if session is not None else empty_events(), run.host_samples,
                               base_time_ns, notes)
        collector = CollectorInfo(
            name="host",
            version=f"torch {run.torch_version}" if run.torch_version else "",
            activities=["cpu"] if run.trace_path is not None else [],
            gpu_measured=False,
            notes=[*notes, _gpu_not_measured(run.gpu_not_measured)],
        )
        devices = [_host_device(collector.notes)]
    meta = SessionMeta(
        source=str(script),
        source_format="script",
        command=run.command,
        exit_code=run.exit_code,
        script_error=run.script_error,
        collector=collector,
        devices=devices,
        base_time_ns=base_time_ns,
        trace_metadata=trace_metadata,
    )
    return CollectedRun(session=Session(meta, events), exit_code=run.exit_code, run=run)
