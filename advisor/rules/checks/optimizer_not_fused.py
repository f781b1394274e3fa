"""optimizer-not-fused: an optimizer step that runs a few operators per parameter, where
one word (foreach=True or fused=True) makes it a few operators for all of them, judged from
the optimizer table.

On a GPU, a single-tensor step launches a tiny kernel per operator per parameter; foreach
and fused optimizers do the same work in a few launches. The saving is the fix replayed on
the step graph: the host's time in the optimizer's step cut to what a foreach step keeps,
its kernels' GPU time likewise (the same bytes in a few kernels); the graph says how much
of that the step loses, whether the host runs ahead of the GPU or waits for it every step.

On a CPU, the operators are the arithmetic itself, each a full pass over a parameter's
memory; foreach runs slower there, but fused=True (Adam, AdamW, Adagrad, SGD; torch 2.4 or
later) updates each parameter in one pass. torch's default on a CPU is the single-tensor
step. The saving is the optimizer's step replayed at the share of its time a fused step
keeps, measured per optimizer (benchmarks/cpu_fused_optimizer.py): on parameters that fit
the CPU's caches, the median (Adam and AdamW keep about 0.3 of it, Adagrad 0.4, SGD with
momentum 0.6); on its time spent on tensors past them (the optimizer table's
large_op_share), where each pass goes to memory, the least measured (0.13, 0.2, 0.5),
which is also the high end. Plain SGD is one pass already (0.83-1.07): not named.
"""

from __future__ import annotations

import re

import pandas as pd

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.whatif import Fix


# The optimizers torch fuses on a CPU, by the name their step range carries
# (Optimizer.step#AdamW.step), and the threshold holding the share of the step's time a
# fused step keeps. SGD pays only with momentum (a buffer updated in the same pass).
CPU_FUSED = {"Adam": "cpu_kept_adam", "AdamW": "cpu_kept_adam", "Adagrad": "cpu_kept_adagrad",
             "SGD": "cpu_kept_sgd_momentum"}


@register("optimizer-not-fused")
def check_optimizer(ctx: RuleContext) -> list[Finding]:
    calls = ctx.table("optimizer")
    step = ctx.mean_step_ns or 0.0
    if calls is None or not len(calls) or not step or ctx.model is None:
        return []
    steps = calls[calls["call"] == "step"]
    kernels = steps["kernels_per_step"].fillna(0)
    findings = []
    if ctx.gpu_measured:
        single = steps[(steps["implementation"] == "single-tensor")
                       & (steps["ops_per_step"] >= ctx.threshold("min_ops_per_step"))
                       # the parameters are on the GPU: the operators launch kernels
                       & (kernels >= 0.5 * steps["ops_per_step"])]
        findings += [f for key, row in single.iterrows() if (f := _gpu_finding(ctx, key, row, step)) is not None]
    # The parameters are on the CPU: the operators launch nothing (where the host launched
    # kernels the trace did not record, the job ran on a GPU). A CPU run judged for a GPU
    # (--gpu) asks what that GPU would do, where the parameters would be on it.
    if ctx.model.facts.unrecorded_launches or ctx.model.session.meta.target_gpu:
        return findings
    on_cpu = steps[steps["implementation"].isin(("single-tensor", "foreach")) & (kernels == 0)
                   & (steps["ops_per_step"] > 0)]
    findings += [f for key, row in on_cpu.iterrows() if (f := _cpu_finding(ctx, key, row, step)) is not None]
    return findings


def _owner(key: object) -> str:
    """The optimizer's class from its step range's name: Optimizer.step#AdamW.step -> AdamW."""
    return str(key).partition("#")[2].split(".")[0]


def _evidence(calls, key) -> list:
    return [e for e in (
        row_evidence("optimizer", calls, key, "implementation"),
        row_evidence("optimizer", calls, key, "ops_per_step"),
        row_evidence("optimizer", calls, key, "op_host_per_step_ns", "host time in its operators per step"),
        row_evidence("optimizer", calls, key, "kernels_per_step"),
    ) if e is not None]


def _per_recorded_step(ctx: RuleContext, host: float) -> str:
    """'8.00 ms per recorded step (40.0% of the recorded step)': the table's figures are per
    recorded step, not the job's unrecorded one."""
    recorded = ctx.model.recorded_step_ns
    return f"{ms(host)} per recorded step" + (f" ({pct(host / recorded)} of the recorded step)" if recorded > 0 else "")


def _finding(ctx: RuleContext, estimate, step: float, fix: Fix, **parts) -> Finding:
    """The finding of either branch: its severity from the share of the step it saves (the
    run's step, as the saving says it: periodic work spread over the steps included)."""
    return Finding(rule=ctx.spec.id, title=ctx.spec.title, confidence=0.7, saving=estimate,
                   severity=severity_by_share(ctx, estimate.share_of_step), **parts).with_fix(fix)


