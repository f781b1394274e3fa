"""optimizer-not-fused: a single-tensor optimizer step, per-parameter work that one word
(foreach=True, fused=True) removes, judged from the optimizer table.

A single-tensor step runs a few operators per parameter, each launching a tiny kernel;
foreach and fused optimizers do the same work in a few launches. On a CPU it does not hold:
the operators are the arithmetic itself and foreach runs slower there, so the rule judges
GPU runs only. The saving is the fix replayed on the step graph: the host's time in the
optimizer's step cut to what a foreach step keeps, its kernels' GPU time likewise (the
same bytes in a few kernels); the graph says how much of that the step loses, whether the
host runs ahead of the GPU or waits for it every step.
"""

from __future__ import annotations

import re

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.whatif import Fix


@register("optimizer-not-fused")
def check_optimizer(ctx: RuleContext) -> list[Finding]:
    calls = ctx.table("optimizer")
    step = ctx.mean_step_ns or 0.0
    if calls is None or not len(calls) or not ctx.gpu_measured or not step:
        return []
    single = calls[(calls["call"] == "step") & (calls["implementation"] == "single-tensor")
                   & (calls["ops_per_step"] >= ctx.threshold("min_ops_per_step"))
                   # the parameters are on the GPU: the operators launch kernels
                   & (calls["kernels_per_step"].fillna(0) >= 0.5 * calls["ops_per_step"])]
    if not len(single):
        return []
    findings = []
    for key, row in single.iterrows():
        ops, host = float(row["ops_per_step"]), float(row["op_host_per_step_ns"])
        distinct = max(float(row["distinct_ops"]), 1.0)
        # foreach keeps a few operators per list, and their per-tensor host work (about a
        # quarter of the single-tensor time on the traces measured); at most it keeps one
        # operator per kind.
        kept = ctx.threshold("kept_share")
        spans = ctx.model.host_ranges(re.escape(str(key))) if ctx.model is not None else None
        if spans is None:
            continue
        kernels = ctx.model.gpu_launched_in(spans)

        def fix(share: float) -> Fix:
            return Fix(f"foreach step keeping {share:.0%}", host_spans=((spans, share),),
                       gpu_rows={int(r): share for r in kernels})

        found = replayed(ctx, fix(kept), "the step replayed with the optimizer step's host time and kernels cut to "
                                         "what a foreach step keeps",
                         low=fix(1 - ctx.threshold("saving_low_share") * (1 - kept)), high=fix(distinct / ops),
                         remains=f"The step keeps the optimizer's GPU work ({ms(float(row['gpu_per_step_ns']))}) in a "
                                 "few multi-tensor kernels, its Python around the operators, and a few launches.")
        if found is None:
            continue
        estimate, _ = found
        point = estimate.ms_per_step * 1e6
        if point < ctx.threshold("min_saving_ms") * 1e6:
            continue
        owner = str(key).partition("#")[2].split(".")[0] or "the optimizer"
        message = (f"{key} runs the single-tensor implementation: {ops:.0f} operators a step ({row['op_names']}), "
                   f"{float(row['kernels_per_step']):.0f} kernels, a few per parameter; the host spends "
                   f"{ms(host)} per step in them ({pct(host / step)} of the step) while their GPU work takes "
                   f"{ms(float(row['gpu_per_step_ns']))}.")
        findings.append(Finding(
            rule=ctx.spec.id,
            title=ctx.spec.title,
            severity=severity_by_share(ctx, point / step),
            confidence=0.7,
            saving=estimate,
            message=message,
            recommendation=(f"Construct the optimizer with foreach=True, torch.optim.{owner}(params, ..., "
                            "foreach=True): one launch per list of tensors; or with fused=True where torch has a "
                            "fused version of it (Adam, AdamW and, in recent torch, SGD): one kernel for the whole "
                            "update. torch picks foreach by itself only when every parameter is a CUDA tensor and "
                            "foreach is not set to False."),
            evidence=[e for e in (
                row_evidence("optimizer", calls, key, "implementation"),
                row_evidence("optimizer", calls, key, "ops_per_step"),
                row_evidence("optimizer", calls, key, "op_host_per_step_ns", "host time in its operators per step"),
                row_evidence("optimizer", calls, key, "kernels_per_step"),
            ) if e is not None],
            metrics={"ops_per_step": ops, "op_host_per_step_ns": host},
        ).with_fix(fix(kept)))
    return findings
