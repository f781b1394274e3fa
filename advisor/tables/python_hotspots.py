"""Python Hotspots: where the host's time goes in the user's own Python code.

Built from the stack sampler's samples (advisor.collect.stacks). The main thread's time
in each phase (Dataloader, Forward, Backward, Optimization, and Others outside them) comes
from the step clock, exactly; the samples taken in a phase share that time out among the
lines that ran in it, in proportion to the time each sample stands for. (Samples are not
spread evenly across phases: a thread inside torch ops releases the GIL and is sampled
more often than one running Python, so sample counts alone would overstate the model.)
A line's time includes what it calls (torch, the standard library): ``augment(image)``
owns the tensor ops it runs. Rows are per process role: the main thread, and the
DataLoader workers, whose sampled time runs beside the main thread's, not inside it.

A frame is the user's when its file lies outside the folders of installed code the
collector listed (the standard library, site-packages, torch, advisor); traces from other
profilers have no samples, so the table is empty for them.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from advisor.session import text
from advisor.step.facts import MODEL_PHASES, Facts, coded
from advisor.tables._registry import table, with_notes
from advisor.tables.step_timing import job_steps, timed_frame, times_of

MAX_ROWS = 200
STACK_FRAMES = 6  # user frames kept in the ``stack`` column, innermost last
_FRAME = re.compile(r"^\s*(?P<file>.+?)\((?P<line>-?\d+)\): (?P<function>.*)$")
# Where a thread waits rather than works: a queue, a lock, a pipe, a sleep, or a collective
# (torch.distributed's calls block in C++ until every rank has arrived: communication, not
# the host's own work).
_WAITING = re.compile(
    r"(^|/)(queues|connection|selectors|threading|synchronize)\.py\(\d+\): "
    r"(get|_poll|poll|wait|select|_recv|_recv_bytes|recv_bytes|acquire)$"
    r"|(^|/)torch/distributed/(distributed_c10d|c10d_logger)\.py\(\d+\): "
)
_FALLBACK_LIBRARY = re.compile(r"site-packages|dist-packages|(^|/)torch/|/lib/python\d|(^|/)advisor/")
NO_USER_FRAME = "(no frame of the user's code)"
# A comprehension's or generator expression's frame is part of the function around it.
COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")


def library_roots(f: Facts) -> tuple[str, ...]:
    """The folders of installed code the collector listed for this session."""
    facts = f.meta.trace_metadata.get("advisor") or {}
    return tuple(facts.get("library_roots") or ())


def is_library(path: str, roots: tuple[str, ...]) -> bool:
    if path.startswith("<") or not path:
        return True
    if roots:
        return path.startswith(roots)
    return bool(_FALLBACK_LIBRARY.search(path))


def stack_facts(stacks: np.ndarray, roots: tuple[str, ...]) -> pd.DataFrame:
    """Per distinct stack (innermost frame first): its innermost user frame (function,
    file, line), the user frames outermost first, whether its innermost frame of all is
    the user's own code, whether the user frame was called by the data loader (a Dataset,
    a collate function), and whether the thread was waiting (a queue, a lock, a pipe)."""
    # Distinct stacks share most of their frames (the loop, the interpreter's start): each
    # frame's text is parsed and judged once, not once per stack it is in.
    frames_seen: dict[str, _Frame | None] = {}

    def parsed(part: str) -> _Frame | None:
        try:
            return frames_seen[part]
        except KeyError:
            match = _FRAME.match(part)
            frame = None if match is None else _Frame(match["file"], match["line"], match["function"],
                                                      is_library(match["file"], roots))
            frames_seen[part] = frame
            return frame

    rows = []
    for stack in stacks:
        parts = str(stack).split(";")
        frames = [m for m in map(parsed, parts) if m is not None]
        user = [m for m in frames if not m.library]
        innermost = user[0] if user else None
        # Named by the function a comprehension's frame belongs to (a decode's row-by-row
        # list comprehension is the decode's work), at the comprehension's own line.
        enclosing = next((m for m in user if m.function not in COMPREHENSIONS), innermost)
        waiting = bool(frames) and bool(_WAITING.search(parts[0].strip()))
        # Whether the user frame was reached through torch.utils.data (a Dataset's
        # __getitem__, a collate function) rather than being the loop that reads the loader.
        below = frames[frames.index(innermost) + 1:] if innermost is not None else []
        in_loader = any("/torch/utils/data/" in m.file for m in below)
        rows.append({
            "in_loader": in_loader,
            "function": enclosing.function if enclosing else "",
            "file": innermost.file if innermost else "",
            "line": int(innermost.line) if innermost else -1,
            "own_code": bool(frames) and innermost is frames[0],
            "waiting": waiting,
            "user_stack": " > ".join(f"{m.function} ({m.file}:{m.line})" for m in reversed(user[:STACK_FRAMES])),
        })
    return pd.DataFrame(rows)


class _Frame(NamedTuple):
    """One frame of a sampled stack, as the sampler wrote it: ``file(line): function``."""

    file: str
    line: str
    function: str
    library: bool  # installed code, not the user's


def samples_in_steps(f: Facts) -> tuple[pd.DataFrame, int]:
    """The stack samples taken in the steps the tables speak of (the recorded steps and
    the unrecorded ones after them; not warm-up, not before or after the loop), and how
    many such steps there were."""

    def compute() -> tuple[pd.DataFrame, int]:
        events = f.events
        samples = events[(events["kind"] == "stack").to_numpy()]
        timed = timed_frame(f)
        if not len(samples) or not len(timed):
            return samples.iloc[:0], 0
        kept = samples[samples["step"].isin(timed["step"]).to_numpy()]
        return kept, len(timed)

    return f.memo("samples_in_steps", compute)


def phase_ns(f: Facts) -> dict[str, float]:
    """Mean time per step in each phase ('' for Others), from the step clock."""
    steps = job_steps(f)
    if not len(steps):
        return {}
    out = {phase: float(steps[phase].mean()) for phase in MODEL_PHASES}
    out[""] = float(steps["Others"].mean())
    return out


@table(
    "python_hotspots",
    title="Python Hotspots",
    description=(
        "Host time per line of the user's own Python code, from stack samples taken every few "
        "milliseconds over the profiled steps and the unrecorded steps after them: a line's "
        "time is that of the samples whose innermost user frame it is, so it includes the "
        "library code it calls. Main-thread rows carry the phase they ran in; loader-worker "
        "rows are DataLoader worker processes, whose time runs beside the main thread's. "
        "Empty for traces (no samples)."
    ),
    key="'<function> (<file>:<line>)', prefixed '[loader worker] ' for worker rows",
    columns={
        "role": "'main' (the script's thread) or 'loader worker'.",
        "function": "The innermost user function ('' where no frame was the user's).",
        "file": "Its file.",
        "line": "The line it was on.",
        "samples": "Samples that stopped here.",
        "per_step_ns": "Estimated time here per step, ns: main thread, its share of each phase's samples times "
                       "the phase's clock time per step; workers, their sampled time over the steps.",
        "share_of_step": "per_step_ns / the mean step time (unrecorded steps' where there are any).",
        "own_code_share": "Share of the samples whose innermost frame of all is this user line: time in the "
                          "user's Python itself rather than in a library it called.",
        "waiting_share": "Share of the samples where the thread waited (a queue, a lock, a pipe).",
        **{f"{phase.lower()}_ns": f"Per step, in the {phase} phase (main thread), ns." for phase in MODEL_PHASES},
        "other_ns": "Per step, outside every phase (main thread), ns.",
        "phase": "The phase most of the samples were in ('' for workers).",
        "stack": "The user's frames leading here, outermost first (the most common such path).",
        "calls": "The library function the line called in most of its time, dotted (copy.deepcopy); '' where "
                 "it ran its own code.",
    },
)
def python_hotspots_table(f: Facts) -> pd.DataFrame | None:
    samples, n_steps = samples_in_steps(f)
    if not len(samples) or not n_steps:
        return None
    codes, stacks = coded(samples["call_stack"])
    roots = library_roots(f)
    per_stack = stack_facts(stacks, roots)
    calls = np.array([library_call(s, roots) for s in stacks], dtype=object)
    weight = (samples["end_ns"] - samples["start_ns"]).to_numpy().astype(np.float64)
    role = text(samples["category"])
    phase = text(samples["phase"])
    facts = per_stack.iloc[codes].reset_index(drop=True)
    label = np.where(facts["function"].to_numpy() == "", NO_USER_FRAME,
                     facts["function"].astype(str) + " (" + facts["file"].astype(str) + ":" +
                     facts["line"].astype(str) + ")")
    key = np.where(role == "main", label, "[" + role.astype(object) + "] " + label.astype(object))
    # Per step, ns: a main-thread sample's share of its phase's sampled time times the
    # phase's clock time per step; a worker's own time over the steps.
    clock = phase_ns(f)
    main = role == "main"
    per_step = weight / n_steps
    for name, total in clock.items():
        mine = main & (phase == name)
        sampled = weight[mine].sum()
        if sampled > 0:
            per_step[mine] = weight[mine] / sampled * total
    frame = pd.DataFrame({
        "key": key, "role": role, "function": facts["function"], "file": facts["file"], "line": facts["line"],
        "weight": weight, "time": per_step, "own": facts["own_code"].to_numpy() * per_step,
        "waiting": facts["waiting"].to_numpy() * per_step, "phase": phase, "stack": facts["user_stack"],
        "calls": calls[codes],
    })
    for name in MODEL_PHASES:
        frame[f"{name.lower()}_ns"] = np.where(main & (phase == name), per_step, 0.0)
    frame["other_ns"] = np.where(main & (phase == ""), per_step, 0.0)
    grouped = frame.groupby("key", sort=False)
    out = grouped.agg(role=("role", "first"), function=("function", "first"), file=("file", "first"),
                      line=("line", "first"), samples=("weight", "size"), time=("time", "sum"),
                      own=("own", "sum"), waiting=("waiting", "sum"),
                      **{f"{p.lower()}_ns": (f"{p.lower()}_ns", "sum") for p in MODEL_PHASES},
                      other_ns=("other_ns", "sum"))
    out["per_step_ns"] = out["time"]
    step = times_of(f).mean_step_ns  # the mean step (advisor.step.timing)
    out["share_of_step"] = out["per_step_ns"] / step if step > 0 else np.nan
    out["own_code_share"] = np.where(out["time"] > 0, out["own"] / out["time"], np.nan)
    out["waiting_share"] = np.where(out["time"] > 0, out["waiting"] / out["time"], np.nan)
    main = frame[frame["role"].to_numpy() == "main"]
    top_phase = main.groupby(["key", "phase"], sort=False)["weight"].sum().reset_index()
    top_phase = top_phase.sort_values("weight", ascending=False).drop_duplicates("key").set_index("key")["phase"]
    out["phase"] = top_phase.reindex(out.index).fillna("")
    out.loc[out["phase"] == "", "phase"] = np.where(out.loc[out["phase"] == "", "role"] == "main", "Others", "")
    top_stack = frame.groupby(["key", "stack"], sort=False)["weight"].sum().reset_index()
    top_stack = top_stack.sort_values("weight", ascending=False).drop_duplicates("key").set_index("key")["stack"]
    out["stack"] = top_stack.reindex(out.index).fillna("")
    top_call = frame.groupby(["key", "calls"], sort=False)["weight"].sum().reset_index()
    top_call = top_call.sort_values("weight", ascending=False).drop_duplicates("key").set_index("key")["calls"]
    out["calls"] = top_call.reindex(out.index).fillna("")
    out = out.sort_values("per_step_ns", ascending=False, kind="stable")
    if len(out) > MAX_ROWS:
        out = out.head(MAX_ROWS)
        with_notes(out, f"The {MAX_ROWS} lines with the most time; the rest is left out.")
    interval = (f.meta.trace_metadata.get("stack_sampler") or {}).get("interval_ns")
    if interval:
        with_notes(out, f"Sampled every {interval / 1e6:.0f} ms over {n_steps} steps: a line with few samples "
                        "is an estimate within a sample or two.")
    return out


def library_call(stack: str, roots: tuple[str, ...]) -> str:
    """The library function the innermost user frame of ``stack`` called, dotted
    (``torch.serialization.save``); '' where it called none or no frame is the user's."""
    frames = [m for m in (_FRAME.match(part) for part in str(stack).split(";")) if m]
    for i, m in enumerate(frames):
        if not is_library(m["file"], roots):
            # advisor's own hooks sit between the user's line and what it called (a wrapper
            # that counts .tolist()): the call is the next frame in that is not advisor's.
            called = [f for f in reversed(frames[:i]) if not _ADVISOR_HOOK.search(f["file"])]
            return _dotted(called[0]["file"], called[0]["function"]) if called else ""
    return ""