def _gpu_finding(ctx: RuleContext, key, row, step: float) -> Finding | None:
    calls = ctx.table("optimizer")
    ops, host = float(row["ops_per_step"]), float(row["op_host_per_step_ns"])
    distinct = max(float(row["distinct_ops"]), 1.0)
    # foreach keeps a few operators per list, and their per-tensor host work (about a
    # quarter of the single-tensor time on the traces measured); at most it keeps one
    # operator per kind.
    kept = ctx.threshold("kept_share")
    spans = ctx.model.host_ranges(re.escape(str(key)))
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
        return None
    estimate, _ = found
    point = estimate.ms_per_step * 1e6
    if point < ctx.threshold("min_saving_ms") * 1e6:
        return None
    owner = _owner(key) or "the optimizer"
    message = (f"{key} runs the single-tensor implementation: {ops:.0f} operators a step ({row['op_names']}), "
               f"{float(row['kernels_per_step']):.0f} kernels, a few per parameter; the host spends "
               f"{_per_recorded_step(ctx, host)} in them while their GPU work takes "
               f"{ms(float(row['gpu_per_step_ns']))}.")
    return _finding(
        ctx, estimate, step, fix(kept),
        message=message,
        recommendation=(f"Construct the optimizer with foreach=True, torch.optim.{owner}(params, ..., "
                        "foreach=True): one launch per list of tensors; or with fused=True where torch has a "
                        "fused version of it (Adam, AdamW and, in recent torch, SGD): one kernel for the whole "
                        "update. torch picks foreach by itself only when every parameter is a CUDA tensor and "
                        "foreach is not set to False."),
        evidence=_evidence(calls, key),
        metrics={"ops_per_step": ops, "op_host_per_step_ns": host, "fix_foreach": 1.0},
    )


def _cpu_finding(ctx: RuleContext, key, row, step: float) -> Finding | None:
    calls = ctx.table("optimizer")
    owner = _owner(key)
    names = str(row["op_names"])
    if owner not in CPU_FUSED or (owner == "SGD" and "aten::mul_" not in names):  # plain SGD: one pass already
        return None
    # The time on tensors past the caches (large_op_share) keeps the large tensors' share.
    large_share = float(row["large_op_share"]) if pd.notna(row["large_op_share"]) else 0.0
    small, large = ctx.threshold(CPU_FUSED[owner]), ctx.threshold(CPU_FUSED[owner] + "_large")
    kept = small * (1 - large_share) + large * large_share
    spans = ctx.model.host_ranges(re.escape(str(key)))

    def fix(share: float) -> Fix:
        return Fix(f"fused step keeping {share:.0%}", host_spans=((spans, share),))

    found = replayed(ctx, fix(kept), f"the step replayed with the optimizer step's time cut to the {kept:.0%} a fused "
                                     f"{owner} step keeps on a CPU (benchmarks/cpu_fused_optimizer.py)",
                     low=fix(1 - ctx.threshold("saving_low_share") * (1 - kept)),
                     high=fix(min(large, kept)),
                     remains=f"The step keeps one pass over each parameter, its gradient and the {owner} state: "
                             "the update's own arithmetic.")
    if found is None:
        return None
    estimate, _ = found
    point = estimate.ms_per_step * 1e6
    # A few tenths of a percent of a CPU step is within its own noise: not worth a finding.
    if point < ctx.threshold("min_saving_ms") * 1e6 or point < ctx.threshold("cpu_min_share") * step:
        return None
    ops, host = float(row["ops_per_step"]), float(row["host_per_step_ns"])
    implementation = str(row["implementation"])
    message = (f"{key} runs the {implementation} implementation on the CPU: {ops:.0f} operators a step "
               f"({names}), a few passes over each parameter's memory; the step takes "
               f"{_per_recorded_step(ctx, host)}.")
    why_not_foreach = (" foreach=True is slower than the default on a CPU; the script sets it: replace it"
                       if implementation == "foreach" else " foreach=True is no help on a CPU")
    return _finding(
        ctx, estimate, step, fix(kept),
        message=message,
        recommendation=(f"Construct the optimizer with fused=True, torch.optim.{owner}(params, ..., fused=True) "
                        "(torch 2.4 or later): one pass over each parameter does the whole update, where torch's "
                        f"default on a CPU runs a few operators per parameter.{why_not_foreach}. The update is "
                        "the same, its arithmetic rounded in a different order."),
        evidence=_evidence(calls, key) + [e for e in (
            row_evidence("optimizer", calls, key, "host_per_step_ns", "the optimizer step's host time per step"),
        ) if e is not None],
        metrics={"ops_per_step": ops, "host_per_step_ns": host, "fix_fused": 1.0, "fix_foreach": 0.0},
    )
