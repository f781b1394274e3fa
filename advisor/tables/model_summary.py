"""Model Summary: where a step's time goes, phase by phase, on the host and on the GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.session import text
from advisor.step.facts import MODEL_PHASES, Facts
from advisor.tables._registry import table, with_notes
from advisor.tables.device import host_samples

ROWS = ("ProfileStep", *MODEL_PHASES, "Others")
# A phase's sampled CPU use is given only where at least this share of the samples around
# it is the phase's own time; shorter, scattered phases would read their neighbours' use.
MIN_OWN_SHARE = 0.5


def union_per_step(positions: np.ndarray, starts, ends, n_steps: int) -> np.ndarray:
    """Union length per step position (0..n_steps-1) of intervals tagged with a position."""
    ok = positions >= 0
    lengths = iv.grouped_union_length(positions[ok], (np.asarray(starts)[ok], np.asarray(ends)[ok]))
    return lengths.reindex(np.arange(n_steps), fill_value=0).to_numpy()


def _cpu_cores(f: Facts, s_start, s_end, p_name, p_start, p_end) -> list[float]:
    """Sampled process CPU use (cores) over each row's time: the steps, each phase's
    ranges in them, and the steps' time outside every phase."""
    samples = host_samples(f)
    if samples is None:
        return [np.nan] * len(ROWS)
    spans = {"ProfileStep": iv.union((s_start, s_end))}
    for phase in MODEL_PHASES:
        mine = p_name == phase
        spans[phase] = iv.union((p_start[mine], p_end[mine]))
    in_any = np.isin(p_name, MODEL_PHASES)
    spans["Others"] = iv.subtract(spans["ProfileStep"], iv.union((p_start[in_any], p_end[in_any])))
    return [samples.mean(samples.cores, spans[name], min_own_share=MIN_OWN_SHARE) for name in ROWS]


@table(
    "model",
    title="Model Summary",
    description=(
        "Time per step in each phase. CPU time of a phase is the merged time of its phase "
        "ranges inside the step; Others is the step's time outside every phase. GPU time of a "
        "phase is the union of the GPU work (kernels, copies, sets) launched in that phase of "
        "the step, wherever it ran; GPU work launched outside all phases counts as Others. "
        "Statistics are over steps (a step without the phase counts as 0), and both ratios are "
        "against the ProfileStep CPU total, the steps' wall time. process_cpu_cores is the "
        "sampled CPU use of the process during the phase's time (see the Device Summary). "
        "Samples are ~50 ms long and a sample counts for the time it shares with the phase, so "
        "the figure is given only where at least half of the samples around the phase is the "
        "phase's own time; phases much shorter than a sample are left empty. Empty without steps."
    ),
    key="ProfileStep, Dataloader, Forward, Backward, Optimization, Others",
    columns={
        "calls": "ProfileStep: steps; a phase: its ranges in the steps; Others: steps.",
        "cpu_total_ns": "Host time over all steps, ns.",
        "cpu_avg_ns": "Mean per step, ns.",
        "cpu_max_ns": "Largest step value, ns.",
        "cpu_min_ns": "Smallest step value, ns.",
        "cpu_ratio": "cpu_total_ns / ProfileStep cpu_total_ns (0..1).",
        "gpu_total_ns": "GPU busy time over all steps, ns (NaN: GPU not measured).",
        "gpu_avg_ns": "Mean per step, ns.",
        "gpu_max_ns": "Largest step value, ns.",
        "gpu_min_ns": "Smallest step value, ns.",
        "gpu_ratio": "gpu_total_ns / ProfileStep cpu_total_ns (0..1); for ProfileStep, the GPU busy share of the steps.",
        "process_cpu_cores": "Mean CPU use of the process and its children during the phase's time in the steps, "
                             "in cores, sampled (NaN: no host samples, or the phase too short for them).",
        "called_from": "Forward: the user's line that calls the model most often ('file:line', from the "
                       "collector's hooks over the run's first forward calls; '' where not recorded or another row).",
    },
)
def model_table(f: Facts) -> pd.DataFrame | None:
    if not f.has_steps:
        return None
    steps = f.steps
    n = len(steps)
    s_start, s_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    durations = s_end - s_start

    p_pos, p_name, p_start, p_end = f.phase_spans
    ok = p_pos >= 0

    cpu = {"ProfileStep": durations}
    calls = {"ProfileStep": n, "Others": n}
    for phase in MODEL_PHASES:
        mine = p_name == phase
        cpu[phase] = union_per_step(p_pos[mine], p_start[mine], p_end[mine], n)
        calls[phase] = int((mine & ok).sum())
    in_any = np.isin(p_name, MODEL_PHASES)
    cpu["Others"] = durations - union_per_step(p_pos[in_any], p_start[in_any], p_end[in_any], n)

    gpu_per_step: dict[str, np.ndarray] = {}
    if f.gpu_measured:
        gpu = f.gpu
        g_pos = f.step_positions(gpu)
        g_phase = text(gpu["phase"])
        g_start, g_end = gpu["start_ns"].to_numpy(), gpu["end_ns"].to_numpy()
        gpu_per_step["ProfileStep"] = union_per_step(g_pos, g_start, g_end, n)
        for phase in MODEL_PHASES:
            mine = g_phase == phase
            gpu_per_step[phase] = union_per_step(g_pos[mine], g_start[mine], g_end[mine], n)
        other = ~np.isin(g_phase, MODEL_PHASES)
        gpu_per_step["Others"] = union_per_step(g_pos[other], g_start[other], g_end[other], n)

    step_total = int(durations.sum())
    rows = {}
    for name in ROWS:
        row = {"calls": calls[name]}
        for side, values in (("cpu", cpu.get(name)), ("gpu", gpu_per_step.get(name))):
            if values is None:
                row.update({f"{side}_{s}_ns": np.nan for s in ("total", "avg", "max", "min")})
                continue
            row.update(
                {
                    f"{side}_total_ns": int(values.sum()),
                    f"{side}_avg_ns": float(values.mean()),
                    f"{side}_max_ns": int(values.max()),
                    f"{side}_min_ns": int(values.min()),
                }
            )
        rows[name] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    out["cpu_ratio"] = f.ratio(out["cpu_total_ns"], step_total)
    # GPU work a step queued can outlive the step (it runs into the next): its share of the
    # steps' time is at most all of it.
    out["gpu_ratio"] = np.minimum(f.ratio(out["gpu_total_ns"], step_total), 1.0)
    out["process_cpu_cores"] = _cpu_cores(f, s_start, s_end, p_name[ok], p_start[ok], p_end[ok])
    sites = (f.meta.trace_metadata.get("advisor") or {}).get("forward_sites") or {}
    top = max(sites.items(), key=lambda item: item[1])[0] if isinstance(sites, dict) and sites else ""
    out["called_from"] = ["" if key != "Forward" else str(top) for key in out.index]
    if not f.gpu_measured:
        with_notes(out, f.gpu_not_measured_note)
    return out
