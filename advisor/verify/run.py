"""``advisor verify``: each finding's fix applied to the script and measured.

After the diagnosis, for each finding (top first, up to ``max_fixes``) whose rule declares a
fix advisor can apply from outside the script (advisor.verify.fixes), the script runs again
in a process of its own, unprofiled, with the fix and without it, alternately, over the
same steps (advisor.verify.trial). Pairs of runs go on until the difference between them
stands clear of the run-to-run noise (a t-test on the pairs' differences at 95 %) or the
time budget is spent. The finding then carries what was measured (Finding.verification);
one that could not be measured says why (Finding.not_verified). Findings are ranked by the
measured saving where one exists, else by the predicted one.

The script runs several more times: its side effects (files written, a checkpoint, a
download) are the user's, which the command says before the first trial. A trial ends with
its process, whatever the script left running, which is ended with it; a Ctrl-C or SIGTERM
ends the trial running and runs no other (TrialsStopped carries what was measured).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.findings import Finding, NotVerified, Verification
from advisor.verify import processes
from advisor.verify.fixes import APPLIES_TO, FIXES, FixPlan, plan_fix

__all__ = ["DEFAULT_TRIAL_STEPS", "MAX_PAIRS", "Trial", "TrialsStopped", "plan_trials", "rank_by_measured",
           "stopped_by", "verify_findings"]

MIN_PAIRS = 3
# Steps timed per trial run where --trial-steps does not say: a step's time varies (workers
# deliver in bursts), and the mean of a few is not the mean of the run.
DEFAULT_TRIAL_STEPS = 20
MAX_PAIRS = 8
# What the script started and left running when a trial ends is asked to stop, then killed
# after this long.
LEFTOVER_GRACE_S = 2.0
# Two-sided 95 % points of Student's t by degrees of freedom (pairs - 1).
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


@dataclass(frozen=True)
class Trial:
    """What verify does for one finding: the fix to apply, or why there is none."""

    index: int  # the finding's place in the report's list
    rule: str
    fix: FixPlan | None
    why_not: str = ""


def plan_trials(findings: list[Finding], specs: dict[str, Any], *, gpu: bool, tries: set[str],
                max_fixes: int) -> list[Trial]:
    """For the first ``max_fixes`` findings: the fix each rule declares for it, where advisor
    can apply it here (a GPU fix needs a GPU; amp and compile need --try)."""
    trials = []
    for index, finding in enumerate(findings[:max_fixes]):
        spec = specs.get(finding.rule)
        declared = list(getattr(spec, "verify", []) or [])
        edit = getattr(spec, "not_verifiable", "") or "its fix needs an edit of the script"
        allowed = [entry for entry in declared if not FIXES[entry.apply].opt_in or FIXES[entry.apply].opt_in in tries]
        plan = plan_fix(allowed, finding.metrics)
        if plan is None:
            asked = sorted({FIXES[e.apply].opt_in for e in declared if FIXES[e.apply].opt_in} - tries)
            why = f"not verifiable from outside the script: {edit}"
            if asked and plan_fix(declared, finding.metrics) is not None:
                why += f" (or opt in: {', '.join(f'--try {a}' for a in asked)}, which changes numerics or compiles)"
            trials.append(Trial(index, finding.rule, None, why))
        elif FIXES[plan.name].gpu_only and not gpu:
            trials.append(Trial(index, finding.rule, None, f"{plan.describe()} needs a GPU, and torch sees none here"))
        else:
            trials.append(Trial(index, finding.rule, plan))
    return trials


def verify_findings(findings: list[Finding], trials: list[Trial], *, script: str, args: list[str],
                    step_source: str | None, warmup: int, steps: int, budget_s: float,
                    say: Callable[[str], None], run: Callable[[dict[str, Any], float], dict[str, Any]] | None = None
                    ) -> list[Finding]:
    """The findings with what the trials measured (or why not), in the report's order.
    ``run(plan, timeout_s)`` runs one trial (default: a process of its own)."""
    run = run or run_trial
    out = list(findings)
    measurable = [t for t in trials if t.fix is not None]
    deadline = time.monotonic() + budget_s
    for trial in trials:
        if trial.fix is None:
            out[trial.index] = out[trial.index].model_copy(update={"not_verified": NotVerified(reason=trial.why_not)})
    for k, trial in enumerate(measurable):
        # Each fix gets an equal share of what is left of the budget.
        share = (deadline - time.monotonic()) / (len(measurable) - k)
        finding = out[trial.index]
        try:
            verification = _measure(trial, finding, script=script, args=args, step_source=step_source,
                                    warmup=warmup, steps=steps, until=time.monotonic() + share, deadline=deadline,
                                    say=say, run=run,
                                    label=f"fix {k + 1} of {len(measurable)}")
        except TrialFailed as failed:
            out[trial.index] = finding.model_copy(update={"not_verified": NotVerified(reason=str(failed))})
            continue
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: no further trial runs
            reason = f"not measured: verify was {stopped_by(stop)} before this fix's trials were done"
            for left in measurable[k:]:
                out[left.index] = out[left.index].model_copy(update={"not_verified": NotVerified(reason=reason)})
            raise TrialsStopped(out, stop) from None
        out[trial.index] = finding.model_copy(update={"verification": verification})
    return out


class TrialsStopped(Exception):
    """Ctrl-C or a signal stopped verify's trials: ``findings`` as far as they were measured
    (those left say why not), ``interrupt`` what stopped them, for the caller to raise again
    once it has reported them."""

    def __init__(self, findings: list[Finding], interrupt: KeyboardInterrupt) -> None:
        super().__init__(stopped_by(interrupt))
        self.findings = findings
        self.interrupt = interrupt


def stopped_by(interrupt: KeyboardInterrupt) -> str:
    """``stopped by SIGTERM`` (advisor.errors.Stopped), or ``interrupted (Ctrl-C)``."""
    name = getattr(interrupt, "name", None)
    return f"stopped by {name}" if name else "interrupted (Ctrl-C)"


class TrialFailed(Exception):
    """A trial run failed or timed nothing: said as the finding's reason."""


