"""From a script run to a Session: the events the collectors recorded, the host samples
(CPU use, RSS) and Python stack samples taken while it ran, every step's time, how the
run went (command, exit code, how it ended) and what was not measured (the gaps)."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advisor.collect.cores import probe_threads, usable_cores
from advisor.collect.sampler import DEFAULT_INTERVAL_S, HostSamples
from advisor.collect.script import DEFAULT_EVENT_BUDGET, ENOUGH, INTERRUPT, HeldInterrupts, ScriptRun, run_script
from advisor.collect.stacks import DEFAULT_INTERVAL_S as STACK_INTERVAL_S
from advisor.collect.stacks import StackSamples
from advisor.collect.steps import StepWindow
from advisor.errors import TraceError
from advisor.session import (
    RELATION_COLUMNS,
    CollectionGap,
    CollectorInfo,
    DeviceInfo,
    Session,
    SessionMeta,
    TimedStep,
    concat_events,
    empty_events,
    insert_unrelated,
    one_of,
    text,
)
from advisor.session.attribute import main_thread
from advisor.session.busy import busy_share


@dataclass
class CollectedRun:
    session: Session
    exit_code: int
    run: ScriptRun


def _threads(torch) -> dict[str, Any]:
    """torch's operator threads as the script left them, and where they outnumber the
    cores the job may use, a probe of parallel work at that count against the cores' count
    (advisor.collect.cores.probe_threads)."""
    try:
        threads = int(torch.get_num_threads())
        interop = int(torch.get_num_interop_threads())
    except Exception:  # noqa: BLE001  (torch's own state, read after the script: a figure lost, not the run)
        return {}
    said: dict[str, Any] = {"torch_threads": threads, "interop_threads": interop}
    cores = max(int(usable_cores() or os.cpu_count() or 1), 1)
    if threads > cores:
        probed = probe_threads(torch, threads, cores)
        if probed:
            said["threads_probe"] = {"threads": threads, "cores": cores, **probed}
    return said


def host_device(notes: list[str] | None = None) -> DeviceInfo:
    """This machine's CPU: its dtype-relevant flags, and its peaks where `advisor calibrate`
    measured them on this machine and they are plausible (the CPU roofline needs them; the
    session keeps them so a saved session is judged alike). Where the peaks come from, or
    why they are not used, is one of the notes."""
    from advisor.errors import AdvisorError  # noqa: PLC0415
    from advisor.knowledge.calibrate import calibration_path, load_calibration  # noqa: PLC0415
    from advisor.knowledge.cpu import (  # noqa: PLC0415
        cpu_features,
        judge_calibration,
        probe_autocast,
        probe_bf16_ratio,
        this_processor,
    )

    name = platform.processor() or platform.machine() or "host CPU"
    features = cpu_features()
    device = DeviceInfo(id=-1, kind="cpu", name=f"{name} ({os.cpu_count()} logical cores)",
                        total_memory_bytes=_host_memory_bytes(),
                        properties={"platform": platform.platform(), "logical_cores": os.cpu_count(),
                                    "usable_cores": usable_cores(), "cpu_features": features.as_dict()})
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "bfloat16"):  # the script used torch: how bf16 fares on this CPU
        ratio = probe_bf16_ratio(torch)
        if ratio is not None:
            device.properties["bf16_vs_fp32"] = ratio
            autocast = probe_autocast(torch) if ratio > 1 else None
            if autocast is not None:
                device.properties.update(autocast)
    if torch is not None and hasattr(torch, "get_num_threads"):
        device.properties.update(_threads(torch))
    try:
        calibration = load_calibration()
    except AdvisorError as exc:
        calibration = None
        if notes is not None:
            notes.append(f"the calibration file could not be read ({exc})")
    measured = calibration.device("cpu") if calibration is not None else None
    if measured is not None and measured.matmul_flops:
        verdict = judge_calibration(calibration_path(), calibration.machine, measured.measured,
                                    dict(measured.matmul_flops), features=features,
                                    cores=usable_cores() or os.cpu_count() or 1, processor=this_processor(),
                                    torch_version=measured.torch_version,
                                    this_torch=str(getattr(torch, "__version__", "")) if torch is not None else "")
        if notes is not None:
            notes.append(verdict.said)
        device.properties["calibration"] = {"used": verdict.use, "said": verdict.said}
        if verdict.use:
            device.peak_flops = dict(measured.matmul_flops)
            if measured.memory_bandwidth:
                device.memory_bandwidth_gbps = measured.memory_bandwidth / 1e9
    elif notes is not None:
        notes.append("no CPU roofline: `advisor calibrate` had not measured this machine's peaks when this was "
                     "recorded")
    return device


def _with_handoff(facts: dict[str, Any], say: Callable[[str], None] | None) -> dict[str, Any]:
    """``facts`` with the worker hand-over of the loader read the most that made its batches
    in the main process timed on this machine (advisor.collect.handoff), in its entry's
    ``handoff``: what moving its loading into workers would cost each batch."""
    torch = sys.modules.get("torch")
    loaders = [entry for entry in facts.get("loaders") or [] if isinstance(entry, dict)]
    main = [entry for entry in loaders if not entry.get("num_workers") and entry.get("batch_tensors")
            and int(entry.get("reads") or 0) >= 2]
    if torch is None or not main:
        return facts
    from advisor.collect.handoff import probe_handoff  # noqa: PLC0415

    chosen = max(main, key=lambda entry: float(entry.get("read_ns") or 0))
    if say is not None:
        say("timing a DataLoader worker's hand-over of one batch on this machine")
    timed = {**chosen, "handoff": probe_handoff(torch, chosen["batch_tensors"])}
    return {**facts, "loaders": [timed if entry is chosen else entry for entry in loaders]}


def _with_retimed_ops(facts: dict[str, Any], session: Session | None, say: Callable[[str], None] | None,
                      *, gpu: bool) -> dict[str, Any]:
    """``facts`` with the main thread's operators timed again at one thread
    (``retimed_ops``, advisor.collect.retime) where the machine was busy while the run was
    recorded: what the step model weighs the recorded mix with. And where the job left
    autograd's anomaly detection on (its backward's NaN checks show): what its Forward
    calls' stack capture costs, which the stack samples catch only in part."""
    torch = sys.modules.get("torch")
    if torch is None or session is None or gpu:
        return facts  # a GPU's operators are not the host's to time again
    busy = busy_share({"advisor": facts}) is not None
    ev = session.events
    anomaly = bool(torch.is_anomaly_enabled()) or bool(one_of(ev["name"], ("aten::_is_any_true",)).any())
    thread = main_thread(ev)
    if thread is None or not (busy or anomaly):
        return facts
    mine = (ev["kind"].to_numpy() == "op") & (ev["pid"].to_numpy() == thread[0]) & (ev["tid"].to_numpy() == thread[1])
    if not mine.any():
        return facts
    from advisor.collect.retime import retime_ops  # noqa: PLC0415

    if say is not None:
        say("the machine is busy: timing the job's operators again at one thread" if busy
            else "anomaly detection is on: timing the job's operators again with and without autograd")
    try:
        retimed = retime_ops(torch, ev[mine])
    except Exception:  # noqa: BLE001 - the run's own figures stand without it: the recorded mix
        return facts
    return {**facts, "retimed_ops": {**retimed, "cores": usable_cores()}}


