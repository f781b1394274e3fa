"""queued-work-waits: the GPU idles with work already launched, because that work waits on
something else: another stream's work, a collective whose peers are late, or work the
profile does not hold.

Measure: the idle time the step model's partition gives to "work queued" (launched, not
started, whatever the host did meanwhile), and, on the step graph, what the work that ended
each such gap waited for: the node on another stream it followed (a collective there means
its peers), or nothing the profile holds (another process on the GPU, a peer, work launched
before the trace). Decide: a real share of the step. Word: name what it waits on; the
saving is the step replayed with those waits gone, the most removing them could give.
"""

from __future__ import annotations

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share, value
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.facts import COMM_KERNEL
from advisor.step.whatif import Fix


@register("queued-work-waits")
def check(ctx: RuleContext) -> list[Finding]:
    idle = ctx.table("gpu_idle")
    if ctx.model is None or not ctx.gpu_measured or idle is None or not len(idle):
        return []
    part = ctx.model.partition
    steps = max(part.steps, 1)
    queued = float(value(idle, "work queued", "idle_ns", 0.0) or 0.0) / steps
    step = ctx.model.recorded_step_ns  # the steps the idle above is per step of
    if not step or queued / step < ctx.threshold("min_share") or queued < ctx.threshold("min_saving_ms") * 1e6:
        return []
    graph = ctx.model.graph
    names = ctx.model.facts.events["name"].astype(str).to_numpy()
    held = graph.held_by(part.causes["work queued"], names)
    parts, nodes = [], []
    for item in held.head(4).itertuples():
        per_step = item.ns / steps
        if item.waits_on == "another stream":
            what = (f"a collective on stream {item.stream % 1_000_003} ({_short(item.name)}): it waits for its "
                    "peers, so the ranks' pace, not this GPU, sets it" if COMM_KERNEL.search(item.name)
                    else f"work on stream {item.stream % 1_000_003} ({_short(item.name)})")
            if item.launched_late:
                what += ", which the host launched only after the GPU had gone idle"
            nodes.append(int(item.node))
        else:
            what = ("something the profile does not hold: work launched before the trace began, another "
                    "process on the same GPU, or an event or peer it does not record")
        parts.append(f"{ms(per_step)} per step on {what}")
    fix = Fix("what the queued work waits on, gone", free_gpu=True)
    found = replayed(ctx, fix, "the step replayed with the queued work starting as soon as its launch and its own "
                               "stream allow: the most removing what it waits on could give", low=Fix(),
                     remains="The step keeps the GPU's own work and the host's.")
    if found is None:
        return []
    estimate, _ = found
    message = (f"The GPU idles {ms(queued)} per step ({pct(queued / step)} of the step) with work already launched "
               "that it does not start: " + "; ".join(parts) + ".")
    if any(COMM_KERNEL.search(n) for n in held["name"].astype(str)):
        advice = ("The queued work waits on collectives: look at the other ranks (a straggler makes every rank's "
                  "collective wait: `advisor diagnose` on the job's traces together), and overlap communication "
                  "with computation so a late peer costs less.")
    elif (held["waits_on"] == "another stream").any():
        advice = ("The queued work waits on another stream: start that stream's work earlier (launch it before the "
                  "host work that delays it, record its event as soon as its result is ready, split it so the "
                  "first part is not held by the rest), or put the dependent work on the same stream if the two "
                  "never overlap anyway.")
    else:
        advice = ("What it waits on is not in this profile: record every process that uses this GPU and the whole "
                  "job's ranks, and start tracing after work launched earlier has finished.")
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.6,
        saving=estimate,
        message=message,
        recommendation=advice,
        evidence=[e for e in (row_evidence("gpu_idle", idle, "work queued", "per_step_ns",
                                           "GPU idle with work launched but not started"),) if e is not None],
        metrics={"queued_ns_per_step": queued, "waits": held.assign(ns_per_step=held["ns"] / steps)[
            ["waits_on", "name", "stream", "ns_per_step"]].to_dict("records"), "nodes": nodes},
    ).with_fix(fix)]


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."
