"""not-steady-state: the profile holds start-up, compilation or graph capture rather than
the steady steps a diagnosis judges.

Measure: the step model's window (advisor.step.window): whether any steady work is left once
start-up (context creation, module loading), compilation, warm-up in the user's code (a
first call far slower than the later ones), graph capture, work in flight and start-up
steps are set apart, how much of the profile they take, and whether the window shows its
work recur (two steady steps or more, or one step of a loop the profiler numbered after
others). Decide: a profile with no steady work, or one that shows its work once (one pass,
a first step alone). Word: what the profile holds, and what to record instead. On a
profile with no steady work every rule that judges steady steps is skipped (the engine
says so); on one that shows its work once they run, and their savings say they assume the
work recurs. Its severity follows what it hides: medium where the profile is all warm-up
or mostly set apart, low where one pass of otherwise steady work is judged.
"""

from __future__ import annotations

from advisor.findings import Evidence, Finding, Severity
from advisor.rules.checks.common import ms
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import saving


# Set-apart time that takes this share of the profile or more makes a one-pass profile's
# finding medium: most of what it holds is warm-up.
MOSTLY_APART = 0.5


@register("not-steady-state")
def check(ctx: RuleContext) -> list[Finding]:
    if ctx.model is None or (ctx.model.steady and ctx.model.window.recurs):
        return []
    window = ctx.model.window
    kinds: dict[str, int] = {}
    for span in window.set_apart:
        kinds[span.kind] = kinds.get(span.kind, 0) + span.duration_ns
    held = ", ".join(f"{kind} {ms(ns)}" for kind, ns in sorted(kinds.items(), key=lambda kv: -kv[1]))
    longest = sorted(window.set_apart, key=lambda s: -s.duration_ns)[:3]
    span = window.span_ns or window.duration_ns
    mostly_apart = span > 0 and window.set_apart_ns >= MOSTLY_APART * span
    if not ctx.model.steady:
        message = (f"This profile is not a steady state: {window.not_steady}. Of its {ms(window.duration_ns)}, "
                   + (f"the set-apart stretches hold {held}" if held else "none holds steady work")
                   + ". Launch overhead, idle time and slow kernels measured here are the warm-up's, not the job's: "
                   "the other rules did not judge it.")
        # Nothing is wrong with a job for having a warm-up: what is missing is a profile of
        # its steady steps.
        severity = Severity.medium
    else:
        shown = (f"one step (#{int(window.steps['step'].iat[0])}), the first the profiler saw"
                 if len(window.steps) == 1 else "no step: nothing in it repeats as steps do (a loader's reads, "
                 "optimizer steps, calls of the model, graph replays), so it looks like one pass")
        message = (f"This profile cannot show a steady step: it holds {shown}. What it measures may be the first "
                   "time the work ran (lazy initialisation, autotuning, compilation, caches filling), and nothing in "
                   "it shows the work recur; the other findings are sized as if it did."
                   + (f" Of its {ms(span)}, {ms(window.set_apart_ns)} is set apart ({held})." if held else ""))
        severity = Severity.medium if mostly_apart else Severity.low
    if longest:
        message += " The largest: " + "; ".join(f"{s.kind}, {ms(s.duration_ns)}: {s.what}" for s in longest) + "."
    evidence = [Evidence(kind="event", event_id=int(s.events[0]), name=s.kind, start_ns=s.start_ns, note=s.what)
                for s in longest if s.events]
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity,
        confidence=0.8,
        saving=saving(ctx, 0.0, "none: the profile holds no steady steps to judge" if not ctx.model.steady else
                      "none: a finding about the profile, which shows no step recur"),
        message=message,
        recommendation=("Record steady steps, several of them: with torch.profiler, a schedule that skips the warm-up "
                        "(torch.profiler.schedule(wait=5, warmup=2, active=5)) and prof.step() each iteration; with a "
                        "serving engine, profile after its graphs are captured, over decode or prefill steps that "
                        "replay them; with advisor, `advisor diagnose train.py --steps 10:15`, past compilation."),
        evidence=evidence,
        metrics={"set_apart_ns": window.set_apart_ns, "window_ns": window.duration_ns, "kinds": kinds,
                 "steady": ctx.model.steady, "recurs": window.recurs},
    )]
