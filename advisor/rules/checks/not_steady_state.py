"""not-steady-state: the profile holds start-up, compilation or graph capture rather than
the steady steps a diagnosis judges.

Measure: the step model's window (advisor.step.window): whether any steady work is left once
start-up (context creation, module loading), compilation, warm-up in the user's code (a
first call far slower than the later ones), graph capture, work in flight and start-up
steps are set apart, and how much of the profile they take. Decide: a profile with no
steady work. Word: what the profile holds, and what to record instead. Every rule that
judges steady steps is then skipped (the engine says so). A profile of steady work shown
once (one pass, a first step alone) is no finding: the report's headline says so, and
each saving says it is per pass (advisor.step.steady.headline_for).
"""

from __future__ import annotations

from advisor.findings import Evidence, Finding, Severity
from advisor.rules.checks.common import ms
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import saving
from advisor.step.steady import RECORD_STEADY_STEPS


@register("not-steady-state")
def check(ctx: RuleContext) -> list[Finding]:
    if ctx.model is None or ctx.model.steady:
        # A profile of one pass is said at the top of the report (its headline), not
        # ranked among the findings: a caveat never outranks a problem.
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
    # Nothing is wrong with a job for having a warm-up: what is missing is a profile of its
    # steady steps.
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=Severity.medium,
        confidence=0.8,
        saving=saving(ctx, 0.0, "none: the profile holds no steady steps to judge"),
        message=message,
        recommendation=RECORD_STEADY_STEPS,
        evidence=evidence,
        metrics={"set_apart_ns": window.set_apart_ns, "window_ns": window.duration_ns, "kinds": kinds,
                 "steady": ctx.model.steady, "recurs": window.recurs},
    )]
