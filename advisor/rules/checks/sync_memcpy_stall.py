"""sync-memcpy-stall: host calls that wait for the GPU, with the lines that make them."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.findings import Evidence, Finding, Saving
from advisor.rules.checks.common import ms, pct, row_evidence, saving, severity_by_share
from advisor.rules.copy_rates import pinned_rate
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.session import intervals as iv
from advisor.step.waits import PAGEABLE_COPY
from advisor.step.whatif import Fix

# The title on a CPU run, where the calls wait for no device (the rule's own title says
# the host blocks on the GPU).
CPU_TITLE = "Tensors are read back to Python inside the loop (each read would wait on a GPU)"
# Reads of one line a step from which it reads once per sample, not once per step.
PER_SAMPLE_CALLS = 8
_SOURCE = re.compile(r"^(?P<file>.+):(?P<line>\d+)(?: (?P<function>.+))?$")


def _source_evidence(source: str, name: str, calls: int) -> Evidence | None:
    match = _SOURCE.match(source or "")
    if not match:
        return None
    return Evidence(
        kind="source_line",
        file=match["file"],
        line=int(match["line"]),
        function=match["function"],
        name=name,
        note=f"{name} called here {calls} times",
    )


@register("sync-memcpy-stall")
def check(ctx: RuleContext) -> list[Finding]:
    measured = _measure(ctx)
    if measured is None:
        return []
    in_loop, blocked_per_step, share = measured
    steps = max(ctx.step_count, 1)
    lines, evidence = _listed(in_loop, steps)
    unrecorded = ctx.model.facts.unrecorded_launches if ctx.model is not None else 0
    estimate, fix, ns, basis = _saving(ctx, in_loop, blocked_per_step, unrecorded, evidence)
    advice = _advice(in_loop, steps)
    recommendation = ("Remove the waits from the loop: " + "; ".join(advice) + "."
                      if advice else "Remove the waits from the loop.")
    title = ctx.spec.title
    if not ctx.gpu_measured and not unrecorded:
        # Nothing blocks on a CPU run: the title says what the calls are and where they
        # would cost, and the advice is for the GPU run the script is written for.
        title = CPU_TITLE
        recommendation = ("Before running on a GPU, " + "; ".join(advice) + "."
                          if advice else "Before running on a GPU, remove these reads from the loop.")
    if estimate is None:
        estimate = saving(ctx, ns, basis)
    return [
        Finding(
            rule=ctx.spec.id,
            title=title,
            # Severity follows what a fix would save, not how long the host waited: a wait
            # for work the GPU is busy with anyway costs little.
            severity=severity_by_share(ctx, estimate.share_of_step),
            confidence=0.8 if ctx.gpu_measured else 0.6,
            saving=estimate,
            message=_message(ctx, in_loop, blocked_per_step, share, lines, unrecorded),
            recommendation=recommendation,
            evidence=evidence,
            metrics={"blocked_ns_per_step": blocked_per_step, "blocked_share": share},
        ).with_fix(fix)
    ]


def _measure(ctx: RuleContext) -> tuple[pd.DataFrame, float, float] | None:
    """The host-blocking calls made in the loop (often enough a step), costliest first, with
    their time per step; their time per step and its share of the step. None below the
    thresholds."""
    table = ctx.table("host_sync")
    if table is None or not len(table):
        return None
    steps = max(ctx.step_count, 1)
    in_loop = table[table["calls"] / steps >= ctx.threshold("min_calls_per_step")] if ctx.step_count else table
    if not len(in_loop):
        return None
    # Without steps the whole window is the one "step" every figure is per.
    in_loop = in_loop.assign(per_step_ns=in_loop["host_total_ns"] / steps)
    blocked_per_step = float(in_loop["per_step_ns"].sum())
    share = blocked_per_step / ctx.mean_step_ns if ctx.mean_step_ns else 0.0
    if share < ctx.threshold("min_share"):
        return None
    return in_loop.sort_values("per_step_ns", ascending=False), blocked_per_step, share


def _listed(in_loop: pd.DataFrame, steps: int) -> tuple[list[str], list[Evidence]]:
    """A line for each of the costliest calls, with its row and source line as evidence,
    and the costliest one's events."""
    evidence: list[Evidence] = []
    lines = []
    for key, row in in_loop.head(8).iterrows():
        ev = row_evidence("host_sync", in_loop, key, "per_step_ns", str(row.get("reason", "")))
        if ev:
            evidence.append(ev)
        src = _source_evidence(str(row.get("source", "")), str(row.get("name", key)), int(row["calls"]))
        if src:
            evidence.append(src)
        where = f" at {row['source']}" if row.get("source") else ""
        lines.append(f"{row.get('name', key)} ({row.get('reason', '')}){where}: "
                     f"{_per_step(row['calls'] / steps)} a step, {ms(row['per_step_ns'])} a step")
    for event_id in (in_loop.iloc[0].get("example_event_ids") or [])[:3]:
        evidence.append(Evidence(kind="event", event_id=int(event_id), name=str(in_loop.iloc[0].get("name", ""))))
    return lines, evidence


