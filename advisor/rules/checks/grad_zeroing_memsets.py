"""grad-zeroing-memsets: zero_grad(set_to_none=False) fills every gradient with zeros each
step, an ``aten::zero_`` and a fill kernel per parameter, judged from the optimizer table.

set_to_none=True (torch's default since 2.0) drops the gradients instead, and backward
writes them afresh, which costs nothing more on the GPU. On a CPU fresh gradients cost
allocations, so the rule judges GPU runs only. The saving is the fix replayed on the step
graph: the zeroing call's host time down to its Python loop, its fill kernels gone.
"""

from __future__ import annotations

import re

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.whatif import Fix


@register("grad-zeroing-memsets")
def check_zero_grad(ctx: RuleContext) -> list[Finding]:
    calls = ctx.table("optimizer")
    step = ctx.mean_step_ns or 0.0
    if calls is None or not len(calls) or not ctx.gpu_measured or not step:
        return []
    zeroing = calls[(calls["call"] == "zero_grad") & (calls["zero_ops_per_step"] >= ctx.threshold("min_zero_ops"))
                    & (calls["kernels_per_step"].fillna(0) > 0)]
    findings = []
    for key, row in zeroing.iterrows():
        zeros, host = float(row["zero_ops_per_step"]), float(row["op_host_per_step_ns"])
        gpu = float(row["gpu_per_step_ns"])
        spans = ctx.model.host_ranges(re.escape(str(key))) if ctx.model is not None else None
        if spans is None:
            continue
        fills = {int(r): 0.0 for r in ctx.model.gpu_launched_in(spans)}
        # What the call keeps: its Python loop over the parameters, setting each to None.
        whole = float(row["host_per_step_ns"]) or host
        kept = max(1.0 - host / whole, 0.0) if whole else 0.0
        fix = Fix("zero_grad(set_to_none=True)", host_spans=((spans, kept),), gpu_rows=fills)
        found = replayed(ctx, fix, "the step replayed with the zeroing operators and their fill kernels gone",
                         low=Fix("half the zeroing gone", host_spans=((spans, (1 + kept) / 2),),
                                 gpu_rows={r: 0.5 for r in fills}),
                         high=Fix("the whole call gone", host_spans=((spans, 0.0),), gpu_rows=fills),
                         remains="The step keeps zero_grad's Python loop over the parameters, now setting each "
                                 "gradient to None.")
        if found is None:
            continue
        estimate, _ = found
        if estimate.ms_per_step * 1e6 < ctx.threshold("min_saving_ms") * 1e6:
            continue
        message = (f"{key} zeroes every gradient each step: {zeros:.0f} aten::zero_ calls, each launching a fill "
                   f"kernel ({float(row['kernels_per_step']):.0f} kernels, {ms(gpu)} of GPU time); the host spends "
                   f"{ms(host)} per step dispatching them ({pct(host / step)} of the step).")
        findings.append(Finding(
            rule=ctx.spec.id,
            title=ctx.spec.title,
            severity=severity_by_share(ctx, estimate.share_of_step),
            confidence=0.75,
            saving=estimate,
            message=message,
            recommendation=("Call optimizer.zero_grad(set_to_none=True) (the default since torch 2.0) or "
                            "model.zero_grad(set_to_none=True): gradients are dropped instead of zeroed, and "
                            "backward writes them afresh. Code that reads .grad between zero_grad and backward must "
                            "then handle None."),
            evidence=[e for e in (
                row_evidence("optimizer", calls, key, "zero_ops_per_step"),
                row_evidence("optimizer", calls, key, "op_host_per_step_ns", "host time dispatching the zeroing"),
                row_evidence("optimizer", calls, key, "gpu_per_step_ns", "the fill kernels' GPU time"),
            ) if e is not None],
            metrics={"zero_ops_per_step": zeros, "op_host_per_step_ns": host, "gpu_per_step_ns": gpu},
        ).with_fix(fix))
    return findings
