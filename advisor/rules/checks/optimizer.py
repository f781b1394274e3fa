"""optimizer-not-fused and grad-zeroing-memsets: per-parameter work in the optimizer's
calls that a one-word change removes, judged from the optimizer table.

Both are host dispatch on a GPU: a single-tensor optimizer step runs a few operators per
parameter, each launching a tiny kernel; zero_grad(set_to_none=False) runs an
``aten::zero_`` and a fill kernel per parameter. foreach / fused optimizers and
set_to_none=True (torch's default since 2.0) do the same work in a few launches or none.
On a CPU neither holds: the operators are the arithmetic itself, foreach runs slower there
and fresh gradients cost allocations, so both rules judge GPU runs only. The step can
shrink by at most the GPU's idle time: per step where the host runs ahead of the GPU, and
only while the call runs where the host waits for the GPU every step (it would only wait
longer at the next sync).
"""

from __future__ import annotations

import pandas as pd

from advisor.findings import Finding
from advisor.rules.checks.common import gpu_idle_per_step, ms, pct, row_evidence, saving, severity_by_share, value
from advisor.rules.registry import RuleContext, register


def _idle_cap(ctx: RuleContext, row: pd.Series) -> tuple[float | None, str]:
    """The most a faster optimizer call can take off the step, and in words why.

    Where the host waits for the GPU every step (a .item(), a copy from pageable memory),
    host time saved in the call only moves the host's wait: the step shrinks by at most
    the GPU's idle time while the call ran (the GPU may still be busy with backward). With
    no such wait the host runs ahead, and any of the step's GPU idle time can go.
    """
    balance = ctx.table("step_gpu")
    row_key = "mean" if balance is not None and "mean" in balance.index else "window"
    waits = float(value(balance, row_key, "blocking_calls", 0.0) or 0.0)
    in_call = row.get("gpu_idle_per_step_ns")
    if waits >= ctx.threshold("waits_per_step") and in_call is not None and not pd.isna(in_call):
        return float(in_call), (f"the GPU idles only {ms(float(in_call))} per step while it runs and the host waits "
                                "for the GPU every step, so a faster call saves that idle time and part of the GPU's "
                                "own time in these kernels, not the host's time")
    idle = gpu_idle_per_step(ctx)
    return idle, ""


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
        idle, why = _idle_cap(ctx, row)
        ops, host = float(row["ops_per_step"]), float(row["op_host_per_step_ns"])
        distinct = max(float(row["distinct_ops"]), 1.0)
        # foreach keeps a few operators per list, and their per-tensor host work (about a
        # quarter of the single-tensor time on the traces measured); at most it keeps one
        # operator per kind.
        point, high = host * (1 - ctx.threshold("kept_share")), host * (1 - distinct / ops)
        low, uncapped = host * ctx.threshold("saving_low_share"), point
        if idle is not None:
            point, low, high = min(point, idle), min(low, idle), min(high, idle)
        if why:
            # The host waits for the GPU each step, so the GPU's own time in the tiny
            # per-parameter kernels (launch-floor bound) is on the step's path too: a
            # foreach step does the same bytes in a few kernels.
            gpu = float(row["gpu_per_step_ns"] or 0.0)
            point += gpu * (1 - ctx.threshold("kept_share"))
            low += gpu * ctx.threshold("saving_low_share")
            high += gpu * (1 - distinct / ops)
        if point < ctx.threshold("min_saving_ms") * 1e6:
            continue
        owner = str(key).partition("#")[2].split(".")[0] or "the optimizer"
        message = (f"{key} runs the single-tensor implementation: {ops:.0f} operators a step ({row['op_names']}), "
                   f"{float(row['kernels_per_step']):.0f} kernels, a few per parameter; the host spends "
                   f"{ms(host)} per step in them ({pct(host / step)} of the step) while their GPU work takes "
                   f"{ms(float(row['gpu_per_step_ns']))}" + (f"; {why}." if why and point < uncapped else "."))
        findings.append(Finding(
            rule=ctx.spec.id,
            title=ctx.spec.title,
            severity=severity_by_share(ctx, point / step),
            confidence=0.7,
            saving=saving(ctx, point, "the optimizer operators' host time per step, less what a foreach step "
                                      "keeps; at most the GPU idle time a faster call can fill",
                          low_ns=low, high_ns=high,
                          remains=f"The step keeps the optimizer's GPU work ({ms(float(row['gpu_per_step_ns']))}), "
                                  "its Python around the operators, and a few multi-tensor launches."),
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
            metrics={"ops_per_step": ops, "op_host_per_step_ns": host, "gpu_idle_per_step_ns": idle},
        ))
    return findings


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
        idle, _ = _idle_cap(ctx, row)
        zeros, host = float(row["zero_ops_per_step"]), float(row["op_host_per_step_ns"])
        gpu = float(row["gpu_per_step_ns"])
        # set_to_none removes the operators and their fills; backward then writes each
        # gradient instead of adding to zeros, which costs nothing more on the GPU.
        point = max(host if idle is None else min(host, idle), gpu)
        if point < ctx.threshold("min_saving_ms") * 1e6:
            continue
        high = max(float(row["host_per_step_ns"]) if idle is None else min(float(row["host_per_step_ns"]), idle), point)
        message = (f"{key} zeroes every gradient each step: {zeros:.0f} aten::zero_ calls, each launching a fill "
                   f"kernel ({float(row['kernels_per_step']):.0f} kernels, {ms(gpu)} of GPU time); the host spends "
                   f"{ms(host)} per step dispatching them ({pct(host / step)} of the step).")
        findings.append(Finding(
            rule=ctx.spec.id,
            title=ctx.spec.title,
            severity=severity_by_share(ctx, point / step),
            confidence=0.75,
            saving=saving(ctx, point, "the zeroing operators' host time per step (or their GPU time, if larger); at "
                                      "most the GPU's idle time per step",
                          low_ns=point * ctx.threshold("saving_low_share"), high_ns=high,
                          remains="The step keeps zero_grad's Python loop over the parameters, now setting each "
                                  "gradient to None."),
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
        ))
    return findings