def _with_autograd_cost(facts: dict[str, Any]) -> dict[str, Any]:
    """``facts`` with what one autograd node costs a forward on this CPU
    (``autograd_node_ns``, advisor.knowledge.cpu.probe_autograd_node), where the script ran
    forwards with grad on and never a backward: the cost of scoring with autograd on."""
    torch = sys.modules.get("torch")
    steps = [row for row in facts.get("step_times") or [] if isinstance(row, dict)]
    if torch is None or not steps:
        return facts
    graded = any(int((row.get("calls") or {}).get("Forward", 0) or 0) > 0 for row in steps)
    backward = any(float((row.get("phases") or {}).get("Backward", 0) or 0) > 0 for row in steps)
    if not graded or backward:
        return facts
    from advisor.knowledge.cpu import probe_autograd_node  # noqa: PLC0415

    cost = probe_autograd_node(torch)
    return facts if cost is None else {**facts, "autograd_node_ns": cost}


def _recording_stop_note(facts: dict[str, Any]) -> str:
    """What stopping torch.profiler at the window's end cost the script (its processing of
    what it recorded, between two steps: in no step's time), where a tenth of a second or
    so; "" otherwise."""
    recording = facts.get("recording") if isinstance(facts.get("recording"), dict) else {}
    stop_s = recording.get("stop_s")
    if not isinstance(stop_s, (int, float)) or isinstance(stop_s, bool) or stop_s < 0.05:
        return ""
    return (f"stopping the recording at the window's end took the script {stop_s:.2g} s (torch.profiler processing "
            "what it recorded), between two steps: in no step's time, and not the job's")


