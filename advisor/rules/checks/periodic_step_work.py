"""periodic-step-work: every N steps a step runs extra work (a validation pass, a
checkpoint, logging), and it costs a real share of the run.

Measure: the step model's periodic steps (advisor.step.window.periodic_steps): from every
step the collector timed, recorded or not, where the run timed enough of them, else from
the recorded steps; how much longer the slow steps run, how often, and in which phase the
extra time is (a forward with no backward: validation; outside every phase: a checkpoint,
logging). Decide: the extra time is at least ``min_share`` of the run. Word: its cost per
N steps and the fix; the saving is what running the work LESS_OFTEN times less often
gives (three quarters of its cost spread over the steps), between half (half as often) and
all of it (off the training loop).
"""

from __future__ import annotations

import pandas as pd

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import saving
from advisor.step.whatif import Fix

# The fix runs the periodic work this many times less often (or off the loop): the saving
# is the share of its cost that leaves.
LESS_OFTEN = 4

WHAT = {
    "Forward": "forward passes with no backward: an evaluation or validation pass",
    "Backward": "extra backward work",
    "Optimization": "extra optimizer work",
    "Dataloader": "extra data loading (a second loader, an evaluation set)",
    "Others": "work outside the model's phases: saving a checkpoint, logging, evaluation code",
}


@register("periodic-step-work")
def check(ctx: RuleContext) -> list[Finding]:
    periodic = ctx.model.window.periodic if ctx.model is not None else None
    if periodic is None or periodic.share_of_run < ctx.threshold("min_share"):
        return []
    per_step = periodic.extra_ns / periodic.every
    kept = 1 / LESS_OFTEN
    what = WHAT.get(periodic.phase, f"extra work in {periodic.phase}")
    shown = ", ".join(f"#{n}" for n in periodic.steps[:6]) + ("..." if len(periodic.steps) > 6 else "")
    found_by = {"forward calls": ", found by their forward calls", "CPU time": ", found by their CPU time"}
    work = _work(ctx.table("periodic_work"))
    message = (f"Every {periodic.every} steps a step runs {ms(periodic.extra_ns)} longer than the steady "
               f"{ms(periodic.steady_ns)} (steps {shown}, over {periodic.timed} {periodic.source}"
               f"{found_by.get(periodic.signal, '')}): {what}. "
               f"That is {ms(per_step)} per step spread over the run, {pct(periodic.share_of_run)} of its time.")
    if len(work):
        message += " Where the extra time goes: " + "; ".join(_line_said(row, periodic) for _, row in work.iterrows()) + "."
    every = periodic.every * LESS_OFTEN
    evaluation = periodic.phase == "Forward" or bool(len(work) and (work["phase"] == "Forward").any())
    checkpoint = bool(len(work) and work["checkpoint"].astype(bool).any())
    advice = []
    if evaluation:
        if periodic.no_grad is False:
            # Seen by the step clock: the extra forwards ran with autograd on, each building
            # a graph no backward uses.
            advice.append("Run the evaluation under torch.no_grad() (or torch.inference_mode()): its forwards run "
                          "with autograd on, each recording a graph no backward uses; and validate less often "
                          f"(every {every} steps rather than {periodic.every}), on a subset of the validation set, "
                          "with a larger batch, or in a separate process on a copy of the weights")
        elif periodic.no_grad:
            advice.append(f"Validate less often (every {every} steps rather than {periodic.every}) or on a subset of the "
                          "validation set; it already runs with autograd off, so what else it can take is a larger "
                          "evaluation batch, torch.inference_mode(), or a separate process on a copy of the weights")
        else:
            advice.append(f"Validate less often (every {every} steps rather than {periodic.every}), on a subset of "
                          "the validation set, under torch.no_grad() / torch.inference_mode() with a larger batch, "
                          "or in a separate process on a copy of the weights")
    if checkpoint:
        advice.append(f"save checkpoints less often (every {every} steps) or off the training loop: "
                      "torch.distributed.checkpoint.async_save, or copy the state to CPU and write it in a thread")
    if not advice:
        advice.append("Take the periodic work off the training loop: save checkpoints asynchronously "
                      "(torch.distributed.checkpoint.async_save, or copy the state to CPU and write it in a thread), "
                      f"every {every} steps rather than {periodic.every}, and log without reading values back every time")
    advice_text = "; ".join(advice)
    advice_text = advice_text[0].upper() + advice_text[1:] + "."
    # The periodic steps' extra time is beside the steady steps the graph replays: the fix
    # keeps 1/LESS_OFTEN of it, and combines with the others' without sharing time.
    fix = Fix(f"every {periodic.every * LESS_OFTEN} steps", beside_ns=per_step, beside_factor=kept)
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, periodic.share_of_run),
        confidence=0.7,
        saving=saving(ctx, per_step * (1 - kept),
                      f"the periodic steps' extra time spread over every {periodic.every} steps, "
                      f"{LESS_OFTEN} times less often (all of it off the training loop, half of it half as often)",
                      low_ns=per_step / 2, high_ns=per_step,
                      remains=f"The steady steps' own work, and 1/{LESS_OFTEN} of the periodic work's cost: "
                              f"{ms(per_step * kept)} a step."),
        message=message,
        recommendation=advice_text,
        evidence=[e for e in (row_evidence("step_timing", ctx.table("step_timing"), "PeriodicStep", "best_avg_ns",
                                           f"a step that runs the work every {periodic.every} steps"),
                              row_evidence("step_timing", ctx.table("step_timing"), "ProfileStep", "best_avg_ns",
                                           "a steady step"),
                              *(row_evidence("periodic_work", ctx.table("periodic_work"), str(key), "extra_ns",
                                             _line_said(row, periodic)) for key, row in work.iterrows()))
                     if e is not None],
        metrics={"every": periodic.every, "extra_ns": periodic.extra_ns, "steady_ns": periodic.steady_ns,
                 "share_of_run": periodic.share_of_run, "phase": periodic.phase, "steps": list(periodic.steps),
                 "source": periodic.source, "signal": periodic.signal, "no_grad": periodic.no_grad,
                 "lines": [str(k) for k in work.index]},
    ).with_fix(fix)]


# A line is named where it holds at least this share of the periodic steps' extra time.
LINE_MIN_SHARE = 0.05
MAX_LINES = 3


def _work(table):
    """The periodic_work rows worth naming: the lines that hold most of the extra time."""
    if table is None or not len(table):
        return table.iloc[:0] if table is not None else pd.DataFrame(columns=["phase", "checkpoint"])
    return table[table["share_of_extra"].fillna(0) >= LINE_MIN_SHARE].head(MAX_LINES)


def _line_said(row, periodic) -> str:
    """One line of the periodic work in words: where, what it calls, its share, and what is
    known of it (a checkpoint; an evaluation already without autograd)."""
    where = f"{row['function']} ({row['file'].rsplit('/', 1)[-1]}:{row['line']})"
    called = str(row["calls"])
    said = f"{called} at {where}" if row["checkpoint"] else where + (f", calling {called}" if called else "")
    said += f", {pct(row['share_of_extra'])} of it"
    # The calls that lead there name the periodic work itself (validate(), not the model's
    # forward every step also runs).
    frames = [f for f in str(row.get("stack") or "").split(" > ") if f]
    if len(frames) > 1:
        said += f", reached by {' > '.join(frames[:-1])}"
    if row["checkpoint"]:
        said += ": a checkpoint"
    elif row["phase"] == "Forward" and periodic.no_grad:
        said += ", a forward with autograd already off"
    elif row["phase"] == "Forward" and periodic.no_grad is False:
        said += ", a forward with autograd on"
    return said
