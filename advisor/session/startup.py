"""Start-up in the window: a first step far slower than the ones after it is left out.

The first profiled step of a job often holds work no later step repeats: CUDA context and
cuDNN autotuning, torch.compile, optimizer state made on the first ``step()``, the first
allocations. Judged with it, every per-step figure is the start-up's, and launch overhead
or a slow optimizer is blamed for what happens once. Where the profile has at least three
steps and the first takes ``STARTUP_FACTOR`` times the median of the others or more, its
step range is left out of the window (the event stays, as a plain range), so the tables and
rules judge the steady steps, and a note on the session says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session.model import Session, conform_events
from advisor.units import format_ns

STARTUP_FACTOR = 3.0
MIN_STEPS = 3


def leave_out_startup(session: Session) -> Session:
    """``session`` with a start-up first step left out of the window, or as it is."""
    steps = session.steps()
    if len(steps) < MIN_STEPS:
        return session
    took = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype="float64")
    steady = float(np.median(took[1:]))
    if steady <= 0 or took[0] < STARTUP_FACTOR * steady:
        return session
    first = steps.iloc[0]
    events = session.events
    kind = events["kind"].astype(str).to_numpy()
    row = np.flatnonzero((kind == "step") & (events["start_ns"].to_numpy() == first["start_ns"])
                         & (events["end_ns"].to_numpy() == first["end_ns"]))
    if not len(row):
        return session
    relabelled = events.copy(deep=False)  # copy-on-write: the relabelled kind is this frame's alone
    relabelled["kind"] = pd.Series(kind, index=events.index).where(~np.isin(np.arange(len(events)), row), "annotation")
    later = steps.iloc[1:]
    note = (f"Step #{int(first['step'])} is left out of the window: it took {format_ns(took[0])}, "
            f"{took[0] / steady:.1f} times the median of the {len(later)} steps after it (start-up: initialisation, "
            "autotuning, compilation, state made on first use). Every figure is over the steady steps "
            f"#{int(later['step'].iloc[0])}-#{int(later['step'].iloc[-1])}.")
    collector = session.meta.collector
    meta = session.meta.model_copy(update={"collector": collector.model_copy(
        update={"notes": [*collector.notes, note]})})
    steady_session = Session(meta, conform_events(relabelled))
    # Derived from the cached session alone, so its tables can be kept in the same entry
    # (their key holds the metadata, which says what was left out).
    steady_session.cache_entry = session.cache_entry
    return steady_session