def _measure(trial: Trial, finding: Finding, *, script: str, args: list[str], step_source: str | None,
             warmup: int, steps: int, until: float, deadline: float, say: Callable[[str], None],
             run: Callable[[dict[str, Any], float], dict[str, Any]], label: str) -> Verification:
    fix = trial.fix
    assert fix is not None
    warmup, steps = fix.trial_steps(warmup, steps)
    base = {"script": script, "args": list(args), "step_source": step_source, "warmup": warmup, "steps": steps}
    before: list[float] = []
    after: list[float] = []
    timed = steps
    pair_s = 0.0  # how long the last pair of runs took: the next is not started where it would not end in time
    while len(before) < MAX_PAIRS:
        now = time.monotonic()
        left = until - now
        if before and left < pair_s:
            break
        if deadline - now <= 0:
            raise TrialFailed("not measured: verify's budget ran out before the first trial of this fix")
        say(f"verify {label}: {trial.rule} ({fix.describe()}): trial {len(before) + 1} of at most {MAX_PAIRS}, "
            f"{max(left, 0):.0f} s of its budget left")
        # Alternate which runs first, so a drift of the machine falls on both alike.
        order = [("before", []), ("after", [fix.as_data()])]
        if len(before) % 2:
            order.reverse()
        means = {}
        out_of_time = False
        for side, fixes in order:
            # A run may take what is left of the whole budget (the first pair of a fix can
            # need more than its share), never more: the budget bounds the command.
            result = run({**base, "fixes": fixes}, max(deadline - time.monotonic(), 1.0))
            durations = result.get("durations_ns") or []
            if not durations and before and time.monotonic() >= deadline - 1.0:
                out_of_time = True  # the budget ended this pair: the pairs before it stand
                break
            if not durations:
                raise TrialFailed(f"the trial {'with' if fixes else 'without'} the fix timed no step "
                                  f"({result.get('error') or result.get('ended', 'no steps')})")
            if fixes and not (result.get("changes") or {}).get(fix.name, 1):
                raise TrialFailed(f"the fix ({fix.describe()}) changed nothing in this script: it applies to "
                                  f"{APPLIES_TO.get(fix.name, 'what the script does not have')}; "
                                  "make the change the finding recommends by hand and compare the runs")
            timed = min(timed, len(durations))
            means[side] = statistics.fmean(durations) / 1e6
        if out_of_time:
            break
        before.append(means["before"])
        after.append(means["after"])
        pair_s = time.monotonic() - now
        if len(before) >= MIN_PAIRS and _clear(before, after):
            break
    differences = [b - a for b, a in zip(before, after)]
    measured = statistics.fmean(differences)
    saving = finding.saving
    low = saving.low_ms_per_step if saving.low_ms_per_step is not None else saving.ms_per_step
    high = saving.high_ms_per_step if saving.high_ms_per_step is not None else saving.ms_per_step
    return Verification(
        applied=fix.describe(),
        before_ms_per_step=statistics.fmean(before), after_ms_per_step=statistics.fmean(after),
        before_spread_ms=statistics.stdev(before) if len(before) > 1 else 0.0,
        after_spread_ms=statistics.stdev(after) if len(after) > 1 else 0.0,
        measured_saving_ms_per_step=measured,
        inside_range=low - 1e-9 <= measured <= high + 1e-9,
        clear_of_noise=_clear(before, after),
        trials=len(before), steps_timed=timed)