def _busy_machine(wait: dict[str, Any], threads: int | None = None, retimed: dict[str, Any] | None = None) -> str:
    """A note where the script's main thread waited for a core enough of its run to call the
    machine busy (advisor.session.busy). Where torch ran its operators on several threads,
    it says which way the recorded shares lean: a team of operator threads waits at each
    operator's end for its slowest member to get a core, so other processes slow the
    operators many times more than plain Python (at four runnable threads a core, tens of
    times against four or five), and the recorded mix understates the Python work; and
    where the operators were timed again at one thread (``retimed``,
    advisor.collect.retime), that the step model weighs the step as on a quiet machine."""
    share = busy_share({"advisor": {"cpu_wait": wait}})
    if share is None:
        return ""
    said = (f"the machine was busy: the script's main thread waited for a CPU core {share:.0%} of the time "
            "it ran, other processes holding the cores; its timings are slower than on a quiet machine, so "
            "savings are given as shares of the step, their milliseconds this run's (advice is sized from the "
            "cores the job may use, not from that load)")
    if threads is None or threads <= 1:
        return said
    said += (f". torch's operators ran on {threads} threads, which the load slows far more than plain Python "
             "(each operator waits for its slowest thread to get a core)")
    kinds = len(retimed.get("ops") or []) if isinstance(retimed, dict) else 0
    if kinds:
        return said + (f": {kinds} kinds of operator call ({float(retimed.get('covered_share') or 0):.0%} of the "
                       "operators' recorded time) were timed again at one thread after the run, and the step's "
                       "parts are weighed as on a quiet machine (Python by the share its thread ran), so a saving "
                       "is a share of the quiet step; `advisor verify` measures a fix")
    return said + (": the shares of Python work (a loader's items, loops over samples, autograd's bookkeeping) are "
                   "likely smaller here than on a quiet machine; `advisor verify` measures a fix, or diagnose again "
                   "when the machine is quiet")


