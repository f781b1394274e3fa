"""Perf Summary: reader cost, batch cost and throughput per step (Paddle's timer view)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.step.facts import Facts
from advisor.tables._registry import table, with_notes


def batch_size(f: Facts) -> int | None:
    """Samples per step where the session records it."""
    for value in (f.meta.trace_metadata.get("batch_size"), getattr(f.meta, "batch_size", None)):
        try:
            size = int(value)
        except (TypeError, ValueError):
            continue
        if size > 0:
            return size
    return None


@table(
    "perf",
    title="Perf Summary",
    description=(
        "Per-step costs over the profiled steps. batch_cost is a step's duration; "
        "reader_cost the time in the Dataloader phase within it (NaN when the session has no "
        "phases at all); ips the throughput, in samples/s where the batch size is recorded and "
        "in steps/s otherwise. avg of ips is the overall rate (samples over total time), not "
        "the mean of per-step rates. Empty without steps."
    ),
    key="reader_cost, batch_cost, ips",
    columns={
        "avg": "Mean per step (ips: overall rate).",
        "max": "Largest step value.",
        "min": "Smallest step value.",
        "p50": "Median step value.",
        "unit": "'ns' for costs; 'samples/s' or 'steps/s' for ips.",
    },
)
def perf_table(f: Facts) -> pd.DataFrame | None:
    if not f.has_steps:
        return None
    steps = f.steps
    n = len(steps)
    s_start, s_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    batch_cost = (s_end - s_start).astype("float64")

    phases = f.phases
    if len(phases):
        loader = phases[phases["phase_name"].to_numpy() == "Dataloader"]
        pos = f.step_positions(loader)
        ok = pos >= 0
        start = np.maximum(loader["start_ns"].to_numpy()[ok], s_start[pos[ok]])
        end = np.minimum(loader["end_ns"].to_numpy()[ok], s_end[pos[ok]])
        reader_cost = iv.grouped_union_length(pos[ok], (start, end)).reindex(np.arange(n), fill_value=0)
        reader_cost = reader_cost.to_numpy().astype("float64")
    else:
        reader_cost = np.full(n, np.nan)

    size = batch_size(f)
    samples = float(size or 1)
    with np.errstate(divide="ignore"):
        ips = np.where(batch_cost > 0, samples * 1e9 / batch_cost, np.nan)
    total_s = batch_cost.sum() / 1e9
    rows = {
        "reader_cost": _row(reader_cost, "ns"),
        "batch_cost": _row(batch_cost, "ns"),
        "ips": {**_row(ips, "samples/s" if size else "steps/s"), "avg": samples * n / total_s if total_s > 0 else np.nan},
    }
    out = pd.DataFrame.from_dict(rows, orient="index")
    if size is None:
        with_notes(out, "Batch size not recorded: ips is in steps/s.")
    # Steps the window set apart (a start-up step, a periodic validation) are not in these
    # figures; a reader comparing them with a timer over every step must be told.
    window = getattr(f.model, "window", None)
    apart = [s for s in (window.set_apart if window is not None else ()) if s.kind.endswith(" step")]
    if apart:
        named = "; ".join(s.what for s in apart[:3]) + ("; ..." if len(apart) > 3 else "")
        with_notes(out, f"Over the {n} steady step{'s' if n != 1 else ''}: {len(apart)} step"
                        f"{'s' if len(apart) != 1 else ''} set apart left out ({named}).")
    return out


def _row(values: np.ndarray, unit: str) -> dict:
    if np.isnan(values).all():
        return {"avg": np.nan, "max": np.nan, "min": np.nan, "p50": np.nan, "unit": unit}
    return {
        "avg": float(np.nanmean(values)),
        "max": float(np.nanmax(values)),
        "min": float(np.nanmin(values)),
        "p50": float(np.nanmedian(values)),
        "unit": unit,
    }
