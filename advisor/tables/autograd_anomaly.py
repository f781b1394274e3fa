"""Autograd's anomaly detection, seen in a profile: what it costs each step.

``torch.autograd.set_detect_anomaly(True)`` (or ``detect_anomaly()`` around the loop), a
debugging aid often left on, does two things each step:

- backward checks every function's outputs for NaN: an ``aten::isnan`` and an
  ``aten::_is_any_true`` (with its ``aten::any``) inside each
  ``autograd::engine::evaluate_function`` range, then reads the answer back to the host;
- forward stores, for every autograd node it creates, the Python stack that created it
  (``traceback``'s stack formatting, with ``linecache``), which shows in the stack
  sampler's samples of the Forward phase.

The table says both, per step: the checks from the operators (any profile that records
nested operators, a Kineto trace too), the stack capture from the samples (a run under
advisor), or where advisor timed the Forward phase's calls again after the run with and
without autograd, from those. The rule autograd-anomaly-detection reads it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.session import text
from advisor.session.attribute import name_matches
from advisor.session.busy import busy_share
from advisor.step.facts import Facts, coded
from advisor.step.load import STACK_CAPTURE_FRAMES, capture_frames, forward_autograd_ns, weighed_per_step
from advisor.tables._registry import table
from advisor.tables.python_hotspots import phase_ns, samples_in_steps

# The operators of one NaN check in backward, and the range they run in.
CHECK_OPS = ("aten::isnan", "aten::_is_any_true")
ENGINE = re.compile(r"^autograd::engine::evaluate_function")
# Frames of the stack anomaly mode stores for each node it creates (torch formats it with
# the standard library's traceback module, which reads source lines through linecache).
CAPTURE_FRAMES = STACK_CAPTURE_FRAMES
COLUMNS = ["checks", "checks_per_step", "check_per_step_ns", "forward_per_step_ns", "forward_samples",
           "capture_samples", "capture_share", "capture_per_step_ns", "capture_launcher_share", "capture_retimed"]


@table(
    "autograd_anomaly",
    title="Autograd Anomaly Detection",
    description=(
        "What autograd's anomaly detection (torch.autograd.set_detect_anomaly(True), "
        "detect_anomaly()) costs each step, where the profile shows it on: backward's NaN "
        "check of every function's outputs (aten::isnan and aten::_is_any_true inside each "
        "autograd::engine::evaluate_function range), and forward's capture of the Python stack "
        "of every autograd node it creates (samples of the Forward phase inside the traceback "
        "and linecache modules). One row, 'anomaly detection', where either is seen; empty "
        "otherwise."
    ),
    key="'anomaly detection'",
    columns={
        "checks": "NaN checks in the window (aten::isnan inside an autograd function's range).",
        "checks_per_step": "NaN checks per step (NaN without steps).",
        "check_per_step_ns": "Host time of the checks' operators (isnan, _is_any_true) per step, ns.",
        "forward_per_step_ns": "The Forward phase's time per step from the step clock, ns (NaN without phases).",
        "forward_samples": "Stack samples of the main thread in the Forward phase.",
        "capture_samples": "Of those, samples inside the stack capture (traceback and linecache frames).",
        "capture_share": "capture_samples / forward_samples (NaN without samples); where the Forward phase's "
                         "calls were timed again after the run (capture_retimed), the share of its time autograd's "
                         "recording takes in them.",
        "capture_per_step_ns": "capture_share x forward_per_step_ns: the stack capture's time per step, ns.",
        "capture_launcher_share": "Of the frames each capture formats (those outside it in the sampled stack), the "
                                  "mean share outside the script's own <module> frame: the launcher's (advisor's, "
                                  "where it ran the script), which a run without it does not format. Where "
                                  "capture_retimed, the launcher's share of the capture's time (0 on a busy "
                                  "machine: that share is the job's own already).",
        "capture_retimed": "1 where capture_share comes from the Forward phase's calls timed again after the run "
                           "with and without autograd, at the depth of the job's own stacks the samples show (on "
                           "a busy machine, at one thread, weighed as on a quiet machine); 0 from samples.",
    },
)
def autograd_anomaly_table(f: Facts) -> pd.DataFrame | None:
    empty = pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS}).rename_axis("key")
    ev = f.events
    lo, hi = f.window
    steps = len(f.steps) if f.has_steps else 0
    names = ev["name"]
    is_check = ((ev["kind"] == "op").to_numpy() & names.isin(CHECK_OPS).to_numpy()
                & (ev["start_ns"].to_numpy() >= lo) & (ev["start_ns"].to_numpy() < hi))
    checks, check_ns = 0, 0.0
    if is_check.any():
        engine = name_matches(names, ENGINE)  # once per distinct name
        parents = ev["parent_op"].to_numpy()[is_check]
        inside = (parents >= 0) & engine[np.maximum(parents, 0)]
        rows = np.flatnonzero(is_check)[inside]
        own = names.iloc[rows].to_numpy()
        checks = int(np.count_nonzero(own == "aten::isnan"))
        check_ns = float((ev["end_ns"].to_numpy()[rows] - ev["start_ns"].to_numpy()[rows]).sum())
    samples, _ = samples_in_steps(f)
    forward = samples[(text(samples["phase"]) == "Forward")] if len(samples) else samples
    capture, launcher, share, retimed = 0, np.nan, np.nan, None
    if len(forward):
        codes, stacks = coded(forward["call_stack"])
        hit = np.array([any(frame in str(stack) for frame in CAPTURE_FRAMES) for stack in stacks], dtype=bool)
        captured = codes[codes >= 0][hit[codes[codes >= 0]]]
        capture = len(captured)
        share = capture / len(forward)
        if capture:
            outside = np.array([_launcher_share(str(stack)) if hit[i] else 0.0 for i, stack in enumerate(stacks)])
            launcher = float(outside[captured].mean())
            retimed = _retimed(f)
            if retimed is not None:
                share, launcher = retimed
    if not checks and not capture:
        return empty
    forward_ns = phase_ns(f).get("Forward", np.nan)
    row = {
        "checks": checks, "checks_per_step": checks / steps if steps else np.nan,
        "check_per_step_ns": check_ns / steps if steps else np.nan, "forward_per_step_ns": forward_ns,
        "forward_samples": len(forward), "capture_samples": capture, "capture_share": share,
        "capture_per_step_ns": share * forward_ns, "capture_launcher_share": launcher,
        "capture_retimed": float(retimed is not None),
    }
    return pd.DataFrame([row], index=pd.Index(["anomaly detection"], name="key"))[COLUMNS]


def _retimed(f: Facts) -> tuple[float, float] | None:
    """The stack capture from the Forward phase's calls timed again after the run with and
    without autograd (advisor.collect.retime, advisor.step.load), where they were: its
    share of the Forward phase, and the share of that the launcher's frames take. The
    stack samples catch the capture less often than its share of the time: the sampler
    waits for Python's lock, which the main thread gives up inside operators far more
    than in the capture's own Python (on a loaded machine it waits for a core first).

    On a busy machine: the share of the Forward phase's work as a quiet machine weighs it,
    at the depth of the job's own stacks (the launcher's share 0: the share is the job's
    own already). On a quiet one: the capture at the depth of the job's own stacks, with
    the launcher's frames above them (which each capture under advisor also formats) at
    the same cost a frame, against the Forward phase's time at the job's pace; the
    launcher's share is its frames' share of every frame the samples show. None where no
    such call was timed."""
    model = f.model
    mix = getattr(getattr(model, "pace", None), "mix", None)
    if mix is not None:
        if not mix.forward_autograd_ns:
            return None
        forward = weighed_per_step(model, f.phase_intervals("Forward"))
        return (min(mix.forward_autograd_ns / forward, 1.0), 0.0) if forward else None
    if model is None or busy_share(model.session.meta.trace_metadata) is not None:
        return None  # a busy run the model does not weigh: its recorded Forward is the load's
    frames = capture_frames(model)
    own = forward_autograd_ns(model) if frames else None
    # The launcher's frames cost the capture what the job's own do, frame for frame: the
    # capture formats every frame alike, and a chain of 20 frames more above the plain
    # script added 16.5 ms to its 17-19 ms step (117 nodes a step, 7 us a frame each), where
    # frames timed again one below the other in one file cost a half to a third of that.
    whole = own * frames[1] / frames[0] if own and frames[0] > 0 else None
    # The Forward phase at the job's pace (the unrecorded steps), else as recorded.
    forward = float(phase_ns(f).get("Forward", np.nan))
    if not forward > 0 and model.steps:
        forward = f.phase_intervals("Forward").length / model.steps
    if not whole or not forward > 0:
        return None
    return min(whole / forward, 1.0), 1.0 - frames[0] / frames[1]


def _launcher_share(stack: str) -> float:
    """Of a sampled stack's frames outside the capture (innermost first, ';'-separated), the
    share outside the script's <module> frame: the frames of whatever ran the script."""
    frames = stack.split(";")
    module = next((i for i, frame in enumerate(frames) if frame.endswith(": <module>")), None)
    if module is None:
        return 0.0
    first = next((i for i, frame in enumerate(frames) if not any(c in frame for c in CAPTURE_FRAMES)), 0)
    formatted = len(frames) - first
    return (len(frames) - 1 - module) / formatted if formatted > 0 else 0.0