def _saving(ctx: RuleContext, in_loop: pd.DataFrame, blocked_per_step: float, unrecorded: int,
            evidence: list[Evidence]) -> tuple[Saving | None, Fix | None, float, str]:
    """What removing the waits saves: replayed on the step graph where the GPU was
    measured (estimate and fix), else the figure and basis the saving is said from (the
    host time in the calls, or none on a CPU run or where the GPU was not recorded)."""
    if ctx.gpu_measured and ctx.model is not None:
        # The waits of these calls dropped: the host goes on while the device works, and
        # the step shrinks by what the host waited for that nothing else needed.
        calls = ctx.model.waits()
        keys = set(zip(in_loop["name"].astype(str), in_loop["reason"].astype(str), in_loop["source"].astype(str)))
        mine = [key in keys for key in zip(calls["name"].astype(str), calls["reason"].astype(str),
                                          calls["source"].astype(str))]
        waits = frozenset(int(r) for r in calls["row"].to_numpy()[mine])
        pinned, rate_note = _pinned_copies(ctx, calls[np.asarray(mine, dtype=bool)])
        fix = Fix("the waits removed" + (", the copies pinned" if pinned else ""), wait_rows=waits, gpu_rows=pinned)
        basis = "the step replayed with the host no longer waiting in these calls"
        if pinned:
            basis += f" and its pageable copies at the pinned rate ({rate_note})"
        found = replayed(ctx, fix, basis,
                         low=Fix("the waits removed, the copies as they are", wait_rows=waits) if pinned else None,
                         high=Fix("every wait removed", drop_waits=True, gpu_rows=pinned),
                         remains="The step keeps the calls' own cost and the device's work"
                                 + (", the copies at the pinned rate (pin once, or in the DataLoader's pin-memory "
                                    "thread, not in the loop)" if pinned else "")
                                 + "; where the value is needed on the host, one wait every N steps.")
        ev = row_evidence("gpu_idle", ctx.table("gpu_idle"), "blocking sync", "idle_ns",
                          "GPU idle while the host is blocked")
        if ev:
            evidence.append(ev)
        return (found[0] if found is not None else None), fix, 0.0, ""
    if ctx.gpu_measured:
        return None, None, blocked_per_step, "host time inside these calls, per step"
    if unrecorded:
        # A GPU job whose trace left the GPU out: the calls waited for work nobody saw.
        return None, None, 0.0, ("unknown: the GPU's activity was not recorded, so how long each call waited for it "
                                 "is not known; each waits for all the work queued before it")
    # On a CPU run these calls wait for no device: removing them saves only their own small
    # cost, which the host-bound rule counts with the rest of the loop's Python. The lines
    # still matter for the GPU run the script is written for.
    return None, None, 0.0, ("none: on this CPU run the calls wait for no device; on a GPU each would wait for all "
                             "the work queued before it")


def _message(ctx: RuleContext, in_loop: pd.DataFrame, blocked_per_step: float, share: float, lines: list[str],
             unrecorded: int) -> str:
    where = f"in {_count(ctx.step_count, 'step')} " if ctx.step_count else "in the window (no steps found) "
    listed = "; ".join(lines) + "."
    if unrecorded:
        return (f"{_count(int(in_loop['calls'].sum()), 'host-blocking call')} {where}"
                f"took {ms(blocked_per_step)} per step on the host; the GPU's activity was not recorded, so "
                "what each waited for is not known, but each waits for the device to finish all the work "
                "queued before it: " + listed)
    if not ctx.gpu_measured:
        return (f"{_count(int(in_loop['calls'].sum()), 'call')} {where}"
                "read tensors back to Python; on this CPU run they wait for nothing (" + ms(blocked_per_step)
                + " per step in the calls themselves), but where the tensor is on a GPU each one waits for "
                "the device to finish all the work queued before it: " + listed)
    return (f"{_count(int(in_loop['calls'].sum()), 'host-blocking call')} {where}"
            f"cost {ms(blocked_per_step)} per step ({pct(share)} of the step): " + listed)


