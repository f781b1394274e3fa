"""low-gpu-utilization: a GPU busy for too little of the window, and why it idles."""

from __future__ import annotations

from advisor.findings import Finding, Severity
from advisor.rules.checks.common import ms, pct, row_evidence, saving
from advisor.rules.registry import RuleContext, register


@register("low-gpu-utilization")
def check(ctx: RuleContext) -> list[Finding]:
    device = ctx.table("device")
    if not ctx.gpu_measured or device is None or not len(device) or "kind" not in device.columns:
        return []
    gpus = device[device["kind"] == "gpu"]
    idle = ctx.table("gpu_idle")
    findings = []
    steps = max(ctx.step_count, 1)
    for key, row in gpus.iterrows():
        utilization = float(row["utilization"])
        if utilization >= ctx.threshold("utilization"):
            continue
        idle_ns = float(row["window_ns"] - row["busy_ns"])
        per_step = idle_ns / steps
        breakdown = []
        evidence = [
            row_evidence("device", device, key, "utilization", "busy share of the window"),
            row_evidence("overview", ctx.table("overview"), "Kernel", "gpu_ratio", "kernel time share"),
        ]
        if idle is not None and len(idle):
            for reason, idle_row in idle.sort_values("idle_ns", ascending=False).iterrows():
                if idle_row["idle_ns"] <= 0:
                    continue
                label = {"work queued": "work queued on the GPU", "data loading": "the host loading data",
                         "blocking sync": "the host blocked on the GPU", "launching": "the host launching",
                         "other": "the host elsewhere (Python, unrecorded)"}.get(str(reason), str(reason))
                breakdown.append(f"{label} {pct(float(idle_row['share_of_idle']))}")
                evidence.append(row_evidence("gpu_idle", idle, reason, "idle_ns", f"GPU idle while the host was in {reason}"))
        message = (
            f"{row.get('name', key)} is busy {pct(utilization)} of the {ms(row['window_ns'])} window "
            + (f"and idle {ms(per_step)} per step." if ctx.step_count else f"and idle {ms(idle_ns)} of it (no steps found).")
        )
        if breakdown:
            message += " While it idles: " + ", ".join(breakdown) + "."
        top_reason = str(idle["idle_ns"].idxmax()) if idle is not None and len(idle) and idle["idle_ns"].max() > 0 else ""
        advice = {
            "data loading": "fix the data loader first (see the data-loading finding)",
            "blocking sync": "remove host synchronisations from the loop first",
            "launching": "cut launch overhead: larger batches, fused or foreach optimizers, torch.compile, CUDA graphs",
            "work queued": "look at what the GPU's queued work waits on (events, other streams, communication with "
                           "peers): the host has already launched it",
        }.get(top_reason, "find what the host does between kernels (the timeline shows the gaps): "
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
                metrics={"utilization": utilization, "idle_ns_per_step": per_step, "device": key},
            )
        )
    return findings
