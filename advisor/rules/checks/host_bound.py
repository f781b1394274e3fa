"""host-bound: the step waits on the host's own work, named by function and line.

Two kinds of host work hold a step back:

- **outside the model**: work the script does between the model's phases (a per-sample
  augmentation, decoding a video and normalising its frames in a pipeline's preprocess,
  building a batch by hand, per-step bookkeeping) runs while nothing else can: on a CPU
  the step is that much longer, on a GPU the device idles. Named by the innermost
  function that takes the time and by the outermost call of the user's code around it
  (``preprocess``), wherever it runs: before the model's first kernel as well;
- **inside the model, on a slow host**: each kernel costs the host far more than an
  ordinary dispatch (``slow_host_per_kernel_us``): the operators' own CPU work, a busy or
  throttled CPU, hooks on every operator. Launch overhead is launch-bound's; this is the
  host being slow at it.

Measure: on a script's CPU run, the stack samples (python_hotspots) outside every phase;
on a GPU run, the step model's partition and the gpu_idle_host table, each idle
nanosecond once. Decide: a real share of the step. Word: the functions and lines, and the
fix; the saving is the named work replayed away on the step graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import ms, pct, row_evidence, saving, severity_by_share, value
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.whatif import Fix
from advisor.tables.gpu_idle_host import NOTHING, REST


@register("host-bound")
def check(ctx: RuleContext) -> list[Finding]:
    hotspots = ctx.table("python_hotspots")
    if not ctx.gpu_measured and hotspots is not None and len(hotspots) and "other_ns" in hotspots.columns:
        return _from_samples(ctx, hotspots)
    findings = []
    outside = _outside_model(ctx)
    if outside is not None:
        findings.append(outside)
    slow = _slow_host(ctx)
    if slow is not None:
        findings.append(slow)
    return findings


# -- outside the model, on a GPU run -----------------------------------------------------------------


@dataclass
class Outside:
    rows: pd.DataFrame  # gpu_idle_host rows with time outside the model, per step
    total: float  # per step, ns
    step: float  # the recorded steps' mean (StepModel.recorded_step_ns): the steps the idle is per step of
    by_caller: dict[str, float] = field(default_factory=dict)  # outermost user function -> ns per step


def _measure_outside(ctx: RuleContext) -> Outside | None:
    host = ctx.table("gpu_idle_host")
    if host is None or not len(host) or ctx.model is None:
        return None
    steps = max(ctx.model.partition.steps, 1)
    rows = host[host["outside_model_ns"] > 0].assign(ns=lambda t: t["outside_model_ns"] / steps)
    rows = rows.sort_values("ns", ascending=False)
    total = float(rows["ns"].sum())
    by_caller: dict[str, float] = {}
    for key, row in rows.iterrows():
        outer = str(row.get("outer_function") or "")
        if outer and key != NOTHING:
            label = f"{outer} ({str(row['outer_line']).rpartition('/')[2]})"
            by_caller[label] = by_caller.get(label, 0.0) + float(row["ns"])
    return Outside(rows, total, ctx.model.recorded_step_ns, by_caller)


def _outside_model(ctx: RuleContext) -> Finding | None:
    m = _measure_outside(ctx)
    if m is None or not m.step:
        return None
    share = m.total / m.step
    if share < ctx.threshold("host_share") or m.total < ctx.threshold("min_saving_ms") * 1e6:
        return None
    named = m.rows[(m.rows["ns"] >= ctx.threshold("min_line_share") * m.step) & (m.rows.index != REST)]
    named = named.head(int(ctx.threshold("max_listed")))
    if not len(named):
        named = m.rows.head(1)
    named_ns = float(named["ns"].sum())
    keep = max(1.0 - named_ns / m.total, 0.0) if m.total else 1.0
    steps = max(ctx.model.partition.steps, 1)

    def outside(factor: float) -> dict[str, float]:
        # The host outside the model, in a recorded range or in none (the graph's states).
        return {"outside": factor, "unrecorded": factor}

    fix = Fix("the named host work taken off the step", outside(keep))
    found = replayed(ctx, fix, "the step replayed without the named host work outside the model",
                     low=Fix("half the named host work", outside(1 - (1 - keep) * ctx.threshold("saving_low_share"))),
                     high=Fix("all the host work outside the model", outside(0.0)),
                     remains="The step keeps the model's own work and what the host work costs once batched, "
                             "overlapped or done less often.")
    if found is None:
        return None
    estimate, _ = found
    host = ctx.table("gpu_idle_host")
    parts, evidence = [], []
    for key, row in named.iterrows():
        line = str(row["user_line"] or "")
        function = str(row.get("user_function") or "")
        where = "in" if row["source"] != "range" else "in the range"
        label = "no recorded range" if key == NOTHING else _short(str(key))
        caller = f"{function}, {line.rpartition('/')[2]}" if function else line
        parts.append(f"{where} {label}{f' (called from {caller})' if line and line not in str(key) else ''}: "
                     f"{ms(float(row['ns']))} per step ({pct(float(row['ns']) / m.step)})")
        evidence.append(row_evidence("gpu_idle_host", host, key, "outside_model_ns",
                                     "GPU idle, the host outside the model"))
        file, _, number = line.rpartition(":")
        if file and number.isdigit():
            evidence.append(Evidence(kind="source_line", file=file, line=int(number), name=str(key),
                                     note=f"{ms(float(row['ns']))} per step of GPU idle time under this line"))
    callers = sorted(m.by_caller.items(), key=lambda kv: -kv[1])[:2]
    caller_text = ""
    if callers and callers[0][1] >= 0.5 * m.total:
        caller_text = (" All of it runs under " if callers[0][1] >= 0.95 * m.total else " Most of it runs under ") + \
            f"{callers[0][0]}, {ms(callers[0][1])} per step: the work to move or batch."
    message = (f"The GPU idles {ms(m.total)} of each {ms(m.step)} step ({pct(share)}) while the host works outside the "
               "model (outside its forward, backward and optimizer and every module's call): " + "; ".join(parts)
               + "." + caller_text)
    if NOTHING in named.index:
        message += (" No Python function or range covers the time marked as not recorded: profile with "
                    "with_stack=True (or advisor diagnose train.py) to name the functions.")
    recommendation = ("Take this host work off the step's critical path: do it on the whole batch with tensor ops "
                      "(on the GPU where it can run there), move it into a Dataset so DataLoader workers run it "
                      "ahead of the model (decoding, resizing, normalising, tokenizing), do it every N steps "
                      "(logging, metrics, checkpoints), or compute it once before the loop if it does not change.")
    return Finding(
        rule=ctx.spec.id, title=ctx.spec.title, severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.65, saving=estimate, message=message, recommendation=recommendation,
        evidence=[e for e in evidence if e is not None],
        metrics={"host_ns_per_step": m.total, "share": share, "where": "outside the model",
                 "callers": [{"function": k, "ns_per_step": v} for k, v in callers],
                 "ranges": [{"name": str(k), "ns_per_step": float(v)} for k, v in named["ns"].items()],
                 "steps": steps},
    ).with_fix(fix)


# -- inside the model, on a slow host -----------------------------------------------------------------


def _slow_host(ctx: RuleContext) -> Finding | None:
    idle, balance = ctx.table("gpu_idle"), ctx.table("step_gpu")
    if ctx.model is None or idle is None or not len(idle) or balance is None or not len(balance):
        return None
    steps = max(ctx.model.partition.steps, 1)
    row = "mean" if "mean" in balance.index else "window"
    kernels = float(value(balance, row, "kernels", 0.0) or 0.0)
    in_model = float(value(idle, "host in model", "idle_ns", 0.0) or 0.0) / steps
    in_calls = float(value(idle, "launch calls", "idle_ns", 0.0) or 0.0) / steps
    step = ctx.model.recorded_step_ns  # the steps the idle above is per step of
    if not kernels or not step:
        return None
    graph = ctx.model.graph
    host_model = float(graph.paced_duration[graph.host_nodes("model", "launch")].sum()) / steps  # at the job's pace
    per_kernel = host_model / kernels
    typical, against = _ordinary_dispatch(ctx)
    # Per kernel says something only where there are many: a step of four kernels and one
    # long allocation is not a slow host.
    slow = ctx.threshold("slow_host_per_kernel_us") * 1e3 * typical / (ctx.threshold("typical_host_per_kernel_us") * 1e3)
    if per_kernel <= slow or kernels < ctx.threshold("min_kernels"):
        return None
    share = (in_model + in_calls) / step
    if share < ctx.threshold("host_share"):
        return None
    # Why the host is slow is not in the profile, so the point is the host twice as fast
    # inside the model (what ruling out contention or per-operator hooks usually gives);
    # the range runs from a third faster to an ordinary eager dispatch per kernel.
    factor = min(typical / per_kernel, 1.0)
    fix = Fix("the host twice as fast inside the model", {"model": 0.5, "launch": 0.5})
    found = replayed(ctx, fix, "the step replayed with the host's work inside the model twice as fast",
                     low=Fix("the host a third faster inside the model", {"model": 0.75, "launch": 0.75}),
                     high=Fix("the host at an ordinary cost per kernel", {"model": factor, "launch": factor}),
                     remains="The step keeps the GPU's own work and the host's dispatch, twice as fast.")
    if found is None:
        return None
    estimate, _ = found
    host = ctx.table("gpu_idle_host")
    inside = host[host["in_model_ns"] > 0].sort_values("in_model_ns", ascending=False).head(4) \
        if host is not None and len(host) else None
    named = ", ".join(f"{_short(str(k))} {ms(float(v) / steps)}" for k, v in inside["in_model_ns"].items()) \
        if inside is not None and len(inside) else ""
    message = (f"The GPU idles {ms(in_model + in_calls)} per step ({pct(share)} of the step) while the host works "
               f"inside the model, and each of its {kernels:.0f} kernels a step costs the host {ms(per_kernel)}, "
               f"{per_kernel / typical:.0f} times an ordinary eager dispatch (about {ms(typical)}, {against}), at "
               "the job's own pace: the host is slow at the model's operators, not merely launching many of them"
               + (f" (largest: {named})." if named else "."))
    recommendation = ("Find why the host is slow before shrinking the launches: other processes or ranks sharing its "
                      "cores (taskset, one rank per NUMA node, OMP_NUM_THREADS), hooks or profiling on every "
                      "operator (with_stack and record_shapes multiply a dispatch's cost), operators doing real CPU "
                      "work on the step's path (DistributedDataParallel(broadcast_buffers=True) copies every buffer "
                      "each forward). Then take the host out of the loop: torch.compile fuses operators, a CUDA "
                      "graph replays them with no host work.")
    evidence = [row_evidence("gpu_idle", idle, "host in model", "per_step_ns", "GPU idle, the host in the model"),
                row_evidence("step_gpu", balance, row, "kernels")]
    if inside is not None and len(inside):
        evidence.append(row_evidence("gpu_idle_host", host, inside.index[0], "in_model_ns",
                                     "GPU idle while the host ran this inside the model"))
    return Finding(
        rule=ctx.spec.id, title=ctx.spec.title, severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.6, saving=estimate, message=message, recommendation=recommendation,
        evidence=[e for e in evidence if e is not None],
        metrics={"host_ns_per_step": in_model + in_calls, "share": share, "where": "inside the model",
                 "host_ns_per_kernel": per_kernel, "kernels": kernels},
    ).with_fix(fix)


def _ordinary_dispatch(ctx: RuleContext) -> tuple[float, str]:
    """What an ordinary eager dispatch costs the host per kernel on this machine, ns, and
    what that is measured against: the pack's figure, scaled by how fast this machine
    dispatched a cheap op in the run (the collector's calibration burst) against the pack's
    reference machine, where the run measured it."""
    typical = ctx.threshold("typical_host_per_kernel_us") * 1e3
    cost = ctx.model.session.meta.collector.cost if ctx.model is not None else None
    plain = cost.plain_ns_per_op if cost is not None else None
    reference = ctx.threshold("reference_op_dispatch_us") * 1e3
    if plain and plain > 0 and reference > 0:
        factor = max(plain / reference, 1.0)
        return typical * factor, (f"this machine dispatched a cheap op in {ms(plain)} in the run, "
                                  f"{factor:.1f} times the reference's {ms(reference)}")
    return typical, "the rule pack's figure; this run measured no dispatch"


def _short(frame: str) -> str:
    """A Python frame "dir/file.py(12): fn" as "fn (file.py:12)"; other names as they are."""
    head, sep, function = frame.partition("): ")
    if not sep or "(" not in head:
        return frame
    path, _, line = head.rpartition("(")
    return f"{function} ({path.rsplit('/', 1)[-1]}:{line})"


# -- a script's CPU run: stack samples --------------------------------------------------------------

# Library calls whose fix is not "vectorise it": what to do instead, with {where} the line.
_PARAMETER_LOOP = (
    "{where} walks the model's parameters outside the optimizer, an operator or two per parameter each step (a "
    "hand-written update such as p -= lr * p.grad, a clipping, an average): for an update use torch.optim "
    "(torch.optim.SGD(model.parameters(), lr=lr), fused=True on a CPU, foreach=True on a GPU), one call over every "
    "parameter; for clipping torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True); for anything else the "
    "torch._foreach_* operators (torch._foreach_add_(params, grads, alpha=-lr) under torch.no_grad()).")
# Calls whose advice is the whole fix of the function that makes them.
_IN_PLACE_CALLS = ("torch.nn.modules.module.parameters", "torch.nn.modules.module.named_parameters")
_CALL_ADVICE = {
    "copy.deepcopy": ("copy.deepcopy at {where} copies the whole object (a model: every parameter and buffer, "
                      "with new tensors) each time it runs: make the copy once before the loop and update it in "
                      "place (an exponential moving average: torch._foreach_lerp_(ema_params, params, 1 - decay) "
                      "under torch.no_grad(), or torch.optim.swa_utils.AveragedModel(model, "
                      "multi_avg_fn=get_ema_multi_avg_fn(decay)))."),
    # A loop over the parameters outside the optimizer: a hand-written update (p -= lr *
    # p.grad), a clipping or an average, an operator or two per parameter each step. Work on
    # the model's own tensors stays in the training process: no DataLoader can take it.
    "torch.nn.modules.module.parameters": _PARAMETER_LOOP,
    "torch.nn.modules.module.named_parameters": _PARAMETER_LOOP,
}


def _known_calls(rows: pd.DataFrame, named: pd.Series) -> list[tuple[str, str]]:
    """(call, advice) for the library calls of _CALL_ADVICE that the named functions' lines
    make, each once, at its busiest line."""
    if "calls" not in rows.columns:
        return []
    found: dict[str, str] = {}
    for (file, function), _ in named.items():
        mine = rows[(rows["file"] == file) & (rows["function"] == function)].sort_values("outside_ns", ascending=False)
        for _, row in mine.iterrows():
            call = str(row["calls"])
            if call in _CALL_ADVICE and call not in found:
                where = f"{function} ({str(file).rsplit('/', 1)[-1]}:{int(row['line'])})"
                found[call] = _CALL_ADVICE[call].format(where=where)
    return list(found.items())


def _backward_of_outside(ctx: RuleContext) -> list[tuple[float, str]]:
    """Backward's nodes made by operators called outside the model's phases, as (their share
    of the Backward phase, node kind); empty where the profile does not say (no
    autograd_nodes rows, or none of that work). Each kind's share of the nodes' recorded
    time is its share of the phase: the engine's own work between nodes (scheduling,
    accumulating gradients) grows with the nodes too."""
    nodes = ctx.table("autograd_nodes")
    if nodes is None or not len(nodes):
        return []
    all_nodes = float(nodes["ns_per_step"].sum())
    share = nodes["outside_share"].fillna(0.0).astype(float)
    # A kind made no more often than the model runs forward (a loss, a squeeze of its
    # output, once a pass) is the step's ordinary work, whatever it costs: only work
    # repeated within a pass (a loss looped over the batch) is what the fix removes.
    outside_calls = nodes["outside_calls_per_step"].fillna(0.0).astype(float)
    mine = nodes[(share >= ctx.threshold("min_outside_node_share")) & (outside_calls > _forward_passes(ctx))]
    if not len(mine) or all_nodes <= 0:
        return []
    return [(float(row["ns_per_step"]) * float(row["outside_share"]) / all_nodes, str(kind))
            for kind, row in mine.iterrows()]


def _forward_passes(ctx: RuleContext) -> float:
    """The model's forward passes per step (the Forward phase's calls; 1 where not known)."""
    calls = value(ctx.table("model"), "Forward", "calls")
    if calls is None or not ctx.step_count:
        return 1.0
    return max(float(calls) / ctx.step_count, 1.0)


def _calls(ctx: RuleContext, kind: str) -> float:
    return float(value(ctx.table("autograd_nodes"), kind, "calls_per_step", 0.0))


# The calls that open a phase of the model from the user's line (loss.backward(),
# optimizer.step()): their samples before the phase's mark and after it (autograd's and the
# optimizer's Python wrappers) fall outside every phase, but they are the phase's own
# work, which no vectorising of the script's code removes.
_PHASE_CALLS = ("torch._tensor.backward", "torch.autograd.backward", "torch.autograd.grad", "torch.optim.")


def _from_samples(ctx: RuleContext, hotspots: pd.DataFrame) -> list[Finding]:
    main = hotspots[(hotspots["role"] == "main") & (hotspots["function"] != "")]
    if "calls" in main.columns:
        main = main[~main["calls"].fillna("").astype(str).str.startswith(_PHASE_CALLS)]
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
        # The row is one line's, the figure above is the function's (all its lines): each
        # note says which, so the two figures side by side do not read as a contradiction.
        line_no = int(mine.at[top, "line"])
        where = f"line {line_no} alone, per step, outside every phase"
        evidence.append(row_evidence("python_hotspots", hotspots, top, "other_ns",
                                     f"{where}; reached by {mine.at[top, 'stack']}" if mine.at[top, "stack"]
                                     else where))
        evidence.append(Evidence(kind="source_line", file=str(file), line=line_no,
                                 function=str(function), name=str(function),
                                 note=f"{ms(ns)} per step of host Python outside the model in {function}, "
                                      f"line{'s' if len(mine) > 1 else ''} {busiest}"
                                      + (" and the rest of its lines" if len(mine) > 3 else "")))
    named_ns = float(named.sum())
    metrics: dict[str, Any] = {"host_ns_per_step": total, "share": share, "where": "outside the model",
                               "functions": [{"file": file, "function": function, "ns_per_step": float(v)}
                                             for (file, function), v in named.items()]}
    message = (f"The host spends {ms(total)} of each {ms(step)} step ({pct(share)}) in the script's own Python outside "
               "the model's phases (data loading, forward, backward, optimizer), and the step waits for it: "
               + "; ".join(lines) + ".")
    recommendation = ("Take this work off the step's critical path: do it for the whole batch with tensor ops "
                      "instead of per sample in Python, or move it into a Dataset so DataLoader worker processes "
                      "run it while the model trains, or compute it once before training if it does not change.")
    called = _known_calls(rows, named)
    remains = ("The step keeps the model's own work and what the work costs once vectorised (a few tensor calls "
               "per batch) or, moved into DataLoader workers, nothing on the critical path while workers keep up.")
    if called:
        metrics["calls"] = [call for call, _ in called]
        told = " ".join(advice for _, advice in called)
        # The general advice only where a named function makes none of the known calls:
        # a parameter loop moved into a Dataset is advice no one can follow.
        rest = len(called) < len(named) or any(call not in _IN_PLACE_CALLS for call, _ in called)
        recommendation = told + (" Elsewhere: " + recommendation[0].lower() + recommendation[1:] if rest else "")
        if not rest:
            remains = "The step keeps the model's own work and the same work as a few calls over every parameter."
    # The autograd nodes the work outside the model made (a loss looped over the batch)
    # run in backward: the named work's share of them goes with it.
    backward = _backward_of_outside(ctx)
    named_share = named_ns / total if total else 0.0
    # The Backward phase at the job's own pace (where steps ran unrecorded).
    phase = float(value(ctx.table("step_timing"), "Backward", "best_avg_ns", float("nan")))
    outside_share = sum(share for share, _kind in backward) if phase == phase and phase > 0 else 0.0
    all_backward = phase * outside_share if outside_share else 0.0
    named_backward = all_backward * named_share
    # A loss or a squeeze called on the model's output leaves a node or two: ordinary, and
    # nothing the fix changes; the backward counts where it is a share of the step as a
    # function is named (a loss looped over the batch leaves hundreds).
    if named_backward < ctx.threshold("min_line_share") * step:
        named_backward = 0.0
    basis = ("the named functions' time per step, recoverable where the work is vectorised or overlapped with "
             "compute; at most all of the script's own Python outside the model")
    if named_backward:
        top = sorted(backward, key=lambda b: -b[0])[:3]
        listed = ", ".join(f"{_calls(ctx, kind):.0f} {kind}" for _ns, kind in top)
        metrics["backward_ns_per_step"] = named_backward
        message += (f" Its operators also leave autograd nodes that loss.backward() runs: {ms(named_backward)} per "
                    f"step of backward ({listed} a step).")
        evidence.append(row_evidence("autograd_nodes", ctx.table("autograd_nodes"), top[0][1], "ns_per_step",
                                     "backward's nodes of operators called outside the model"))
        basis += ", with the backward of the autograd nodes its operators make"
    # A CPU run's step is the host's alone: the named time comes off it. The step model's
    # graph (one host chain) says the same; its partition holds the time outside the model,
    # and backward's nodes of that work are the host's time inside their ranges.
    # The named share of that time is the samples' (both at the job's own pace; the graph's
    # is the recorded steps', which the replay scales to it).
    fix = None
    if ctx.model is not None and ctx.model.partition.ns("host outside model"):
        keep = max(1.0 - named_share, 0.0)
        # Backward's share of those nodes goes from the Backward phase as a whole: the
        # engine's work between nodes goes with them (as _backward_of_outside counts it).
        gone = outside_share * named_share
        spans = (((ctx.model.facts.phase_intervals("Backward"), max(1.0 - gone, 0.0)),) if gone > 0 else ())
        fix = Fix("the named host work taken off the step", {"outside": keep, "unrecorded": keep}, host_spans=spans)
    point = named_ns + named_backward
    finding = Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, point / step),
        confidence=0.7,
        saving=saving(ctx, point, basis, low_ns=point * ctx.threshold("saving_low_share"),
                      high_ns=total + all_backward,
                      remains=remains),
        message=message,
        recommendation=recommendation,
        evidence=[e for e in evidence if e is not None],
        metrics=metrics,
    )
    return [finding.with_fix(fix) if fix is not None else finding]