def _advice(in_loop: pd.DataFrame, steps: int) -> list[str]:
    """How to remove the waits, for the reasons the calls wait."""
    reasons = set(in_loop.get("reason", []))
    advice = []
    # A line read back many times a step reads once per sample (a branch on a random draw,
    # a value per item): batching it removes the reads; reading it every N steps does not.
    per_sample = in_loop[(in_loop["calls"] / steps >= PER_SAMPLE_CALLS)
                         & in_loop["reason"].astype(str).str.contains("host")]
    if len(per_sample):
        found = (_SOURCE.match(str(source)) for source in per_sample["source"])
        sites = ", ".join(sorted({f"{m['file']}:{m['line']}" for m in found if m})) or "these lines"
        advice.append(f"at {sites}, a tensor is read back once per sample: decide for the whole batch with tensor "
                      "ops (a mask or torch.where on a batch of values drawn at once) instead of a Python branch or "
                      "read per sample")
    if any("host" in str(r) for r in set(in_loop.drop(index=per_sample.index).get("reason", []))):
        advice.append("keep values on the device (loss.detach(), accumulate on the GPU) and read them "
                      "every N steps instead of calling .item()/.cpu()/.tolist() each step")
    if any("pageable" in str(r) for r in reasons):
        advice.append("copy from pinned memory (DataLoader(pin_memory=True) or tensor.pin_memory()) with "
                      ".to(device, non_blocking=True)")
    if any("synchronous copy" in str(r) for r in reasons):
        advice.append("use cudaMemcpyAsync / non_blocking copies on a side stream")
    if any("synchronize" in str(r) for r in reasons):
        advice.append("drop explicit torch.cuda.synchronize() / event.synchronize() from the loop (keep them "
                      "only around timing code)")
    return advice


def _pinned_copies(ctx: RuleContext, calls) -> tuple[dict[int, float], str]:
    """The pageable copies these calls make, each shrunk to the time its bytes take at the
    pinned rate (advisor.rules.copy_rates): GPU row -> factor on its duration; and where the
    rate comes from. Empty where the calls make no pageable copy or no rate is known."""
    pageable = calls[calls["reason"].astype(str) == PAGEABLE_COPY]
    if not len(pageable) or ctx.model is None:
        return {}, ""
    spans = iv.union((pageable["start_ns"].to_numpy(), pageable["end_ns"].to_numpy()))
    rows = ctx.model.gpu_launched_in(spans)
    ev = ctx.model.facts.events
    factors: dict[int, float] = {}
    sources = []
    for direction in ("HtoD", "DtoH"):
        side = "src_memory" if direction == "HtoD" else "dst_memory"
        mine = [r for r in rows if str(ev["kind"].iat[r]) == "memcpy" and str(ev["copy_kind"].iat[r]) == direction
                and str(ev[side].iat[r]) == "Pageable"]
        if not mine:
            continue
        rate = pinned_rate(ctx, direction)
        if rate is None:
            continue
        sources.append(rate.source)
        for r in mine:
            took = float(ev["end_ns"].iat[r] - ev["start_ns"].iat[r])
            at_rate = float(ev["bytes"].iat[r]) / rate.gbps
            if took > 0:
                factors[int(r)] = min(at_rate / took, 1.0)
    return factors, "; ".join(sources)


def _count(n: int, noun: str) -> str:
    """ "1 step", "6 steps"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _per_step(calls: float) -> str:
    """Calls a step, whole where they are ("1 call", "2048 calls"), else to one decimal ("0.5 calls")."""
    if abs(calls - round(calls)) < 0.05:
        return f"{calls:.0f} call{'' if round(calls) == 1 else 's'}"
    return f"{calls:.1f} calls"