def _clear(before: list[float], after: list[float]) -> bool:
    """Whether the pairs' mean difference stands clear of their spread (t-test, 95 %)."""
    differences = [b - a for b, a in zip(before, after)]
    n = len(differences)
    if n < 2:
        return False
    mean, spread = statistics.fmean(differences), statistics.stdev(differences)
    if spread == 0:
        return mean != 0
    return abs(mean) > _T95.get(n - 1, 2.2) * spread / math.sqrt(n)


def run_trial(plan: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One trial in a process of its own (advisor.verify.trial); its step times. The trial
    ends when its process does (the steps timed, or the script's end), whatever helpers the
    script started still hold its output; they are ended with it (advisor.verify.processes).
    A Ctrl-C or SIGTERM meanwhile ends the trial's processes, then goes on up."""
    with tempfile.TemporaryDirectory(prefix="advisor-verify-") as folder:
        plan_path, out = Path(folder) / "plan.json", Path(folder) / "out.json"
        plan_path.write_text(json.dumps({**plan, "out": str(out)}))
        said = Path(folder) / "stderr.txt"
        with open(os.devnull, "wb") as nowhere, said.open("wb") as stderr:
            process = processes.start([sys.executable, "-m", "advisor.verify.trial", str(plan_path)],
                                      stdout=nowhere, stderr=stderr)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"durations_ns": [], "error": f"it ran past {timeout_s:.0f} s"}
        finally:
            processes.end(process, grace_s=LEFTOVER_GRACE_S)
        if not out.is_file():
            text = said.read_text(errors="replace").strip()
            last = (text.splitlines() or [f"exit code {process.returncode}"])[-1]
            return {"durations_ns": [], "error": f"the script failed: {last}"}
        return json.loads(out.read_text())


def rank_by_measured(findings: list[Finding], leads: set[str]) -> list[Finding]:
    """Findings about the profile itself first, then by the measured saving where one was
    measured, else the predicted one."""
    def key(finding: Finding) -> tuple[int, float]:
        saved = (finding.verification.measured_saving_ms_per_step if finding.verification is not None
                 else finding.saving.ms_per_step)
        return (0 if finding.rule in leads else 1, -saved)

    return sorted(findings, key=key)