def _operator_threads() -> int | None:
    """torch's operator threads as the script left them (None: torch not used, or unreadable)."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # noqa: BLE001  (torch's own state, read after the script: a figure lost, not the run)
        return None


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


def gpu_not_measured(reason: str | None) -> str:
    from advisor.collect.cupti import not_measured_line  # noqa: PLC0415

    return not_measured_line(reason or "no GPU collector ran")


def collect_script(script: Path, args: list[str], *, keep_trace: Path | None = None, gpu: bool = True,
                   steps: Any = "default", sample_interval_s: float | None = DEFAULT_INTERVAL_S,
                   stack_interval_s: float | None = STACK_INTERVAL_S, event_budget: int | None = DEFAULT_EVENT_BUDGET,
                   with_stack: bool = False, say: Callable[[str], None] | None = None,
                   call: Callable[[], Any] | None = None, spawned_ranks: type | None = None,
                   held: HeldInterrupts | None = None, run_to_end: bool = False,
                   stop_seconds: float | None = None) -> CollectedRun:
    """Run ``script`` under the collectors and return its Session and exit code.

    Whatever the script did (raised, exited, was interrupted), the events collected up to
    then are in the Session; a trace that cannot be read is said in the notes and the
    gaps, not raised, so the script's own outcome is never hidden behind advisor's. A
    Ctrl-C after the script ended is held until the profile is read back, then raised as
    InterruptedAfterScript, which carries the run for the caller to keep; a caller that
    passes ``held`` holds it longer (until it has put the profile somewhere safe) and
    releases it itself. ``run_to_end``: run the script whole (by default it is stopped once
    the window and enough steps after it are in, advisor.collect.steps.StopAfter; after at
    most ``stop_seconds`` of them where given).
    """
    own = held is None
    held = HeldInterrupts() if held is None else held
    try:
        collected = _collect(script, args, held, keep_trace=keep_trace, gpu=gpu, steps=steps,
                             sample_interval_s=sample_interval_s, stack_interval_s=stack_interval_s,
                             event_budget=event_budget, with_stack=with_stack, say=say, call=call,
                             spawned_ranks=spawned_ranks, run_to_end=run_to_end, stop_seconds=stop_seconds)
    finally:
        if own:
            held.release()
    if own and held.came:
        raise InterruptedAfterScript(collected)
    return collected


class InterruptedAfterScript(KeyboardInterrupt):
    """Ctrl-C after the script ended, while its profile was read back: held until the
    profile was whole, then raised with it (``collected``), for the caller to keep."""

    def __init__(self, collected: CollectedRun) -> None:
        super().__init__()
        self.collected = collected


def _collect(script: Path, args: list[str], held: HeldInterrupts, *, keep_trace, gpu, steps, sample_interval_s,
             stack_interval_s, event_budget, with_stack, say, call, spawned_ranks, run_to_end,
             stop_seconds) -> CollectedRun:
    run = run_script(script, args, save_trace_to=keep_trace, gpu=gpu, steps=steps, with_stack=with_stack,
                     sample_interval_s=sample_interval_s, stack_interval_s=stack_interval_s,
                     event_budget=event_budget, say=say, call=call, spawned_ranks=spawned_ranks,
                     hold_interrupts=held, run_to_end=run_to_end, stop_seconds=stop_seconds)
    notes = list(run.notes)
    gaps = list(run.gaps)
    capture = run.gpu_capture
    session = None
    try:
        if capture is None and run.trace_parts:
            if say is not None:
                size = sum(p.stat().st_size for p in run.trace_parts if p.exists())
                say(f"reading the profile ({size / 2**20:.1f} MiB)")
            try:
                session = _read_parts(run.trace_parts)
            except TraceError as exc:
                notes.append(f"the host profile could not be read back ({exc})")
                gaps.append(CollectionGap(what="host profile", why=f"the trace torch wrote could not be read back "
                                                                   f"({exc})"))
    finally:
        if run.work_dir is not None:
            shutil.rmtree(run.work_dir, ignore_errors=True)

    trace_metadata: dict[str, Any] = dict(session.meta.trace_metadata) if session is not None else {}
    trace_metadata.pop("traceName", None)  # the temporary file it names is gone
    # The run's own facts are complete; the trace's copy was written when recording
    # stopped, which with a window is before the run ended.
    facts = dict(run.host_facts) or trace_metadata.get("advisor") or {}
    if run.ending != INTERRUPT:  # a user who stopped the run waits for nothing more
        facts = _with_handoff(facts, say)
        facts = _with_autograd_cost(facts)
        facts = _with_retimed_ops(facts, session if capture is None else None, say, gpu=run.gpu_available)
    if run.batch_size is not None:
        trace_metadata["batch_size"] = run.batch_size
    trace_metadata.update({"advisor": facts, "wall_time_s": run.wall_time_s,
                           "step_source": run.step_source, "ending": run.ending})
    if run.host_samples is not None:
        trace_metadata["host_sampler"] = run.host_samples.summary()
    stopped = _recording_stop_note(facts)
    if stopped:
        notes.append(stopped)
    if run.ending == ENOUGH:
        notes.append(f"{run.error}: the window and the steps timed after it are what the diagnosis needs "
                     "(`advisor diagnose --run-to-end` runs the script whole; work that comes less often than "
                     "those steps, or after them, is not seen)")
    busy = _busy_machine(facts.get("cpu_wait") or {}, _operator_threads(), facts.get("retimed_ops"))
    if busy:
        notes.append(busy)
    compiled = compile_note(facts.get("compiles") or [], capture.events if capture is not None
                            else session.events if session is not None else empty_events())
    if compiled:
        notes.append(compiled)

    if capture is not None:
        base_time_ns = capture.base_time_ns
        events = capture.events
        devices = [host_device(), *capture.devices]
    else:
        if session is not None:
            base_time_ns = session.meta.base_time_ns
        elif run.host_samples is not None and len(run.host_samples):
            base_time_ns = int(run.host_samples.time_ns[0])  # samples alone: time from the first read
        else:
            base_time_ns = 0
        events = session.events if session is not None else empty_events()
        devices = None
    events = _with_samples(events, run.host_samples, base_time_ns, notes)
    events = insert_unrelated(events, stack_events(run.stacks, base_time_ns, facts.get("step_times") or []))
    if run.stacks:
        trace_metadata["stack_sampler"] = {"interval_ns": run.stacks[0].interval_ns,
                                           "samples": {f"{s.role} {s.pid}": len(s) for s in run.stacks},
                                           "dropped": sum(s.dropped for s in run.stacks)}
    timed = [TimedStep(step=r["step"], start_ns=r["start_ns"] - base_time_ns, duration_ns=r["duration_ns"],
                       recorded=r["recorded"], partial=r["partial"], phases=r["phases"], own_ns=r.get("own_ns", 0),
                       cpu_ns=r.get("cpu_ns", 0), calls=r.get("calls") or {},
                       process_cpu_ns=r.get("process_cpu_ns", 0))
             for r in facts.get("step_times") or []]
    # The step times are kept once, as meta.timed_steps: a second copy in the metadata would
    # double the saved session of a loop that runs thousands of steps.
    trace_metadata["advisor"] = {k: v for k, v in facts.items() if k != "step_times"}
    pace = unrecorded_pace_note(timed)
    if pace:
        notes.append(pace)
    gaps += window_gaps(run.window, facts, timed, recorder="the CUPTI collector" if capture is not None
                        else "torch.profiler")
    gaps += child_gaps(facts.get("children") or [])
    if capture is None and run.gpu_available:
        gaps.append(CollectionGap(what="GPU", why=gpu_not_measured(run.gpu_not_measured)))

    if capture is not None:
        collector = capture.collector.model_copy(update={"notes": [*capture.collector.notes, *notes],
                                                         "gaps": [*capture.collector.gaps, *gaps]})
    else:
        collector = CollectorInfo(
            name="host",
            version=f"torch {run.torch_version}" if run.torch_version else "",
            activities=["cpu"] if run.trace_parts else [],
            gpu_measured=False,
            notes=[*notes, gpu_not_measured(run.gpu_not_measured)],
            gaps=gaps,
        )
        devices = [host_device(collector.notes)]
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
        timed_steps=timed,
    )
    return CollectedRun(session=Session(meta, events), exit_code=run.exit_code, run=run)


# Steps run after the window without the profiler that give the job's own pace: fewer and
# the profiler's cost cannot be told from the steps' own spread.
PACE_STEPS = 3


def unrecorded_pace_note(timed: list[TimedStep]) -> str | None:
    """A line where fewer than PACE_STEPS complete steps ran after the recorded ones (the
    first after the window, which pays for stopping the profiler, not counted): the
    diagnosis then knows the job's own pace from few steps, or from none."""
    recorded = [t.step for t in timed if t.recorded]
    if not recorded:
        return None
    after = [t for t in timed if t.step > max(recorded) + 1 and not t.partial and not t.recorded]
    if len(after) >= PACE_STEPS:
        return None
    if not after:
        return (f"no step ran without the profiler after the recorded ones (the first after them pays for "
                f"stopping it; {PACE_STEPS} give the job's own pace): figures in ms are at the recorded pace, the "
                "profiler's cost included; run a few more steps than --steps records")
    return (f"only {len(after)} step{'s' if len(after) > 1 else ''} ran without the profiler after the recorded "
            f"ones ({PACE_STEPS} give the job's own pace): the job's pace rests on few steps; run a few more steps "
            "than --steps records")


