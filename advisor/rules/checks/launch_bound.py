"""launch-bound: the GPU waits while the host dispatches many short kernels, one by one.

Measure (the step model's partition, the gpu_idle and step_gpu tables): the GPU's idle
time with the host in launch calls or inside the model (operators and the Python between
them), the kernels a step launches and how many run under 10 us, and the host's own cost
per kernel: its time inside the model per step over the kernels it launches.

Decide: launch overhead explains the idle time only where there are many short kernels
and each costs the host a small, ordinary amount (``max_host_per_kernel_us``): then the
host's dispatch rate, not the GPU, sets the pace, and capturing the step in a CUDA graph or
compiling it cuts the number of launches. Where each kernel costs the host far more, the
host itself is slow (CPU-heavy operators, contention, hooks on every operator): that is
host-bound's to say, not this rule's. A profile already on graphs or compiled kernels is
not told to use them: it is told what the host still does around them.

The saving is the fix replayed on the step graph: the host's time inside the model and in
launch calls cut to what a graph replay keeps (``kept_after_graphs``); on a compiled or
graph-replayed profile, the host work around the replays.

Word: the finding, naming the Python the host runs between operators where the trace has it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share, value
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.whatif import Fix
from advisor.tables.gpu_idle_host import REST


@dataclass
class Measure:
    in_calls: float  # GPU idle per step, host in launch calls, ns
    in_model: float  # GPU idle per step, host inside the model, ns
    step: float  # the recorded steps' mean (StepModel.recorded_step_ns): the steps the idle is per step of
    kernels: float
    short: float
    launches: float
    host_per_kernel: float  # the host's time inside the model per kernel it launches, ns
    graph_share: float  # GPU time from CUDA graph replays
    triton_share: float  # GPU time in compiled (Triton) kernels
    idle: float  # the GPU's idle time per step, ns
    balance_row: str

    @property
    def dispatch(self) -> float:
        return self.in_calls + self.in_model

    @property
    def compiled(self) -> bool:
        return self.graph_share >= 0.5 or self.triton_share >= 0.5


def measure(ctx: RuleContext) -> Measure | None:
    idle, balance = ctx.table("gpu_idle"), ctx.table("step_gpu")
    if not ctx.gpu_measured or ctx.model is None or idle is None or not len(idle) or balance is None \
            or not len(balance):
        return None
    steps = max(ctx.model.partition.steps, 1)
    in_calls = float(value(idle, "launch calls", "idle_ns", 0.0) or 0.0) / steps
    in_model = float(value(idle, "host in model", "idle_ns", 0.0) or 0.0) / steps
    row = "mean" if "mean" in balance.index else "window"
    kernels = float(value(balance, row, "kernels", 0.0) or 0.0)
    graph = ctx.model.graph
    host_model = float(graph.paced_duration[graph.host_nodes("model", "launch")].sum()) / steps  # at the job's pace
    origin = ctx.table("gpu_origin")
    window_idle = float(idle[idle["in_window"].astype(bool)]["idle_ns"].sum()) / steps if "in_window" in idle else 0.0
    return Measure(in_calls, in_model, ctx.model.recorded_step_ns, kernels,
                   float(value(balance, row, "short_kernels", 0.0) or 0.0),
                   float(value(balance, row, "launches", 0.0) or 0.0),
                   host_model / kernels if kernels else math.inf,
                   float(value(origin, "CUDA graph replays", "share_of_gpu", 0.0) or 0.0),
                   _triton_share(origin), window_idle, row)


def _triton_share(origin: pd.DataFrame | None) -> float:
    if origin is None or not len(origin) or "triton_ns" not in origin.columns:
        return 0.0
    total = float(origin["gpu_ns"].sum())
    return float(origin["triton_ns"].sum()) / total if total else 0.0


@dataclass
class Verdict:
    fix: Fix
    low: Fix
    high: Fix
    basis: str
    remains: str


def decide(ctx: RuleContext, m: Measure) -> Verdict | None:
    if not m.step or not m.kernels:
        return None
    share = m.dispatch / m.step
    if share < ctx.threshold("launch_share") or m.dispatch < ctx.threshold("min_saving_ms") * 1e6:
        return None
    # Dispatch must explain the idle time, not a corner of it: where data loading or a wait
    # holds most of it, that is the cause to fix first, and this one is judged again after.
    if m.idle and m.dispatch < ctx.threshold("explains_idle_share") * m.idle:
        return None
    # Many kernels, most of them short: the GPU runs each faster than the host dispatches it.
    if m.kernels < ctx.threshold("min_kernels") or m.short / m.kernels < ctx.threshold("min_short_share"):
        return None
    # Each costing the host an ordinary dispatch: a host far slower than that per kernel is
    # slow in itself (host-bound's), and graphs are not the first fix.
    if m.host_per_kernel > ctx.threshold("max_host_per_kernel_us") * 1e3:
        return None
    kept = ctx.threshold("kept_after_graphs")
    if m.compiled:
        # Graphs and compiled kernels already: what is left is the host work around them
        # (input copies, guards, the Python between replays), which a graph cannot take.
        return Verdict(Fix("less host work around the replays", {"model": 0.5, "launch": 0.5}),
                       Fix("less host work around the replays, at worst", {"model": 0.75, "launch": 0.75}),
                       Fix("no host work around the replays", {"model": 0.0, "launch": 0.0}),
                       "the step replayed with half the host's work inside the model and its launch calls gone",
                       "The step keeps the GPU's own work and the graph replays' launches.")
    return Verdict(Fix("CUDA graph or torch.compile", {"model": kept, "launch": kept}),
                   Fix("CUDA graph, at worst", {"model": 0.5, "launch": 0.5}),
                   Fix("CUDA graph, at best", {"model": 0.0, "launch": 0.0}),
                   "the step replayed with the host's dispatch inside the model (operators, Python between them, "
                   "launch calls) cut to what a CUDA graph replay keeps",
                   "The step keeps the GPU's own work, the host's time outside what the graph or compiler captures "
                   "(data loading, Python outside the model, waits), and a launch per graph.")


def _short(frame: str) -> str:
    """A Python frame "dir/file.py(12): fn" as "fn (file.py:12)"; other names as they are."""
    head, sep, function = frame.partition("): ")
    if not sep or "(" not in head:
        return re.sub(r" of type object at 0x[0-9a-f]+| at 0x[0-9a-f]+", "", frame)
    path, _, line = head.rpartition("(")
    return f"{function} ({path.rsplit('/', 1)[-1]}:{line})"


def _optimizer_share(calls, dispatch: float) -> str:
    """Where the optimizer's per-parameter calls (a single-tensor step, zeroed gradients)
    hold part of this idle time, say so: their own findings' savings overlap this one."""
    if calls is None or not len(calls) or "gpu_idle_per_step_ns" not in calls.columns:
        return ""
    rules = {"single-tensor": "optimizer-not-fused", "zero_": "grad-zeroing-memsets"}
    held = [(key, float(row["gpu_idle_per_step_ns"] or 0.0), rules[row["implementation"]])
            for key, row in calls.iterrows() if row["implementation"] in rules]
    held = [h for h in held if h[1] >= 0.05 * dispatch]
    if not held:
        return ""
    total = sum(ns for _, ns, _ in held)
    named = ", ".join(f"{key} {ms(ns)}" for key, ns, _ in held)
    fixes = list(dict.fromkeys(rule for _, _, rule in held))
    said = ("names that fix; the two savings" if len(fixes) == 1 else "name those fixes; the savings")
    return (f" {ms(total)} of this idle time falls in the optimizer's per-parameter calls ({named}): "
            f"{' and '.join(fixes)} {said} overlap, and the combined estimate counts it once.")


