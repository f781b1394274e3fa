"""launch-bound: the GPU waits while the host dispatches work, kernel by kernel.

Every kernel costs the host an operator's dispatch and a launch call, microseconds each
(tens where shapes and stacks are recorded); a kernel that runs for less than that leaves
the GPU idle until the next one arrives. The gpu_idle table's "launching" row is the GPU's
idle time while the host sat in an operator or a CUDA call, and the gpu_idle_host table's
in-model time is the Python it ran between operators inside the model (module calls,
argument handling): both are the price of dispatching op by op. The step_gpu table says how
many kernels a step launches and how many of them run under 10 us. Where that idle time
is a real share of the step, the cause is the number of launches, and the fixes are the
ones that cut it: capturing the step in a CUDA graph (one launch replays them all),
torch.compile (fewer, fused kernels; mode="reduce-overhead" adds the graph), fused or
foreach optimizers, larger batches (the same launches do more work).
"""

from __future__ import annotations

import re
from typing import Any

from advisor.findings import Finding
from advisor.rules.checks.common import gpu_idle_per_step, ms, pct, row_evidence, saving, severity_by_share, value
from advisor.rules.registry import RuleContext, register
from advisor.tables.gpu_idle_host import REST


@register("launch-bound")
def check(ctx: RuleContext) -> list[Finding]:
    idle, balance = ctx.table("gpu_idle"), ctx.table("step_gpu")
    if not ctx.gpu_measured or idle is None or not len(idle) or balance is None or not len(balance):
        return []
    steps = max(ctx.step_count, 1)
    in_ops = float(value(idle, "launching", "idle_ns", 0.0) or 0.0) / steps
    # Python the host runs between operators inside the model's phases is the other half
    # of eager dispatch (module calls, argument handling): graphs and compilation remove
    # it with the launches.
    host = ctx.table("gpu_idle_host")
    between = host[(host["source"] != "none") & (host["in_model_ns"] > 0)] if host is not None and len(host) else None
    in_python = float(between["in_model_ns"].sum()) / steps if between is not None else 0.0
    launching = in_ops + in_python
    step = ctx.mean_step_ns or 0.0
    if not step:
        return []
    share = launching / step
    if share < ctx.threshold("launch_share") or launching < ctx.threshold("min_saving_ms") * 1e6:
        return []
    row = "mean" if "mean" in balance.index else "window"
    kernels = float(value(balance, row, "kernels", 0.0) or 0.0)
    short = float(value(balance, row, "short_kernels", 0.0) or 0.0)
    launches = float(value(balance, row, "launches", 0.0) or 0.0)
    if not kernels:
        return []
    # The GPU's time in the step, whenever its work was launched (a step may run work
    # queued in the one before): the step less its idle time.
    idle_per_step = gpu_idle_per_step(ctx) or 0.0
    busy = max(step - idle_per_step, 0.0)
    short_share = short / kernels
    host_per_launch = in_ops / launches if launches else float("nan")
    gap = idle_per_step / kernels
    where = "while the host is inside operators and CUDA calls, dispatching work"
    if in_python >= 0.05 * launching and between is not None:
        named = between[between.index != REST].sort_values("in_model_ns", ascending=False).head(3)
        parts = [f"{_short(n)} {pct(float(named.at[n, 'in_model_ns']) / steps / in_python)}" for n in named.index]
        kinds = set(named["source"])
        what = "Python" if kinds == {"python"} else ("ranges" if kinds == {"range"} else "Python and ranges")
        where = (f"while the host dispatches work: {ms(in_ops)} inside operators and CUDA calls, {ms(in_python)} "
                 f"between them inside the step's forward, backward and optimizer phases (largest {what}: "
                 + ", ".join(parts) + ")")
    slow_host = ""
    if host_per_launch > ctx.threshold("slow_launch_us") * 1e3:
        slow_host = (f" Each launch costs the host {ms(host_per_launch)} of idle GPU time on average, where a few "
                     "microseconds is usual: the host itself is slow here (CPU contention, profiling with stacks or "
                     "shapes, hooks on every operator), which is worth ruling out first.")
    origin = ctx.table("gpu_origin")
    graphs = float(value(origin, "CUDA graph replays", "share_of_gpu", 0.0) or 0.0)
    already = (f" {pct(graphs)} of the GPU's time already comes from CUDA graph replays: the idle time is in what "
               "runs outside them." if graphs >= 0.5 else "")
    message = (f"The GPU idles {ms(launching)} per step ({pct(share)} of the step) {where}: "
               f"{kernels:.0f} kernels a step, {short:.0f} of them "
               f"({pct(short_share)}) shorter than 10 us, from {launches:.0f} launch calls; the GPU is busy "
               f"{ms(busy)} of the {ms(step)} step, and the mean gap between kernels is {ms(gap)}, about "
               f"{gap / (busy / kernels):.1f} times a kernel's mean run time.{already}{slow_host}")
    advice = [("capture the step in a CUDA graph, or let torch.compile(model, mode=\"reduce-overhead\") do it "
               "(one replay launches every kernel)"),
              "torch.compile without graphs still fuses elementwise chains into fewer kernels"]
    calls = ctx.table("optimizer")
    message += _optimizer_share(calls, launching)
    if calls is not None and len(calls) and (calls["implementation"] == "single-tensor").any():
        advice.append("use foreach or fused optimizers (torch.optim.AdamW(..., fused=True)): the optimizer step "
                      "launches kernels parameter by parameter (see optimizer-not-fused)")
    advice.append("raise the batch size: the same launches then do more work each")
    evidence = [
        row_evidence("gpu_idle", idle, "launching", "per_step_ns", "GPU idle per step while the host dispatched work"),
        row_evidence("step_gpu", balance, row, "kernels"),
        row_evidence("step_gpu", balance, row, "short_kernels", "kernels under 10 us"),
        row_evidence("step_gpu", balance, row, "launches"),
    ]
    if in_python and between is not None:
        top = between[between.index != REST]["in_model_ns"].idxmax() if (between.index != REST).any() else REST
        evidence.append(row_evidence("gpu_idle_host", host, top, "in_model_ns",
                                     "GPU idle while the host ran this Python between operators"))
    metrics: dict[str, Any] = {"idle_launching_ns_per_step": launching, "idle_in_ops_ns_per_step": in_ops,
                               "idle_python_ns_per_step": in_python, "share": share, "kernels": kernels,
                               "short_kernels": short, "launches": launches, "gap_ns": gap,
                               "host_ns_per_launch": host_per_launch, "graph_share_of_gpu": graphs}
    # Graph replay leaves a launch per graph and what cannot be captured (host syncs,
    # data-dependent shapes, collectives outside the graph): the point keeps a share of
    # the idle time, the range runs from half of it to all of it.
    kept = ctx.threshold("kept_after_graphs")
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, share),
        confidence=0.7,
        saving=saving(ctx, launching * (1 - kept),
                      "the GPU's idle time while the host dispatched work, less what a CUDA graph cannot "
                      "capture", low_ns=launching * 0.5, high_ns=launching,
                      remains=f"The step keeps the GPU's own {ms(busy)} of work, the host's time outside what the "
                              "graph or compiler captures (data loading, Python outside the phases, waits), and a "
                              "launch per graph."),
        message=message,
        recommendation="Cut the number of launches: " + "; ".join(advice) + ".",
        evidence=[e for e in evidence if e is not None],
        metrics=metrics,
    )]


