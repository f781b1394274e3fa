"""host-bound: the step waits on the host's own Python work, named by function and line.

Work a script does in Python outside the model (a per-sample augmentation, building a
batch by hand, per-step bookkeeping) runs between the model's phases while nothing else
can: on a CPU the step is that much longer, on a GPU the device idles. The stack samples
(the python_hotspots table) name the user's functions that take the time outside every
phase; on a trace, which has no samples, the gpu_idle_host table names the Python functions
or ranges the host was in while the GPU idled outside every phase; data loading has its own rule (dataloader-starvation), the model's own ops are
not this rule's.
"""

from __future__ import annotations

from typing import Any

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import ms, pct, row_evidence, saving, severity_by_share
from advisor.rules.registry import RuleContext, register
from advisor.tables.gpu_idle_host import NOTHING, REST


@register("host-bound")
def check(ctx: RuleContext) -> list[Finding]:
    hotspots = ctx.table("python_hotspots")
    if hotspots is None or not len(hotspots) or "other_ns" not in hotspots.columns:
        return _from_gpu_idle(ctx)
    main = hotspots[(hotspots["role"] == "main") & (hotspots["function"] != "")]
    outside = main["other_ns"].astype(float) * (1.0 - main["waiting_share"].fillna(0).astype(float))
    outside = outside[outside > 0].sort_values(ascending=False)
    step = ctx.mean_step_ns
    if not len(outside) or not step:
        return []
    total = float(outside.sum())
    share = total / step
    if share < ctx.threshold("host_share") or total < ctx.threshold("min_saving_ms") * 1e6:
        return []
    # Named by function (a loop body spreads its samples over several lines), each with
    # its busiest lines: at most max_listed functions, each at least min_line_share of
    # the step.
    rows = main.loc[outside.index].assign(outside_ns=outside)
    functions = rows.groupby(["file", "function"], sort=False)["outside_ns"].sum().sort_values(ascending=False)
    named = functions[functions >= ctx.threshold("min_line_share") * step].head(int(ctx.threshold("max_listed")))
    if not len(named):
        named = functions.head(1)
    lines = []
    evidence = []
    for (file, function), ns in named.items():
        mine = rows[(rows["file"] == file) & (rows["function"] == function)].sort_values("outside_ns", ascending=False)
        busiest = ", ".join(str(int(line)) for line in mine["line"].head(3))
        lines.append(f"{function} ({file}, line{'s' if len(mine) > 1 else ''} {busiest}): {ms(ns)} per step "
                     f"({pct(ns / step)})")
        top = mine.index[0]
        evidence.append(row_evidence("python_hotspots", hotspots, top, "other_ns",
                                     f"outside every phase; reached by {mine.at[top, 'stack']}"
                                     if mine.at[top, "stack"] else "outside every phase"))
        evidence.append(Evidence(kind="source_line", file=str(file), line=int(mine.at[top, "line"]),
                                 function=str(function), name=str(function),
                                 note=f"{ms(ns)} per step of host Python outside the model in {function}"))
    named_ns = float(named.sum())
    metrics: dict[str, Any] = {"host_ns_per_step": total, "share": share,
                               "functions": [{"file": file, "function": function, "ns_per_step": float(v)}
                                             for (file, function), v in named.items()]}
    message = (f"The host spends {ms(total)} of each {ms(step)} step ({pct(share)}) in the script's own Python outside "
               "the model's phases (data loading, forward, backward, optimizer), and the step waits for it: "
               + "; ".join(lines) + ".")
    recommendation = ("Take this work off the step's critical path: do it for the whole batch with tensor ops "
                      "instead of per sample in Python, or move it into a Dataset so DataLoader worker processes "
                      "run it while the model trains, or compute it once before training if it does not change.")
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, share),
        confidence=0.7,
        saving=saving(ctx, named_ns, "the named functions' time per step, recoverable where the work is vectorised "
                                     "or overlapped with compute; at most all of the script's own Python outside "
                                     "the model",
                      low_ns=named_ns * ctx.threshold("saving_low_share"), high_ns=total,
                      remains="The step keeps the model's own work and what the work costs once vectorised "
                              "(a few tensor calls per batch) or, moved into DataLoader workers, nothing on the "
                              "critical path while workers keep up."),
        message=message,
        recommendation=recommendation,
        evidence=[e for e in evidence if e is not None],
        metrics=metrics,
    )]


def _from_gpu_idle(ctx: RuleContext) -> list[Finding]:
    """A trace has no stack samples, but where the GPU was measured the gpu_idle_host
    table says what the host ran, outside the model's phases, while the GPU idled."""
    host = ctx.table("gpu_idle_host")
    step = ctx.mean_step_ns
    if host is None or not len(host) or not step:
        return []
    steps = max(ctx.step_count, 1)
    outside = (host["outside_model_ns"].astype(float) / steps).sort_values(ascending=False)
    outside = outside[outside > 0]
    total = float(outside.sum())
    share = total / step
    if not len(outside) or share < ctx.threshold("host_share") or total < ctx.threshold("min_saving_ms") * 1e6:
        return []
    named = outside[(outside >= ctx.threshold("min_line_share") * step) & (outside.index != REST)]
    named = named.head(int(ctx.threshold("max_listed")))
    if not len(named):
        named = outside.head(1)
    parts, evidence = [], []
    for key, ns in named.items():
        source, line = host.at[key, "source"], str(host.at[key, "user_line"] or "")
        where = {"python": "in", "range": "in the range", "none": "in"}.get(str(source), "in")
        parts.append(f"{where} {key}{f' (called from {line})' if line and line not in key else ''}: {ms(ns)} per step "
                     f"({pct(ns / step)})")
        evidence.append(row_evidence("gpu_idle_host", host, key, "outside_model_ns",
                                     "GPU idle, the host outside the model's phases and every operator"))
        file, _, number = line.rpartition(":")
        if file and number.isdigit():
            evidence.append(Evidence(kind="source_line", file=file, line=int(number), name=str(key),
                                     note=f"{ms(ns)} per step of GPU idle time under this line"))
    unrecorded = NOTHING in named.index
    named_ns = float(named.sum())
    message = (f"The GPU idles {ms(total)} of each {ms(step)} step ({pct(share)}) while the host runs work outside "
               "the model's phases (data loading, forward, backward, optimizer) and outside every operator: "
               + "; ".join(parts) + ".")
    if unrecorded:
        message += (" No Python function or range covers the time marked as not recorded: profile with "
                    "with_stack=True (or advisor diagnose train.py) to name the functions.")
    recommendation = ("Take this host work off the step's critical path: batch it with tensor ops, move it into a "
                      "Dataset so DataLoader workers run it, do it every N steps (logging, metrics, checkpoints), "
                      "or compute it once before training if it does not change.")
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, share),
        confidence=0.6,
        saving=saving(ctx, named_ns, "the GPU's idle time per step under the named host work outside the model; at "
                                     "most all of the idle time outside the model's phases",
                      low_ns=named_ns * ctx.threshold("saving_low_share"), high_ns=total,
                      remains="The step keeps the model's own work on the GPU and what the host work costs once "
                              "batched, overlapped or done less often."),
        message=message,
        recommendation=recommendation,
        evidence=[e for e in evidence if e is not None],
        metrics={"host_ns_per_step": total, "share": share,
                 "ranges": [{"name": str(k), "ns_per_step": float(v)} for k, v in named.items()]},
    )]