def word(ctx: RuleContext, m: Measure, v: Verdict) -> Finding | None:
    found = replayed(ctx, v.fix, v.basis, low=v.low, high=v.high, remains=v.remains)
    if found is None:
        return None
    estimate, _ = found
    steps = max(ctx.model.partition.steps, 1) if ctx.model is not None else 1
    host = ctx.table("gpu_idle_host")
    between = host[(host["source"] != "none") & (host["in_model_ns"] > 0)] if host is not None and len(host) else None
    share = m.dispatch / m.step
    busy = max(m.step - m.idle, 0.0)
    where = (f"while the host dispatches work: {ms(m.in_calls)} inside launch calls, {ms(m.in_model)} inside the model "
             "(its operators and the Python between them)")
    if between is not None and len(between[between.index != REST]):
        named = between[between.index != REST].sort_values("in_model_ns", ascending=False).head(3)
        parts = [f"{_short(n)} {pct(float(named.at[n, 'in_model_ns']) / steps / max(m.in_model, 1))}"
                 for n in named.index]
        where += " (largest: " + ", ".join(parts) + ")"
    message = (f"The GPU idles {ms(m.dispatch)} per step ({pct(share)} of the step) {where}: "
               f"{m.kernels:.0f} kernels a step, {m.short:.0f} of them ({pct(m.short / m.kernels)}) shorter than "
               f"10 us, from {m.launches:.0f} launch calls, each kernel costing the host {ms(m.host_per_kernel)} "
               f"inside the model; the GPU is busy about {ms(busy)} of the {ms(m.step)} step.")
    if m.compiled:
        message += (f" {pct(max(m.graph_share, m.triton_share))} of the GPU's time already comes from "
                    f"{'CUDA graph replays' if m.graph_share >= m.triton_share else 'compiled (Triton) kernels'}: "
                    "the idle time is the host's work around them.")
        recommendation = ("The step is already compiled or replayed from graphs: cut the host work around the "
                          "replays. Keep inputs in static buffers so the replay need not copy them, mark dynamic "
                          "shapes or batch sizes so guards do not fail and recompile, remove graph breaks "
                          "(torch._dynamo.explain shows them), and move per-step Python (logging, .item()) out of "
                          "the compiled region.")
    else:
        advice = [("capture the step in a CUDA graph, or let torch.compile(model, mode=\"reduce-overhead\") do it "
                   "(one replay launches every kernel)"),
                  "torch.compile without graphs still fuses elementwise chains into fewer kernels"]
        calls = ctx.table("optimizer")
        message += _optimizer_share(calls, m.dispatch)
        if calls is not None and len(calls) and (calls["implementation"] == "single-tensor").any():
            advice.append("use foreach or fused optimizers (torch.optim.AdamW(..., fused=True)): the optimizer "
                          "step launches kernels parameter by parameter (see optimizer-not-fused)")
        advice.append("raise the batch size: the same launches then do more work each")
        recommendation = "Cut the number of launches: " + "; ".join(advice) + "."
    idle = ctx.table("gpu_idle")
    balance = ctx.table("step_gpu")
    evidence = [
        row_evidence("gpu_idle", idle, "launch calls", "per_step_ns", "GPU idle per step, the host in launch calls"),
        row_evidence("gpu_idle", idle, "host in model", "per_step_ns", "GPU idle per step, the host in the model"),
        row_evidence("step_gpu", balance, m.balance_row, "kernels"),
        row_evidence("step_gpu", balance, m.balance_row, "short_kernels", "kernels under 10 us"),
        row_evidence("step_gpu", balance, m.balance_row, "launches"),
    ]
    if between is not None and (between.index != REST).any():
        top = between[between.index != REST]["in_model_ns"].idxmax()
        evidence.append(row_evidence("gpu_idle_host", host, top, "in_model_ns",
                                     "GPU idle while the host ran this inside the model"))
    metrics: dict[str, Any] = {"idle_dispatch_ns_per_step": m.dispatch, "idle_in_calls_ns_per_step": m.in_calls,
                               "idle_in_model_ns_per_step": m.in_model, "share": share, "kernels": m.kernels,
                               "short_kernels": m.short, "launches": m.launches,
                               "host_ns_per_kernel": m.host_per_kernel, "graph_share_of_gpu": m.graph_share,
                               "triton_share_of_gpu": m.triton_share, "compiled": m.compiled}
    return Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.7,
        saving=estimate,
        message=message,
        recommendation=recommendation,
        evidence=[e for e in evidence if e is not None],
        metrics=metrics,
    ).with_fix(v.fix)


@register("launch-bound")
def check(ctx: RuleContext) -> list[Finding]:
    m = measure(ctx)
    if m is None:
        return []
    v = decide(ctx, m)
    if v is None:
        return []
    finding = word(ctx, m, v)
    return [finding] if finding is not None else []