def _short(frame: str) -> str:
    """A Python frame "dir/file.py(12): fn" as "fn (file.py:12)"; other names as they are."""
    head, sep, function = frame.partition("): ")
    if not sep or "(" not in head:
        return re.sub(r" of type object at 0x[0-9a-f]+| at 0x[0-9a-f]+", "", frame)
    path, _, line = head.rpartition("(")
    return f"{function} ({path.rsplit('/', 1)[-1]}:{line})"


def _optimizer_share(calls, launching: float) -> str:
    """Where the optimizer's per-parameter calls (a single-tensor step, zeroed gradients)
    hold part of this idle time, say so: their own findings' savings are part of this one."""
    if calls is None or not len(calls) or "gpu_idle_per_step_ns" not in calls.columns:
        return ""
    rules = {"single-tensor": "optimizer-not-fused", "zero_": "grad-zeroing-memsets"}
    held = [(key, float(row["gpu_idle_per_step_ns"] or 0.0), rules[row["implementation"]])
            for key, row in calls.iterrows() if row["implementation"] in rules]
    held = [h for h in held if h[1] >= 0.05 * launching]
    if not held:
        return ""
    total = sum(ns for _, ns, _ in held)
    named = ", ".join(f"{key} {ms(ns)}" for key, ns, _ in held)
    fixes = list(dict.fromkeys(rule for _, _, rule in held))
    said = ("names that fix, and its saving is" if len(fixes) == 1 else "name those fixes, and their savings are")
    return (f" {ms(total)} of this idle time falls in the optimizer's per-parameter calls ({named}): "
            f"{' and '.join(fixes)} {said} part of this one, not added to it.")