def compile_note(compiles: list[dict[str, Any]], events: pd.DataFrame) -> str | None:
    """One line on torch.compile in the run: which steps compiled and for how long, and
    which recorded steps ran compiled code (the ``Torch-Compiled Region`` ranges Dynamo
    opens around compiled frames). None where nothing compiled or ran compiled."""
    if len(events):
        names = pd.Series(text(events["name"]))
        regions = events.loc[names.str.startswith("Torch-Compiled Region").to_numpy()]
    else:
        regions = events
    ran = sorted({int(s) for s in regions["step"].to_numpy() if s >= 0}) if len(regions) else []
    if not compiles and not ran:
        return None
    parts = []
    if compiles:
        total_s = sum(c.get("duration_ns", 0) for c in compiles) / 1e9
        steps = sorted({c["step"] for c in compiles if c.get("step") is not None})
        before = sum(1 for c in compiles if c.get("step") is None)
        where = []
        if before:
            where.append(f"{before} before the first step")
        if steps:
            where.append(f"in step{'s' if len(steps) > 1 else ''} {', '.join(str(n) for n in steps)}")
        parts.append(f"torch.compile compiled {len(compiles)} time{'s' if len(compiles) > 1 else ''} "
                     f"({total_s:.2f} s in all; {'; '.join(where)}): a one-off cost, not a cost of every step")
    if ran:
        parts.append(f"compiled code ran in recorded step{'s' if len(ran) > 1 else ''} "
                     f"{', '.join(str(n) for n in ran)}")
    return "; ".join(parts)


