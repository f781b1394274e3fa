"""low-gpu-utilization: a GPU busy for too little of the window, and why it idles.

A symptom: the causes the step model's partition gives its idle time (the gpu_idle table)
are other rules' findings (data loading, launch overhead, host work, waits on the device,
work queued behind a dependency), and this finding is nested under the one that explains
it. Its saving is the idle time itself: the upper bound were the GPU kept busy, at the
job's own pace where the profiler's cost on the host is known (advisor.step.pace).
"""

from __future__ import annotations

from advisor.findings import Finding, Severity
from advisor.rules.checks.common import ms, pct, row_evidence, saving
from advisor.rules.registry import RuleContext, register

# Causes under this share of the idle time are left out of the message's breakdown.
MIN_SHOWN_SHARE = 0.005

LABELS = {
    "work queued": "work queued on the GPU, waiting on a dependency",
    "blocking sync": "the host blocked on the GPU",
    "data loading": "the host loading data",
    "communication": "the host in a collective",
    "launch calls": "the host in launch calls",
    "host in model": "the host inside the model",
    "host outside model": "the host outside the model",
    "unrecorded": "the host in nothing recorded",
}
ADVICE = {
    "data loading": "fix the data loader first (see the data-loading finding)",
    "blocking sync": "remove host synchronisations from the loop first",
    "launch calls": "cut launch overhead: larger batches, fused or foreach optimizers, torch.compile, CUDA graphs",
    "host in model": "make the host's work inside the model cheaper or take it out of the loop (torch.compile, "
                     "CUDA graphs), after ruling out a slow or busy host",
    "host outside model": "take the host's own work outside the model off the step (see the host-bound finding)",
    "work queued": "remove what the queued work waits on (see the queued-work-waits finding)",
    "communication": "overlap communication with computation",
}


@register("low-gpu-utilization")
def check(ctx: RuleContext) -> list[Finding]:
    device = ctx.table("device")
    if not ctx.gpu_measured or device is None or not len(device) or "kind" not in device.columns:
        return []
    gpus = device[device["kind"] == "gpu"]
    idle = ctx.table("gpu_idle")
    window = idle[idle["in_window"].astype(bool)] if idle is not None and len(idle) and "in_window" in idle else idle
    steps = max(ctx.model.partition.steps if ctx.model is not None else ctx.step_count, 1)
    findings = []
    for key, row in gpus.iterrows():
        utilization = float(row["utilization"])
        # NaN: a window of no length (a trace without durations), where nothing can be judged.
        if not utilization < ctx.threshold("utilization") or not float(row["window_ns"]) > 0:
            continue
        idle_ns = float(row["window_ns"] - row["busy_ns"])
        part = ctx.model.partition if ctx.model is not None else None
        if part is not None and part.on_gpu and part.ns("set apart") and len(gpus) == 1:
            # A step set apart inside the window is not the steady steps' idle time.
            idle_ns = float(part.idle_ns)
            utilization = part.busy.length / max(part.busy.length + idle_ns, 1.0)
            if not utilization < ctx.threshold("utilization"):
                continue
        per_step = idle_ns / steps
        # At the job's own pace the host is faster than recorded and the GPU idles less: the
        # profiler's cost comes off the idle time, the GPU's work stays.
        at_pace = _idle_at_pace(ctx, per_step)
        if at_pace is not None:
            busy = float(row["busy_ns"]) / steps
            utilization = busy / (busy + at_pace) if busy + at_pace > 0 else utilization
            if not utilization < ctx.threshold("utilization"):
                continue
        breakdown = []
        evidence = [
            row_evidence("device", device, key, "utilization", "busy share of the window"),
            row_evidence("overview", ctx.table("overview"), "Kernel", "gpu_ratio", "kernel time share"),
        ]
        top_reason = ""
        if window is not None and len(window):
            ranked = window.sort_values("idle_ns", ascending=False)
            for reason, idle_row in ranked.iterrows():
                if idle_row["idle_ns"] <= 0:
                    continue
                top_reason = top_reason or str(reason)
                share = float(idle_row["share_of_idle"])
                if share >= MIN_SHOWN_SHARE:  # every cause stays in the evidence
                    breakdown.append(f"{LABELS.get(str(reason), str(reason))} {pct(share)}")
                evidence.append(row_evidence("gpu_idle", idle, reason, "idle_ns", f"GPU idle: {reason}"))
        if at_pace is not None:
            message = (f"{row.get('name', key)} is busy {pct(utilization)} of the step at the job's own pace and idle "
                       f"{ms(at_pace)} per step ({ms(per_step)} as recorded, the profiler's cost on the host "
                       "included).")
        else:
            message = (
                f"{row.get('name', key)} is busy {pct(utilization)} of the {ms(row['window_ns'])} window "
                + (f"and idle {ms(per_step)} per step." if ctx.step_count else f"and idle {ms(idle_ns)} of it (no "
                                                                                 "steps found).")
            )
        per_step = at_pace if at_pace is not None else per_step
        if breakdown:
            message += " While it idles: " + ", ".join(breakdown) + "."
        advice = ADVICE.get(top_reason, "find what the host does between kernels (the timeline shows the gaps): "
                                        "Python work, logging, checkpointing or communication waits")
        findings.append(
            Finding(
                rule=ctx.spec.id,
                title=ctx.spec.title,
                severity=Severity.high if utilization < ctx.threshold("high_utilization") else Severity.medium,
                confidence=0.8,
                saving=saving(ctx, per_step, "the GPU's idle time per step: the upper bound if it were kept busy"),
                message=message,
                recommendation=f"Keep the GPU fed: {advice}.",
                evidence=[e for e in evidence if e is not None],
                metrics={"utilization": utilization, "idle_ns_per_step": per_step, "device": key,
                         "top_cause": top_reason},
            )
        )
    return findings


def _idle_at_pace(ctx: RuleContext, per_step: float) -> float | None:
    """The GPU's idle time per step at the job's own pace: what the profiler cost the host
    (the step graph replayed with it and without it) taken off the recorded idle; None where
    the pace is the recorded one."""
    model = ctx.model
    if model is None or not model.pace.changes:
        return None
    graph = model.graph
    return max(per_step - max(graph.recorded_baseline - graph.baseline, 0.0), 0.0)
