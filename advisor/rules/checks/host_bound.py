"""host-bound: the step waits on the host's own Python work, named by function and line.

Work a script does in Python outside the model (a per-sample augmentation, building a
batch by hand, per-step bookkeeping) runs between the model's phases while nothing else
can: on a CPU the step is that much longer, on a GPU the device idles. The stack samples
(the python_hotspots table) name the user's functions that take the time outside every
phase; data loading has its own rule (dataloader-starvation), the model's own ops are
not this rule's.
"""

from __future__ import annotations

from typing import Any

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import ms, pct, row_evidence, saving, severity_by_share
from advisor.rules.registry import RuleContext, register


@register("host-bound")
def check(ctx: RuleContext) -> list[Finding]:
    hotspots = ctx.table("python_hotspots")
    if hotspots is None or not len(hotspots) or "other_ns" not in hotspots.columns:
        return []
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