def _read_parts(paths: list[Path]) -> Session:
    """The Session of a run's trace, or of the parts of a whole-run recording joined: each
    part is read and attributed alone (parts end at step boundaries, where nothing is
    open), then their events are put on the first part's clock and stacked."""
    from advisor.importers import load_kineto  # noqa: PLC0415

    sessions = [load_kineto(path) for path in paths]
    if len(sessions) == 1:
        return sessions[0]
    first = sessions[0]
    frames = []
    offset = 0
    for part in sessions:
        frame = part.events.copy()
        shift = part.meta.base_time_ns - first.meta.base_time_ns
        frame["start_ns"] += shift
        frame["end_ns"] += shift
        for column in RELATION_COLUMNS:
            ids = frame[column].to_numpy(copy=True)
            ids[ids >= 0] += offset
            frame[column] = ids
        offset += len(frame)
        frames.append(frame)
    # The last part was written last: its copy of the collector's facts is the fullest.
    metadata = {**first.meta.trace_metadata, **sessions[-1].meta.trace_metadata}
    meta = first.meta.model_copy(update={"trace_metadata": metadata})
    return Session(meta, concat_events(frames))


def stack_events(stacks: list[StackSamples], base_time_ns: int, step_times: list[dict[str, Any]]) -> pd.DataFrame:
    """The stack samples as events of kind ``stack`` on the session's clock: each covers
    the time it stands for, up to the moment it was taken. The main thread's carry the
    step and phase it was in; a worker's get the step whose time they fall in."""
    frames = []
    starts = np.asarray([r["start_ns"] for r in step_times], dtype=np.int64)
    ends = starts + np.asarray([r["duration_ns"] for r in step_times], dtype=np.int64)
    numbers = np.asarray([r["step"] for r in step_times], dtype=np.int64)
    order = np.argsort(starts)
    starts, ends, numbers = starts[order], ends[order], numbers[order]
    for samples in stacks:
        if not len(samples):
            continue
        taken = np.asarray(samples.time_ns, dtype=np.int64)
        weight = np.asarray(samples.weight_ns, dtype=np.int64)
        stack_text = np.asarray(samples.stacks, dtype=object)[np.asarray(samples.stack_id, dtype=np.int64)]
        if samples.role == "main":
            step = np.asarray(samples.step, dtype=np.int64)
            phase = np.asarray(samples.phase, dtype=object)
        else:
            where = np.searchsorted(starts, taken, side="right") - 1
            inside = (where >= 0) & (taken < ends[np.clip(where, 0, None)]) if len(starts) else np.zeros(len(taken), bool)
            step = np.where(inside, numbers[np.clip(where, 0, None)] if len(starts) else -1, -1)
            phase = np.full(len(taken), "", dtype=object)
        frames.append(pd.DataFrame({
            "name": "python stack",
            "kind": "stack",
            "category": samples.role,
            "start_ns": taken - weight - base_time_ns,
            "end_ns": taken - base_time_ns,
            "pid": samples.pid,
            "tid": samples.tid,
            "step": step,
            "phase": phase,
            "call_stack": stack_text,
        }))
    if not frames:
        return empty_events()
    return concat_events(frames)


