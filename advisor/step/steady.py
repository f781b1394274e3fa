"""The steady Session: the profile as the later stages judge it, in the window the step
model chose.

``steady_session(session, window)`` returns a Session whose steps are the steady ones and
whose window is the steady window (``Session.window()``):

- inferred steps become step rows (category ``advisor-inferred``), with phases inferred per
  step where the profile has none, and every event gets its step and phase again;
- steps set apart (start-up) stop being steps: their ranges stay as plain ranges
  (category ``advisor-set-apart``) and their events belong to no step, so no per-step
  figure counts them;
- what was set apart, and why, is said in the session's notes, which every report shows.

The events the window leaves out stay in the frame: the tables clip to the window.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import Session, insert_unrelated, one_of
from advisor.session.attribute import assign_steps_and_phases, infer_phases, main_thread
from advisor.step.window import SteadyWindow
from advisor.units import format_ns

__all__ = ["INFERRED", "RECORD_STEADY_STEPS", "SET_APART", "accumulation_notes", "headline_for", "notes_for",
           "set_apart_summary", "steady_session"]

RECORD_STEADY_STEPS = ("Record steady steps, several of them: with torch.profiler, a schedule that skips the warm-up "
                       "(torch.profiler.schedule(wait=5, warmup=2, active=5)) and prof.step() each iteration; with a "
                       "serving engine, profile after its graphs are captured, over decode or prefill steps that "
                       "replay them; with advisor, `advisor diagnose train.py --steps 10:15`, past compilation.")

INFERRED = "advisor-inferred"
SET_APART = "advisor-set-apart"


def steady_session(session: Session, window: SteadyWindow) -> Session:
    """``session`` as the steady window sees it (see the module docstring)."""
    events = session.events
    if window.inferred and len(window.all_steps):
        events = _with_inferred_steps(events, window)
    apart = _set_apart_step_numbers(window)
    if len(apart):
        events = _without_steps(events, apart)
    notes = notes_for(window) + accumulation_notes(session)
    meta = session.meta
    if notes:
        collector = meta.collector
        meta = meta.model_copy(update={"collector": collector.model_copy(
            update={"notes": [*collector.notes, *(n for n in notes if n not in collector.notes)]})})
    # Derived from the session alone, so its tables can be kept in the session cache entry
    # of the trace it was read from (their key holds the metadata, whose notes say what was
    # set apart).
    return Session(meta, events, window=(window.start_ns, window.end_ns))


def _set_apart_step_numbers(window: SteadyWindow) -> np.ndarray:
    """The numbers of the steps found but not steady (start-up steps)."""
    if not len(window.all_steps):
        return np.zeros(0, dtype=np.int64)
    found = window.all_steps["step"].to_numpy(dtype=np.int64)
    kept = window.steps["step"].to_numpy(dtype=np.int64) if len(window.steps) else np.zeros(0, dtype=np.int64)
    return np.setdiff1d(found, kept)


def _with_inferred_steps(events: pd.DataFrame, window: SteadyWindow) -> pd.DataFrame:
    """The events with the inferred steps as step rows (and phases inferred per step where
    the profile has none), every event's step and phase assigned again."""
    main = main_thread(events)
    if main is None:
        return events
    steps = window.all_steps
    rows = pd.DataFrame({
        "name": [f"Step#{int(n)}" for n in steps["step"]], "kind": "step", "category": INFERRED,
        "start_ns": steps["start_ns"].to_numpy(), "end_ns": steps["end_ns"].to_numpy(),
        "pid": main[0], "tid": main[1], "step": steps["step"].to_numpy(),
    })
    out = insert_unrelated(events, rows)
    if not one_of(out["kind"], ("phase",)).any():
        light = out[["kind", "name", "pid", "tid", "start_ns", "end_ns", "step"]]
        phases = infer_phases(light, main)
        if len(phases):
            out = insert_unrelated(out, phases)
    out = out.copy(deep=False)  # copy-on-write: the reassigned columns are this frame's alone
    is_step = one_of(out["kind"], ("step",))
    out["step"] = np.where(is_step, out["step"].to_numpy(), -1)
    assign_steps_and_phases(out, main, host_spans=window.host_spans)
    return out


def _without_steps(events: pd.DataFrame, numbers: np.ndarray) -> pd.DataFrame:
    """The events with the given steps no longer steps: their ranges plain ranges, their
    events in no step and no phase."""
    out = events.copy(deep=False)  # copy-on-write: the changed columns are this frame's alone
    step = out["step"].to_numpy()
    theirs = np.isin(step, numbers)
    is_step = one_of(out["kind"], ("step",)) & theirs
    out["kind"] = _set(out["kind"], is_step, "annotation")
    out["category"] = _set(out["category"], is_step, SET_APART)
    out["phase"] = _set(out["phase"], theirs & ~one_of(out["kind"], ("phase",)), "")
    out["step"] = np.where(theirs, -1, step)
    return out


