"""not-steady-state: the profile holds start-up, compilation or graph capture rather than
the steady steps a diagnosis judges.

Measure: the step model's window (advisor.step.window): whether any steady work is left once
start-up (context creation, module loading), compilation, graph capture, work in flight and
start-up steps are set apart, and how much of the profile they take. Decide: a profile with
no steady work. Word: what the profile holds, and what to record instead. Every rule that
judges steady steps is skipped on such a profile (the engine says so), so this finding
stands alone rather than beside a launch overhead measured on a warm-up.
"""

from __future__ import annotations

from advisor.findings import Evidence, Finding, Severity
from advisor.rules.checks.common import ms
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import saving


@register("not-steady-state")
def check(ctx: RuleContext) -> list[Finding]:
    if ctx.model is None or ctx.model.steady:
        return []
    window = ctx.model.window
    kinds: dict[str, int] = {}
    for span in window.set_apart:
        kinds[span.kind] = kinds.get(span.kind, 0) + span.duration_ns
    held = ", ".join(f"{kind} {ms(ns)}" for kind, ns in sorted(kinds.items(), key=lambda kv: -kv[1]))
    longest = sorted(window.set_apart, key=lambda s: -s.duration_ns)[:3]
    message = (f"This profile is not a steady state: {window.not_steady}. Of its {ms(window.duration_ns)}, "
               + (f"the set-apart stretches hold {held}" if held else "none holds steady work")
               + ". Launch overhead, idle time and slow kernels measured here are the warm-up's, not the job's: "
               "the other rules did not judge it.")
    if longest:
        message += " The largest: " + "; ".join(f"{s.kind}, {ms(s.duration_ns)}: {s.what}" for s in longest) + "."
    evidence = [Evidence(kind="event", event_id=int(s.events[0]), name=s.kind, start_ns=s.start_ns, note=s.what)
                for s in longest if s.events]
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=Severity.high,
        confidence=0.8,
        saving=saving(ctx, 0.0, "none: the profile holds no steady steps to judge"),
        message=message,
        recommendation=("Record steady steps: with torch.profiler, a schedule that skips the warm-up "
                        "(torch.profiler.schedule(wait=5, warmup=2, active=5)) and prof.step() each iteration; with a "
                        "serving engine, profile after its graphs are captured, over decode or prefill steps that "
                        "replay them; with advisor, `advisor diagnose train.py --steps 10:15`, past compilation."),
        evidence=evidence,
        metrics={"set_apart_ns": window.set_apart_ns, "window_ns": window.duration_ns, "kinds": kinds},
    )]