_ADVISOR_HOOK = re.compile(r"(^|/)advisor/(collect|profiler)/")


_INSTALLED = re.compile(r".*(?:site-packages|dist-packages|/lib/python\d+(?:\.\d+)?)/")


def _dotted(path: str, function: str) -> str:
    """A library frame as a dotted name: its module from the path below the installed-code
    folder, then the function (``torch/serialization.py`` + ``save``: ``torch.serialization.save``)."""
    if path.startswith("<"):
        return function
    relative = _INSTALLED.sub("", path.replace("\\", "/"))
    if relative == path:  # not under an installed-code folder: the file's own name
        relative = relative.rsplit("/", 1)[-1]
    module = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    dotted = f"{module}.{function}"
    return _CALLED_AS.get(dotted, dotted)


# Library frames a user line reaches by an ordinary call, named as the user wrote it.
_CALLED_AS = {"torch.nn.modules.module._wrapped_call_impl": "torch.nn.Module.__call__",
              "torch.nn.modules.module._call_impl": "torch.nn.Module.__call__",
              "torch.serialization.save": "torch.save", "torch.serialization.load": "torch.load"}


CHECKPOINT_CALLS = re.compile(r"(?:^|\.)serialization\.save$|^torch\.save$|distributed\.checkpoint|safetensors|"
                              r"(?:^|\.)pickle\.dump|\.save_pretrained$|\.save_model$|\.save_checkpoint$")


