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
from advisor.rules.checks.common import ms, pct, row_evidence, saving, severity_by_share, value
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.facts import COMM_KERNEL
from advisor.step.whatif import Fix


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
    fix = _overlap_fix(ctx, hideable * share, comm)
    found = replayed(ctx, fix, "the step replayed with the communication that runs alone hidden, as far as the "
                               "computation that runs alone could hide it, less what stays exposed (the last "
                               "bucket, the first layer)",
                     low=_overlap_fix(ctx, hideable * share * ctx.threshold("saving_low_share"), comm),
                     high=_overlap_fix(ctx, hideable, comm),
                     remains="The step keeps the communication no computation is left to hide (the last gradient "
                             "bucket, the first layer's gather) and all the computation.") if fix is not None else None
    if found is not None:
        estimate = found[0]
    else:
        estimate = saving(ctx, hideable * share, "the communication that runs alone, as far as the computation that "
                                                 "runs alone could hide it",
                          low_ns=hideable * share * ctx.threshold("saving_low_share"), high_ns=hideable)
    point = estimate.ms_per_step * 1e6
    if point < ctx.threshold("min_saving_ms") * 1e6:
        return []
    capped = (f"Hiding it saves the step {ms(point)}: the rest is time the host, not the GPU, sets."
              if point < 0.9 * hideable * share else "")
    where = "on the GPU" if ctx.gpu_measured else "on gloo's threads"
    message = (f"Collectives run {ms(comm)} per step {where}, {ms(alone)} of it ({pct(alone / step)} of the step) with "
               f"no computation beside them; {ms(compute_alone)} of computation per step runs alone, so overlap "
               f"could hide up to {ms(hideable)}." + (f" {capped}" if capped else ""))
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.6,
        saving=estimate,
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
    ).with_fix(fix)]


def _overlap_fix(ctx: RuleContext, hidden: float, comm: float) -> Fix | None:
    """Hiding ``hidden`` ns of a step's ``comm`` ns of communication, as a change to the
    step graph: the collectives' kernels on a GPU, the host's time in them on a CPU job
    (gloo), shortened by that share."""
    if ctx.model is None or comm <= 0:
        return None
    factor = max(1.0 - hidden / comm, 0.0)
    if ctx.gpu_measured:
        rows = ctx.model.gpu_named(COMM_KERNEL)
        return Fix("the collectives overlapped", gpu_rows={int(r): factor for r in rows}) if len(rows) else None
    return Fix("the collectives overlapped", {"comm": factor})
