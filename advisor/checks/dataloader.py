"""dataloader-starvation: the step waits on its input (Model Summary's Dataloader row)."""

from __future__ import annotations

from advisor.checks.common import ms, pct, row_evidence, saving, severity_by_share, value
from advisor.engine import RuleContext, register
from advisor.findings import Finding


@register("dataloader-starvation")
def check(ctx: RuleContext) -> list[Finding]:
    model = ctx.table("model")
    share = value(model, "Dataloader", "cpu_ratio")
    per_step = value(model, "Dataloader", "cpu_avg_ns")
    if share is None or per_step is None or not ctx.step_count:
        return []
    if share < ctx.threshold("dataloader_share") or per_step / 1e6 < ctx.threshold("min_saving_ms"):
        return []
    gpu_idle = ctx.table("gpu_idle")
    idle_loading = value(gpu_idle, "data loading", "per_step_ns")
    evidence = [
        row_evidence("model", model, "Dataloader", "cpu_ratio", "share of step time in the data loader"),
        row_evidence("model", model, "Dataloader", "cpu_avg_ns", "data loading per step"),
        row_evidence("perf", ctx.table("perf"), "reader_cost", "avg", "Perf summary reader_cost"),
        row_evidence("gpu_idle", gpu_idle, "data loading", "idle_ns", "GPU idle while the host loads data"),
    ]
    max_step = value(model, "Dataloader", "cpu_max_ns")
    message = (
        f"The data loader takes {pct(share)} of each step ({ms(per_step)} per step on average"
        + (f", up to {ms(max_step)}" if max_step else "")
        + f", over {ctx.step_count} steps)."
    )
    if ctx.gpu_measured and idle_loading:
        message += f" The GPU sits idle for {ms(idle_loading)} per step while the host loads data."
    elif not ctx.gpu_measured:
        message += " Nothing else runs in the process meanwhile; on a GPU the device would idle for that time."
    return [
        Finding(
            rule=ctx.spec.id,
            title=ctx.spec.title,
            severity=severity_by_share(ctx, share),
            confidence=0.9 if share >= ctx.threshold("medium_share") else 0.7,
            saving=saving(
                ctx,
                per_step,
                "the loader's whole time per step, recoverable when loading overlaps compute "
                "(worker processes and prefetching)",
            ),
            message=message,
            recommendation=(
                "Load batches in worker processes so they overlap compute: DataLoader(num_workers=N, "
                "pin_memory=True, persistent_workers=True, prefetch_factor=2), N up to the CPU cores "
                "you can spare; then cut per-item work in Dataset.__getitem__ (decode once, cache, "
                "augment on the GPU)."
            ),
            evidence=[e for e in evidence if e is not None],
            metrics={"dataloader_share": share, "dataloader_ns_per_step": per_step},
        )
    ]