@table(
    "periodic_work",
    title="Periodic Work",
    description=(
        "What the steps that run extra work every N steps (the step model's periodic steps) "
        "spend their extra time on, per line of the user's own Python: the stack samples taken "
        "in those steps against the samples of a steady step. A line's time includes what it "
        "calls; 'calls' names the library function it called (torch.serialization.save: a "
        "checkpoint). Empty without periodic steps or stack samples (traces)."
    ),
    key="'<function> (<file>:<line>)'",
    columns={
        "function": "The innermost user function.",
        "file": "Its file.",
        "line": "The line it was on.",
        "calls": "The library function that line called, dotted ('' where it ran its own code).",
        "checkpoint": "Whether that call writes a checkpoint (torch.save, torch.distributed.checkpoint, "
                      "safetensors, save_pretrained, pickle.dump).",
        "per_periodic_ns": "Sampled time at this line per periodic step, ns.",
        "per_steady_ns": "Sampled time at this line per steady step, ns.",
        "extra_ns": "per_periodic_ns less per_steady_ns: the line's part of a periodic step's extra time, ns.",
        "share_of_extra": "extra_ns over the periodic steps' extra time (the step model's).",
        "phase": "The phase most of its samples in the periodic steps were in ('Others': outside every phase).",
        "stack": "The user's frames leading here, outermost first (the most common such path).",
    },
)
def periodic_work_table(f: Facts) -> pd.DataFrame | None:
    periodic = f.model.window.periodic if f.model is not None else None
    if periodic is None or periodic.source != "timed steps":
        return None
    events = f.events
    samples = events[((events["kind"] == "stack") & (text(events["category"]) == "main")).to_numpy()]
    if not len(samples):
        return None
    timed = timed_frame(f)
    steps = samples["step"].to_numpy()
    slow = np.isin(steps, np.array(periodic.steps, dtype=np.int64))
    steady_steps = np.setdiff1d(timed["step"].to_numpy(), np.array(periodic.steps, dtype=np.int64)) \
        if len(timed) else np.zeros(0, dtype=np.int64)
    steady = np.isin(steps, steady_steps)
    if not slow.any():
        return None
    kept = samples[(slow | steady)]
    codes, stacks = coded(kept["call_stack"])
    roots = library_roots(f)
    per_stack = stack_facts(stacks, roots)
    calls = np.array([library_call(s, roots) for s in stacks], dtype=object)
    facts = per_stack.iloc[codes].reset_index(drop=True)
    label = np.where(facts["function"].to_numpy() == "", NO_USER_FRAME,
                     facts["function"].astype(str) + " (" + facts["file"].astype(str) + ":" +
                     facts["line"].astype(str) + ")")
    in_slow = slow[(slow | steady)]
    weight = (kept["end_ns"] - kept["start_ns"]).to_numpy().astype(np.float64)
    phase = text(kept["phase"])
    frame = pd.DataFrame({
        "key": label, "function": facts["function"], "file": facts["file"], "line": facts["line"],
        "calls": calls[codes], "slow": np.where(in_slow, weight, 0.0) / max(len(periodic.steps), 1),
        "steady": np.where(in_slow, 0.0, weight) / max(len(steady_steps), 1),
        "phase": np.where(phase == "", "Others", phase), "stack": facts["user_stack"], "weight": weight,
        "in_slow": in_slow,
    })
    out = frame.groupby("key", sort=False).agg(function=("function", "first"), file=("file", "first"),
                                               line=("line", "first"), per_periodic_ns=("slow", "sum"),
                                               per_steady_ns=("steady", "sum"))
    in_periodic = frame[frame["in_slow"].to_numpy()]
    for column in ("calls", "phase", "stack"):
        top = in_periodic.groupby(["key", column], sort=False)["weight"].sum().reset_index()
        top = top.sort_values("weight", ascending=False).drop_duplicates("key").set_index("key")[column]
        out[column] = top.reindex(out.index).fillna("")
    out["checkpoint"] = out["calls"].astype(str).str.contains(CHECKPOINT_CALLS)
    out["extra_ns"] = (out["per_periodic_ns"] - out["per_steady_ns"]).clip(lower=0.0)
    out["share_of_extra"] = out["extra_ns"] / periodic.extra_ns if periodic.extra_ns > 0 else np.nan
    out = out[out["extra_ns"] > 0].sort_values("extra_ns", ascending=False, kind="stable")
    out = out[["function", "file", "line", "calls", "checkpoint", "per_periodic_ns", "per_steady_ns", "extra_ns",
               "share_of_extra", "phase", "stack"]]
    return out.head(MAX_ROWS)
