"""What the people-facing renderers share: evidence references, table lookup, labels.

Nothing here computes a figure; it only picks and words what the Report already holds.
"""

from __future__ import annotations

import re
from typing import Any

from advisor.findings import Evidence
from advisor.reports.report import Report, Table
from advisor.session import DeviceInfo
from advisor.units import (
    MISSING,
    format_bytes,
    format_cell,
    format_ms,
    format_ns,
    format_number,
    format_percent,
    is_number,
    is_time_column,
)

# A reference is a list of (text, is_code) segments: Markdown sets the code parts in code
# spans, the terminal prints them plain.
Segments = list[tuple[str, bool]]

# The summary tables the renderers show, by the canonical names of docs/design.md, with the
# spellings a table producer may use for them.
_TABLE_NAMES: dict[str, tuple[str, ...]] = {
    "device": ("device", "devices"),
    "overview": ("overview",),
    "model": ("model",),
    "operator": ("operator", "operators", "op", "ops"),
    "kernel": ("kernel", "kernels"),
    "memory": ("memory", "memory_manipulation", "memcpy", "memory_manipulations"),
    "userdefined": ("userdefined", "user_defined"),
    "distributed": ("distributed",),
    "perf": ("perf", "performance"),
}


def _normalise(name: str) -> str:
    name = re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")
    return re.sub(r"_(summary|table)$", "", name)


def find_table(report: Report, canonical: str) -> tuple[str, Table] | None:
    """The report's table for a canonical name ('model', 'kernel', ...), with the name it
    is stored under, or None."""
    spellings = _TABLE_NAMES.get(canonical, (canonical,))
    for name, table in report.tables.items():
        if _normalise(name) in spellings:
            return name, table
    return None


# Column-name words in the order a compact view wants them: how often, how long in all,
# what share, how many, how long each.
_COLUMN_PRIORITY = (
    ("calls",),
    ("total",),
    ("ratio", "share", "utilization", "pct", "percent"),
    ("count",),
    ("avg", "mean"),
)


def compact_columns(table: Table, limit: int) -> list[str]:
    """At most ``limit`` of the table's columns for a compact view: calls, totals, shares,
    counts and averages first, then the rest; shown in the table's own order."""
    names = [c.name for c in table.columns if not _is_nested(table, c.name)]
    if len(names) <= limit:
        return names

    def rank(name: str) -> int:
        words_of_name = set(name.lower().split("_"))
        for i, words in enumerate(_COLUMN_PRIORITY):
            if words_of_name & set(words):
                return i
        return len(_COLUMN_PRIORITY)

    chosen = set(sorted(names, key=rank)[:limit])
    return [n for n in names if n in chosen]


def cell_text(row: dict[str, Any], column: str, *, max_chars: int | None = None) -> str:
    """One cell of a table row for people (see units.format_cell); a row's "unit" column,
    where the table has one, gives the unit of its numbers."""
    unit = row.get("unit") if column != "unit" else None
    return format_cell(column, row.get(column), unit=unit if isinstance(unit, str) else None, max_chars=max_chars)


def numeric_columns(table: Table, columns: list[str]) -> dict[str, bool]:
    """Which columns hold numbers (right-aligned when shown)."""
    return {c: any(is_number(r.get(c)) for r in table.rows[:20]) for c in columns}


def _is_nested(table: Table, column: str) -> bool:
    """A column whose values are lists or objects (per-op kernel detail...)."""
    for row in table.rows[:20]:
        value = row.get(column)
        if value is not None:
            return isinstance(value, (list, dict))
    return False


def evidence_value(column: str | None, value: Any, unit: str | None = None) -> str:
    """An evidence value as it reads in a reference: durations and byte counts in units,
    other numbers raw (a ratio stays 0.41, as the table holds it)."""
    if value is None:
        return MISSING
    if unit and is_number(value) and not isinstance(value, bool):
        return format_cell(column or "", value, unit=unit)
    if isinstance(value, bool):
        return str(value).lower()
    if is_number(value):
        name = (column or "").lower()
        if is_time_column(name):
            return format_ns(value)
        if name.endswith("bytes"):
            return format_bytes(value)
        if isinstance(value, float):
            return f"{value:.4g}"
        return format_number(value)
    return str(value)