def window_gaps(window: StepWindow | None, facts: dict[str, Any], timed: list[TimedStep],
                *, recorder: str) -> list[CollectionGap]:
    """What the window asked for and did not get: no step recorded at all (incomplete), a
    window the run ended inside (said, not a gap in the collection), recording stopped by
    the event budget (incomplete)."""
    gaps: list[CollectionGap] = []
    recording = facts.get("recording") or {}
    recorded = sorted(t.step for t in timed if t.recorded)
    ran = max((t.step for t in timed), default=-1) + 1
    if window is not None:
        if not recorded:
            why = (f"the script ran {ran} step{'s' if ran != 1 else ''}, and {recorder} records "
                   f"{window.describe()}: nothing was recorded")
            if ran:
                why += f" (--steps {max(ran - 1, 0)}: or --steps all records the run you have)"
            else:
                why += " (no training step was found: --steps all records the whole run)"
            gaps.append(CollectionGap(what="steps", why=why))
        elif window.stop is not None and recorded[-1] < window.stop - 1:
            gaps.append(CollectionGap(what="steps", incomplete=False,
                                      why=f"{window.describe()} were asked for; the run ended after step "
                                          f"{ran - 1}, so steps {recorded[0]}-{recorded[-1]} were recorded"))
    stopped = recording.get("stopped") or ""
    if "budget" in stopped:
        gaps.append(CollectionGap(what="steps", why=f"recording stopped early: {stopped}"))
    return gaps


def child_gaps(children: list[dict[str, Any]]) -> list[CollectionGap]:
    """Processes the script started that ran without the collector (DataLoader workers
    aside): their work is missing from the profile."""
    gaps = []
    for child in children:
        count = child.get("count", 1)
        launcher = child.get("launcher") or "multiprocessing"
        how = f"{launcher}({child.get('target')})" if launcher != "multiprocessing" else \
            f"multiprocessing.Process(target={child.get('target')})"
        gaps.append(CollectionGap(
            what="child processes",
            why=(f"{count} process{'es' if count != 1 else ''} started by {how} ran without advisor's collector: "
                 f"the work done there is not in this profile (profile inside each process with advisor.Profiler, "
                 f"or run one process under advisor diagnose)")))
    return gaps
