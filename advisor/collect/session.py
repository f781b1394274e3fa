"""From a script run to a Session: load the trace the host collector exported and record
how the run went (command, exit code, how it ended) and what was not measured."""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from advisor.collect.script import ScriptRun, run_script
from advisor.errors import TraceError
from advisor.session import CollectorInfo, DeviceInfo, Session, SessionMeta, empty_events

GPU_NOT_MEASURED = (
    "the host-side collector ran (torch.profiler, CPU activities only); on a machine with an "
    "NVIDIA GPU, pip install 'advisor[cuda]' collects kernels and copies as well."
)


@dataclass
class CollectedRun:
    session: Session
    exit_code: int
    run: ScriptRun


def _host_device() -> DeviceInfo:
    name = platform.processor() or platform.machine() or "host CPU"
    return DeviceInfo(id=-1, kind="cpu", name=f"{name} ({os.cpu_count()} logical cores)",
                      properties={"platform": platform.platform(), "logical_cores": os.cpu_count()})


def collect_script(script: Path, args: list[str], *, keep_trace: Path | None = None) -> CollectedRun:
    """Run ``script`` under the host collector and return its Session and exit code.

    Whatever the script did (raised, exited, was interrupted), the events collected up to
    then are in the Session; a trace that cannot be read is said in the notes, not raised,
    so the script's own outcome is never hidden behind advisor's.
    """
    run = run_script(script, args, save_trace_to=keep_trace)
    notes = list(run.notes)
    session = None
    if run.trace_path is not None:
        try:
            from advisor.importers import load_kineto

            session = load_kineto(run.trace_path)
        except TraceError as exc:
            notes.append(f"the host profile could not be read back ({exc})")
        finally:
            if keep_trace is None:
                shutil.rmtree(run.trace_path.parent, ignore_errors=True)
    events = session.events if session is not None else empty_events()
    trace_metadata = dict(session.meta.trace_metadata) if session is not None else {}
    facts = trace_metadata.get("advisor") or {}
    trace_metadata.pop("traceName", None)  # the temporary file it names is gone
    if run.batch_size is not None:
        trace_metadata["batch_size"] = run.batch_size
    notes.append(GPU_NOT_MEASURED)
    meta = SessionMeta(
        source=str(script),
        source_format="script",
        command=run.command,
        exit_code=run.exit_code,
        script_error=run.script_error,
        collector=CollectorInfo(
            name="host",
            version=f"torch {run.torch_version}" if run.torch_version else "",
            activities=["cpu"] if run.profiled else [],
            gpu_measured=False,
            notes=notes,
        ),
        devices=[_host_device()],
        base_time_ns=session.meta.base_time_ns if session is not None else 0,
        trace_metadata={**trace_metadata, "advisor": facts, "wall_time_s": run.wall_time_s,
                        "step_source": run.step_source, "ending": run.ending},
    )
    return CollectedRun(session=Session(meta, events), exit_code=run.exit_code, run=run)