def evidence_segments(ev: Evidence) -> Segments:
    """A short reference: ``model[Dataloader].cpu_ratio = 0.41``, ``event #123 cudaMemcpy
    2.1 ms``, ``train.py:42 in main``."""
    out: Segments = []
    if ev.kind == "table_row":
        ref = f"{ev.table or '?'}[{ev.row or ''}]"
        if ev.column:
            ref += f".{ev.column}"
        out.append((ref, True))
        if ev.value is not None:
            out.append((f" = {evidence_value(ev.column, ev.value, ev.unit)}", False))
    elif ev.kind == "event":
        out.append(("event" + (f" #{ev.event_id}" if ev.event_id is not None else ""), False))
        if ev.name:
            out.append((" ", False))
            out.append((ev.name, True))
        if ev.value is not None:
            shown = evidence_value(ev.column, ev.value)
            label = f" {ev.column}" if ev.column and not ev.column.lower().endswith(("_ns", "bytes")) else ""
            out.append((f"{label} {shown}", False))
    else:
        where = ev.file or "?"
        if ev.line is not None:
            where += f":{ev.line}"
        out.append((where, True))
        if ev.function:
            out.append((" in ", False))
            out.append((ev.function, True))
    if ev.note:
        out.append((f" ({ev.note})", False))
    return out


def device_label(device: DeviceInfo) -> str:
    """``GPU 0: NVIDIA A100-SXM4-40GB (sm 8.0, 108 SMs, 40.0 GiB)``; ``GPU 0: AMD Instinct
    MI300X (gfx942 (CDNA 3), 304 CUs, 192 GiB)`` where the knowledge base names the part."""
    kind = device.kind.upper() if device.kind in ("gpu", "cpu") else device.kind
    head = kind if device.id < 0 else f"{kind} {device.id}"
    details = []
    amd = getattr(device, "vendor", "") == "amd"
    architecture = getattr(device, "architecture", "")
    if architecture:
        details.append(architecture)
    elif device.compute_capability:
        # ROCm writes its GFXIP version into the fields CUDA's compute capability uses.
        details.append(f"GFXIP {device.compute_capability}" if amd else f"sm {device.compute_capability}")
    if device.sm_count:
        details.append(f"{device.sm_count} {'CUs' if amd else 'SMs'}")
    if device.total_memory_bytes:
        details.append(format_bytes(device.total_memory_bytes))
    threads = device.properties.get("torch_threads") if device.kind == "cpu" else None
    if isinstance(threads, int) and threads > 0:
        # The operator threads against the cores the job may use: more threads than cores
        # is a finding of its own (cpu-threads-oversubscribed), fewer may leave cores idle.
        usable = device.properties.get("usable_cores")
        on = (f" on {usable:g} usable core{'s' if usable != 1 else ''}"
              if isinstance(usable, (int, float)) and usable > 0 else "")
        details.append(f"torch {threads} thread{'s' if threads != 1 else ''}{on}")
    text = f"{head}: {device.name}" if device.name else head
    return text + (f" ({', '.join(details)})" if details else "")


def devices_text(report: Report) -> str:
    devices = report.session.devices
    return "; ".join(device_label(d) for d in devices) if devices else "none recorded"


def steps_text(report: Report) -> str:
    """``3 steps (#1-#3), mean step 350 ms`` or ``no steps``."""
    steps = report.session.steps
    if not steps.count:
        return "no steps"
    numbers = steps.numbers
    span = ""
    if numbers:
        span = f" (#{numbers[0]})" if len(numbers) == 1 else f" (#{numbers[0]}-#{numbers[-1]})"
    noun = "step" if steps.count == 1 else "steps"
    text = f"{steps.count} {noun}{span}, mean step {format_ns(steps.mean_step_ns)}"
    if steps.unrecorded_steps and steps.unrecorded_mean_step_ns is not None:
        unrecorded = f"{steps.unrecorded_steps} step{'' if steps.unrecorded_steps == 1 else 's'}"
        text += f"; {format_ns(steps.unrecorded_mean_step_ns)} a step over {unrecorded} run without the profiler"
        if steps.overhead_ratio is not None and steps.overhead_ratio >= 0:
            text += f" (recording added {format_percent(steps.overhead_ratio * 100)})"
        elif steps.overhead_ratio is not None:
            # Recording cannot speed a step up: the steps simply vary by more than it costs.
            text += (f" (the recorded steps were {format_percent(-steps.overhead_ratio * 100)} faster: "
                     "recording cost less than the steps vary)")
    if steps.stalled:
        which = ", ".join(f"#{s.step} ({format_ns(s.duration_ns)}, {s.times_median:g}x the median)"
                          for s in steps.stalled)
        text += (f"; step{'s' if len(steps.stalled) > 1 else ''} {which} set apart from the mean: a pause of the "
                 "process (most likely the garbage collector or the machine), not the loop's pace")
    return text


def gpu_text(report: Report) -> str:
    """Whether the GPU was measured, and if not, why."""
    collector = report.session.collector
    if collector.gpu_measured:
        return f"measured ({collector.name})"
    stated = [n for n in report.notes if n.startswith("GPU not measured")]
    # Shown beside a "GPU" label: "not measured: <why>".
    return stated[0].removeprefix("GPU ") if stated else "not measured"


