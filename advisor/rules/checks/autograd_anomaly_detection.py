"""autograd-anomaly-detection: autograd's anomaly detection left on in a training loop,
judged from the autograd_anomaly table.

Anomaly detection is a debugging aid: backward checks every function's outputs for NaN
(and reads each answer back to the host, a wait on the GPU each time), and forward stores
the Python stack of every autograd node it creates. Left on after the debugging, it costs
every step both. The saving is the fix replayed on the step graph: the checks' operators
gone from backward, the Forward phase's time less the share of its samples spent capturing
stacks (half of it at the low end, where samples are few or the capture is mixed with the
model's own Python).
"""

from __future__ import annotations

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.session import intervals as iv
from advisor.step.load import weighed_per_step
from advisor.step.whatif import Fix

ROW = "anomaly detection"


@register("autograd-anomaly-detection")
def check(ctx: RuleContext) -> list[Finding]:
    table = ctx.table("autograd_anomaly")
    if table is None or ROW not in table.index or ctx.model is None:
        return []
    row = table.loc[ROW]
    per_step = float(row["checks_per_step"])
    if not per_step >= ctx.threshold("min_checks_per_step"):
        return []
    # Too few samples to read a share from, unless the capture was timed (the samples then
    # only say how deep the stacks are).
    retimed = float(row.get("capture_retimed", 0.0) or 0.0) > 0
    enough = row["forward_samples"] >= ctx.threshold("min_samples") or (retimed and row["capture_samples"] > 0)
    share = float(row["capture_share"]) if enough else 0.0
    share = share if share == share else 0.0  # NaN: no samples
    checks = iv.intersect(ctx.model.host_ranges(r"^aten::(isnan|_is_any_true)$"),
                          ctx.model.host_ranges(r"^autograd::engine::evaluate_function"))
    forward = ctx.model.facts.phase_intervals("Forward")
    # Each capture formats every frame of the stack, the launcher's too: under advisor its
    # frames make the capture longer than in the job run alone. That part is advisor's
    # cost, taken out of the step before the fix (the base), not counted as the fix's.
    launcher = float(row["capture_launcher_share"]) if share > 0 else 0.0
    launcher = min(max(launcher, 0.0), 1.0) if launcher == launcher else 0.0
    kept = 1.0 - share * launcher  # the Forward phase as the job runs it alone
    base = Fix("the launcher's frames out of the stack capture", host_spans=((forward, kept),)) if launcher else None
    spans = ((checks, 0.0),) + (((forward, (1.0 - share) / kept),) if share > 0 else ())
    fix = Fix("anomaly detection off", host_spans=spans, base=base)
    low = Fix("the checks gone, half the stack capture", host_spans=((checks, 0.0),)
              + (((forward, (1.0 - share / 2) / kept),) if share > 0 else ()), base=base)
    # The high end counts the capture as it ran here, the launcher's frames too (a capture
    # whose cost does not grow with the frames it formats).
    high = Fix("the checks and the capture as recorded gone", host_spans=((checks, 0.0),)
               + (((forward, 1.0 - share),) if share > 0 else ())) if base is not None else None
    # The job's own step has no launcher frames to capture either: the share is of that step,
    # as the combined estimate's is (it replays the same base).
    own = ctx.what_if(base) if base is not None else None
    step = max(ctx.run_step_ns - (own.saved_ns if own is not None else 0.0), 0.0)
    found = replayed(ctx, fix, "the step replayed without backward's NaN checks and forward's stack capture",
                     low=low, high=high, remains="The step keeps the model's own forward and backward.", step_ns=step)
    if found is None:
        return []
    estimate, _ = found
    if estimate.ms_per_step * 1e6 < ctx.threshold("min_saving_ms") * 1e6:
        return []
    check_ns, capture_ns = float(row["check_per_step_ns"]), float(row["capture_per_step_ns"])
    message = (f"Autograd's anomaly detection is on: backward checks the outputs of each of its {per_step:.0f} "
               f"functions a step for NaN ({ms(check_ns)} per step" + _check_share(ctx, checks, check_ns, step) + ")"
               + (f", and forward stores the Python stack of every autograd node it creates "
                  f"({_capture(row, share, launcher, getattr(ctx.model.pace, 'mix', None) is not None)})"
                  if share > 0 else "")
               + (". On a GPU each check also reads its answer back to the host, a wait per function."
                  if ctx.gpu_measured else "."))
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.85,
        saving=estimate,
        message=message,
        recommendation=("Turn anomaly detection off for training runs: remove torch.autograd.set_detect_anomaly(True) "
                        "and any `with torch.autograd.detect_anomaly():` around the loop, or put them behind a debug "
                        "flag. It is a debugging aid that makes every step slower. To still catch a NaN early, check "
                        "the loss every N steps (torch.isfinite(loss)), and turn anomaly detection on only to find "
                        "where one comes from."),
        evidence=[e for e in (
            row_evidence("autograd_anomaly", table, ROW, "checks_per_step", "NaN checks in backward per step"),
            row_evidence("autograd_anomaly", table, ROW, "check_per_step_ns", "the checks' host time per step"),
            row_evidence("autograd_anomaly", table, ROW, "capture_share",
                         "the Forward phase's time spent storing stacks, its calls timed again"
                         if float(row.get("capture_retimed", 0.0) or 0.0) > 0
                         else "the Forward phase's samples spent storing stacks") if share > 0 else None,
        ) if e is not None],
        metrics={"checks_per_step": per_step, "check_per_step_ns": check_ns, "capture_share": share,
                 "capture_per_step_ns": capture_ns * (1 - launcher) if share > 0 else 0.0},
    ).with_fix(fix)]


def _check_share(ctx: RuleContext, checks: iv.Intervals, check_ns: float, step: float) -> str:
    """The checks' share of the step: as a quiet machine divides it where the run was busy
    (advisor.step.load), the checks' Python against operators the load stretched far more."""
    weighed = weighed_per_step(ctx.model, checks)
    whole = weighed_per_step(ctx.model) if weighed is not None else None
    if weighed is not None and whole:
        return f" at this run's load, {pct(weighed / whole)} of the step weighed as on a quiet machine"
    return f", {pct(check_ns / step)} of the step" if step else ""


def _capture(row, share: float, launcher: float, weighed: bool) -> str:
    """What the stack capture takes of the Forward phase, and by what measure (``weighed``:
    the run was busy and its step weighed as on a quiet machine)."""
    capture_ns = float(row["capture_per_step_ns"])
    retimed = float(row.get("capture_retimed", 0.0) or 0.0) > 0
    if retimed and weighed:
        return (f"{pct(share)} of the Forward phase's work, its calls timed again at one thread with and without "
                f"autograd after the run, as the machine was busy: about {ms(capture_ns)} per step at this run's load")
    # Timed again, the capture is said in time only: at the depth of every frame a stack
    # holds under advisor it can reach all of the Forward phase the share is capped at.
    measure = ("its calls timed again after the run with and without autograd" if retimed
               else f"{pct(share)} of the Forward phase's samples")
    return (f"{measure}, about {ms(capture_ns * (1 - launcher))} per step run alone; "
            f"{ms(capture_ns)} under advisor, whose frames each stack also holds")
