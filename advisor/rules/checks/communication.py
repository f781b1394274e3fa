"""communication-not-overlapped: collectives the computation does not hide, on one rank.

The distributed table splits the GPU's time into communication (NCCL kernels) and
computation and says how much of each ran alone. Communication that runs with no
computation beside it lengthens the step by its own time wherever the GPU sets the pace;
DDP hides all-reduce behind the rest of backward bucket by bucket, FSDP prefetches the
next layer's all-gather, accumulation skips it on all but the last micro-batch. The part
overlap can still hide is at most the computation that runs alone today, and like every
GPU-side saving it counts only where the GPU, not the host, sets the step's pace.
"""

from __future__ import annotations

from advisor.findings import Finding
from advisor.rules.checks.common import gpu_speedup_cap, ms, pct, row_evidence, saving, severity_by_share, value
from advisor.rules.registry import RuleContext, register


@register("communication-not-overlapped")
def check(ctx: RuleContext) -> list[Finding]:
    table = ctx.table("distributed")
    step = ctx.mean_step_ns
    if table is None or not len(table) or not step:
        return []
    steps = max(ctx.step_count, 1)
    alone = float(value(table, "Communication (not overlapped)", "total_ns", 0.0) or 0.0) / steps
    comm = float(value(table, "Communication", "total_ns", 0.0) or 0.0) / steps
    compute_alone = float(value(table, "Computation (not overlapped)", "total_ns", 0.0) or 0.0) / steps
    if alone / step < ctx.threshold("min_share") or alone < ctx.threshold("min_saving_ms") * 1e6:
        return []
    hideable = min(alone, compute_alone)
    # Collectives that overlap nothing today were issued after the computation (an
    # all-reduce by hand after backward): bucketed overlap hides nearly all of them, where
    # collectives already partly overlapped keep their exposed tail.
    nothing_overlaps = alone >= (1 - ctx.threshold("no_overlap_share")) * comm
    share = ctx.threshold("after_compute_hidden_share" if nothing_overlaps else "hidden_share")
    point, capped = gpu_speedup_cap(ctx, hideable * share)
    high, _ = gpu_speedup_cap(ctx, hideable)
    if point < ctx.threshold("min_saving_ms") * 1e6:
        return []
    where = "on the GPU" if ctx.gpu_measured else "on gloo's threads"
    message = (f"Collectives run {ms(comm)} per step {where}, {ms(alone)} of it ({pct(alone / step)} of the step) with "
               f"no computation beside them; {ms(compute_alone)} of computation per step runs alone, so overlap "
               f"could hide up to {ms(hideable)}." + (f" {capped}" if capped else ""))
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, point / step),
        confidence=0.6,
        saving=saving(ctx, point, "the communication that runs alone, as far as the computation that runs alone "
                                  "could hide it, less what stays exposed (the last bucket, the first layer)",
                      low_ns=point * ctx.threshold("saving_low_share"), high_ns=high,
                      remains="The step keeps the communication no computation is left to hide (the last "
                              "gradient bucket, the first layer's gather) and all the computation."),
        message=message,
        recommendation=("Overlap the collectives with computation: with DDP, smaller buckets start the "
                        "all-reduce earlier in backward (DistributedDataParallel(bucket_cap_mb=...), "
                        "gradient_as_bucket_view=True), and with gradient accumulation wrap all but the last "
                        "micro-batch in model.no_sync(); with FSDP, backward_prefetch=BACKWARD_PRE and "
                        "forward_prefetch=True; an all-reduce written by hand after backward does none of this: "
                        "use DDP or register it as a gradient hook."),
        evidence=[e for e in (
            row_evidence("distributed", table, "Communication (not overlapped)", "total_ns",
                         "collectives with no computation beside them, in the window"),
            row_evidence("distributed", table, "Computation (not overlapped)", "total_ns"),
            row_evidence("distributed", table, "Overlap", "total_ns"),
        ) if e is not None],
        metrics={"alone_ns_per_step": alone, "comm_ns_per_step": comm, "hideable_ns_per_step": hideable},
    )]