def command_text(report: Report) -> str | None:
    """``train.py --epochs 1 (exit code 0)`` where a script ran, else None."""
    session = report.session
    if not session.command and session.exit_code is None:
        return None
    text = " ".join(session.command or [session.source])
    if session.exit_code is not None:
        text += f" (exit code {session.exit_code})"
    return text


# The ranks table's columns a person reads first, in order (those with a value on some rank).
RANK_COLUMNS = ["step_mean_ns", "gpu_utilization", "comm_ns", "wait_ns", "last_share", "dataloader_share"]
COLLECTIVE_COLUMNS = ["calls_per_step", "bytes_per_call", "time_ns", "skew_mean_ns", "last_rank"]


def job_text(report: Report) -> str:
    """``2 of 4 ranks (missing 2, 3); rank 1 ended with exit code 1`` for a job's header."""
    job = report.job
    if job is None:
        return ""
    text = f"{len(job.ranks)} of {job.world_size} rank{'s' if job.world_size != 1 else ''}"
    if job.missing_ranks:
        text += f" (missing {', '.join(map(str, job.missing_ranks))})"
    ended = [f"rank {r.rank} {r.ending or 'exited'} with exit code {r.exit_code}" for r in job.ranks
             if r.exit_code not in (None, 0)]
    if ended:
        text += "; " + "; ".join(ended)
    return text


def other_notes(report: Report) -> list[str]:
    """The report's notes less the GPU one, which the header states already."""
    return [n for n in report.notes if not n.startswith("GPU not measured")]


def combined_text(report: Report) -> str:
    """Every fix at once, in a sentence ("" where the report has no combined estimate)."""
    combined = report.combined
    if combined is None or not combined.rules:
        return ""
    rules = ", ".join(combined.rules)
    per = "pass" if report.session.window.one_pass else "step"
    return (f"Every fix at once ({rules}): saves {format_ns(combined.ms_per_step * 1e6)} per {per} "
            f"({format_percent(combined.share_of_step * 100)} of the {per}), "
            f"{format_ns(combined.step_before_ms * 1e6)} -> {format_ns(combined.step_after_ms * 1e6)}"
            + (f" (the step counting {combined.includes})" if combined.includes else "")
            + "; time the fixes share is counted once.")



def saving_verb(finding: Any) -> str:
    """The word before a finding's saving: "Saves", or "Predicted to save" where `advisor
    verify` measured its fix making the step slower (the saving is then only a prediction,
    and the verification line says what was measured)."""
    v = finding.verification
    return "Predicted to save" if v is not None and v.measured_saving_ms_per_step < 0 else "Saves"


def verification_line(finding: Any) -> str:
    """What `advisor verify` measured of the finding's fix, or why it did not, in one line
    ('' where verify was not asked)."""
    v = finding.verification
    if v is not None:
        verdict = "inside the predicted range" if v.inside_range else "outside the predicted range"
        noise = "" if v.clear_of_noise else "; not yet clear of the run-to-run noise (a larger --budget)"
        if v.measured_saving_ms_per_step < 0:
            return (f"Verified: {v.applied} made the step {format_ms(-v.measured_saving_ms_per_step)} SLOWER "
                    f"({format_ms(v.before_ms_per_step)} ± {format_ms(v.before_spread_ms)} -> "
                    f"{format_ms(v.after_ms_per_step)} ± {format_ms(v.after_spread_ms)} over {v.trials} "
                    f"pair{'s' if v.trials != 1 else ''} of runs, {v.steps_timed} steps each){noise}: on this "
                    "machine the fix as applied does not pay; the predicted saving does not hold.")
        return (f"Verified: {v.applied} saved {format_ms(v.measured_saving_ms_per_step)}/step measured "
                f"({format_ms(v.before_ms_per_step)} ± {format_ms(v.before_spread_ms)} -> "
                f"{format_ms(v.after_ms_per_step)} ± {format_ms(v.after_spread_ms)} over {v.trials} "
                f"pair{'s' if v.trials != 1 else ''} of runs, {v.steps_timed} steps each), {verdict}{noise}.")
    if finding.not_verified is not None:
        return f"Not verified: {finding.not_verified.reason}."
    return ""


def findings_heading(findings: list[Any]) -> str:
    """The findings' heading: by the measured saving where `advisor verify` measured one."""
    if any(f.verification is not None for f in findings):
        return "Findings, ranked by measured saving where verified, else by estimated saving"
    return "Findings, ranked by estimated saving"