def _set(column: pd.Series, rows: np.ndarray, value: str) -> pd.Series:
    """A categorical column with ``value`` at ``rows`` (by code: no string per row)."""
    if value not in column.cat.categories:
        column = column.cat.add_categories([value])
    return column.mask(rows, value)


def notes_for(window: SteadyWindow) -> list[str]:
    """The report's lines on what the window is and what it set apart."""
    notes = []
    if window.inferred and len(window.steps):
        notes.append(f"The profile has no step ranges; {len(window.all_steps)} steps were inferred: {window.how}.")
    if window.source == "work span" and window.steady:
        notes.append("No steps were found: the window is the stretch of the profile where the work runs, "
                     f"{format_ns(window.duration_ns)}.")
    if window.set_apart:
        notes.append(set_apart_summary(window))
    for apart in window.set_apart:
        notes.append(f"Set apart from the window ({apart.kind}, {format_ns(apart.duration_ns)}): {apart.what}.")
    periodic = window.periodic
    if periodic is not None:
        notes.append(f"Every {periodic.every} steps a step runs {format_ns(periodic.extra_ns)} longer than the steady "
                     f"{format_ns(periodic.steady_ns)} (steps {', '.join(f'#{n}' for n in periodic.steps[:6])}"
                     f"{'...' if len(periodic.steps) > 6 else ''}, over {periodic.timed} {periodic.source}).")
    return notes


def set_apart_summary(window: SteadyWindow) -> str:
    """All that was set apart, in one line: its time (each nanosecond once) and its kinds,
    largest first. A cost seen once is in no per-step figure."""
    kinds: dict[str, int] = {}
    for span in window.set_apart:
        kinds[span.kind] = kinds.get(span.kind, 0) + span.duration_ns
    held = ", ".join(f"{kind} {format_ns(ns)}" for kind, ns in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return (f"Seen once and set apart, in no per-step figure: {format_ns(window.set_apart_ns)} ({held}); each "
            "below.")


def headline_for(window: SteadyWindow) -> str:
    """What a reader must know before any finding: the profile holds no steady state, or
    shows its work once (every saving is then per pass); "" where it shows steady steps
    recur. Said at the top of every format, never ranked among the findings."""
    if window.source == "empty":
        return ""
    if not window.steady:
        return (f"Not a steady state: {window.not_steady}. What it measures is the warm-up's, not the job's: the "
                f"rules that judge steady steps did not run. {RECORD_STEADY_STEPS}")
    if window.recurs:
        return ""
    if len(window.steps) == 1:
        shown = (f"one step (#{int(window.steps['step'].iat[0])}), the first the profiler saw, and nothing in it "
                 "shows the work recur")
    else:
        shown = ("no step, and nothing in it repeats as iterations do (a data loader's reads, optimizer steps, calls "
                 "of the model, a user range, graph replays, syncs, a recurring sequence of calls)")
    span = window.span_ns or window.duration_ns
    apart = (f" Of its {format_ns(span)}, {format_ns(window.set_apart_ns)} is set apart (see the notes)."
             if span and window.set_apart_ns >= 0.5 * span else "")
    return (f"One pass: this profile holds {shown}. Each saving below is per pass, as if the pass recurred; what it "
            "measures may be the first time the work ran (lazy initialisation, autotuning, compilation, caches "
            f"filling).{apart} {RECORD_STEADY_STEPS}")


def accumulation_notes(session: Session) -> list[str]:
    """The report's line where the optimizer steps once every N steps (gradient
    accumulation): a step here is one batch, where the script's own step (and its timer)
    may be the optimizer's, N of them. Said from the collector's clock: the steps whose
    phases opened the optimizer, at a regular gap of two or more over most of the run."""
    timed = [t for t in session.meta.timed_steps if not t.partial]
    stepped = np.array([t.step for t in timed if t.calls.get("Optimization", 0) > 0], dtype=np.int64)
    if len(stepped) < 3 or not len(timed):
        return []
    gaps = np.diff(stepped)
    values, counts = np.unique(gaps, return_counts=True)
    every = int(values[np.argmax(counts)])
    if every < 2 or counts.max() < 0.8 * len(gaps):
        return []
    return [f"The optimizer steps once every {every} steps (gradient accumulation): a step here is one batch, "
            f"its forward and backward, and an optimizer step {every} of them; figures per step are per batch, "
            "their shares of the step the same either way."]
