"""Collection Summary: what the profile does not cover, and why.

A report is only as good as what was measured. This table lists each gap the collectors
and the importer found: a profiler that failed to start, stop or be read back, a window
of steps the run never reached or cut short, recording stopped by the event budget,
processes the script started that ran unprofiled, a GPU that was there but not recorded,
events of a trace that were damaged and skipped, a trace cut off before its end. Rows
marked incomplete mean the profile misses part of the job (the profile-incomplete rule
fires on them); the others say what was not there to measure.
"""

from __future__ import annotations

import pandas as pd

from advisor.step.facts import Facts
from advisor.tables._registry import table


def _trace_damage(f: Facts) -> list[dict]:
    """Gaps a damaged trace file leaves: events skipped by reason, and a cut-off end."""
    damage = f.meta.trace_metadata.get("damage")
    if not isinstance(damage, dict):
        return []
    rows = []
    skipped = damage.get("skipped") or {}
    total = sum(int(v) for v in skipped.values() if isinstance(v, (int, float)))
    if total:
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items(), key=lambda kv: -kv[1]))
        rows.append({"what": "trace events", "incomplete": True,
                     "why": f"{total} events of the trace were damaged and skipped ({reasons})"})
    rows += _durations(damage.get("durations"))
    if damage.get("truncated"):
        read = damage.get("bytes_read")
        how_much = f" after {read:,} bytes" if isinstance(read, int) else ""
        rows.append({"what": "trace end", "incomplete": True,
                     "why": f"the trace file is cut off{how_much}, before its JSON ends (a job killed while "
                            "writing it?): only the events before the cut were read"})
    return rows


# Share of the complete events whose duration is missing, or 0, past which the timing of
# the profile cannot be trusted. Real traces hold a few zero durations (runtime calls and
# kernels shorter than the microsecond a trace rounds to: up to ~20 % of a small trace's
# runtime calls); a missing one is never written by a profiler.
MISSING_DURATIONS_SHARE = 0.01
ZERO_DURATIONS_SHARE = 0.5


def _durations(counts: object) -> list[dict]:
    """A row where the trace's events lack durations (missing, or all 0)."""
    if not isinstance(counts, dict) or not counts.get("events"):
        return []
    events, missing, zero = (int(counts.get(k) or 0) for k in ("events", "missing", "zero"))
    rows = []
    if missing:
        rows.append({"what": "durations", "incomplete": missing >= MISSING_DURATIONS_SHARE * events,
                     "why": f"{missing:,} of the trace's {events:,} complete events have no duration (\"dur\"); "
                            "they count as 0, so the time they took is missing from every figure"})
    if zero >= ZERO_DURATIONS_SHARE * events:  # (a missing duration is counted as missing, not 0)
        rows.append({"what": "durations", "incomplete": True,
                     "why": f"{zero:,} of the trace's {events:,} complete events last 0 ns: the trace's timing "
                            "cannot be trusted (a converter that dropped durations?); record it again"})
    return rows


@table(
    "collection",
    title="Collection Summary",
    description=(
        "What the profile does not cover: one row per gap the collectors or the trace reader "
        "found, with why. incomplete rows mean part of the job that ran is missing from the "
        "profile (a failed or stopped profiler, steps not recorded, processes not profiled, a "
        "GPU present but not recorded, damaged or cut-off trace data); the others say what was "
        "not there to measure. Empty when nothing is missing."
    ),
    key="'<what> #<n>' (host profile, steps, child processes, GPU, trace events, trace end...)",
    columns={
        "what": "What was missed.",
        "incomplete": "True where part of the job that ran is missing from the profile.",
        "why": "Why, and what to do about it where there is something.",
    },
)
def collection_table(f: Facts) -> pd.DataFrame | None:
    rows = [{"what": g.what, "incomplete": g.incomplete, "why": g.why} for g in f.meta.collector.gaps]
    rows += _trace_damage(f)
    if f.unrecorded_launches:
        rows.append({"what": "GPU", "incomplete": True, "why": (
            f"the trace holds {f.unrecorded_launches:,} kernel launches but no kernel, copy or set: the GPU's "
            "activity was not recorded (CUPTI in range mode, or torch.profiler without ProfilerActivity.CUDA), so "
            "what the GPU did is unknown, not absent; record it again with the GPU's activities (torch.profiler "
            "with ProfilerActivity.CUDA, or `advisor diagnose train.py`)")})
    if not rows:
        return None
    keys, seen = [], {}
    for row in rows:
        seen[row["what"]] = seen.get(row["what"], 0) + 1
        keys.append(f"{row['what']} #{seen[row['what']]}")
    return pd.DataFrame(rows, index=keys)
