"""From a script run to a Session: the events the collectors recorded, and how the run went
(command, exit code, how it ended) and what was not measured."""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.collect.script import ScriptRun, run_script
from advisor.errors import TraceError
from advisor.session import CollectorInfo, DeviceInfo, Session, SessionMeta, empty_events


@dataclass
class CollectedRun:
    session: Session
    exit_code: int
    run: ScriptRun


def _host_device(notes: list[str] | None = None) -> DeviceInfo:
    """This machine's CPU, with its peaks where `advisor calibrate` has measured them (the
    CPU roofline needs them; the session keeps them so a saved session is judged alike)."""
    from advisor.calibrate import load_calibration  # noqa: PLC0415
    from advisor.errors import AdvisorError  # noqa: PLC0415

    name = platform.processor() or platform.machine() or "host CPU"
    device = DeviceInfo(id=-1, kind="cpu", name=f"{name} ({os.cpu_count()} logical cores)",
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


def _gpu_not_measured(reason: str | None) -> str:
    from advisor.collect.cupti import not_measured_line  # noqa: PLC0415

    return not_measured_line(reason or "no GPU collector ran")


def collect_script(script: Path, args: list[str], *, keep_trace: Path | None = None, gpu: bool = True,
                   steps: Any = "default") -> CollectedRun:
    """Run ``script`` under the collectors and return its Session and exit code.

    Whatever the script did (raised, exited, was interrupted), the events collected up to
    then are in the Session; a trace that cannot be read is said in the notes, not raised,
    so the script's own outcome is never hidden behind advisor's.
    """
    run = run_script(script, args, save_trace_to=keep_trace, gpu=gpu, steps=steps)
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

    if capture is not None:
        events = capture.events
        collector = capture.collector.model_copy(update={"notes": [*capture.collector.notes, *notes]})
        devices = [_host_device(), *capture.devices]
        base_time_ns = capture.base_time_ns
    else:
        events = session.events if session is not None else empty_events()
        collector = CollectorInfo(
            name="host",
            version=f"torch {run.torch_version}" if run.torch_version else "",
            activities=["cpu"] if run.trace_path is not None else [],
            gpu_measured=False,
            notes=[*notes, _gpu_not_measured(run.gpu_not_measured)],
        )
        devices = [_host_device(collector.notes)]
        base_time_ns = session.meta.base_time_ns if session is not None else 0
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
