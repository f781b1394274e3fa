"""The command line of ``advisor verify`` (and ``advisor diagnose --verify``).

The options, the checks made before the script runs, and the step from a diagnosis to its
findings verified (advisor.verify.run) or, with --dry-run, to the list of trials. A Ctrl-C
or SIGTERM stops verify where it is: during the diagnosis, the diagnosis is the report and
no trial runs; during the trials, the report has what was measured, and the command ends as
the interrupt says (130, or 128 + the signal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from advisor.errors import UsageError

VERIFY_HELP = ("advisor verify runs the script again several times, with each fix and without, so whatever "
               "the script does (files it writes, checkpoints, downloads) happens each time: its side effects "
               "are yours.")
VERIFY_WARNING = ("verify now runs the script again, several times, with each fix and without: whatever it "
                  "does (files it writes, checkpoints, downloads) happens each time.")
TRIES = ("amp", "compile")


def add_verify_options(parser: argparse.ArgumentParser, *, flag: bool) -> None:
    """The options of verify; with ``flag``, ``--verify`` turns them on (diagnose)."""
    if flag:
        parser.add_argument("--verify", action="store_true",
                            help="after the diagnosis, apply each finding's fix where advisor can and measure it "
                                 "(as `advisor verify`; runs the script several times)")
    parser.add_argument("--max-fixes", type=int, default=3, metavar="N",
                        help="verify the first N findings (default 3)")
    parser.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                        help="time for all trials together (default 300 s); each fix gets an equal share")
    parser.add_argument("--trial-steps", type=int, metavar="N",
                        help="steps timed in each trial run, after the warm-up (default 20, or the recorded "
                             "window's where longer; fewer where the script runs fewer)")
    parser.add_argument("--try", dest="tries", action="append", choices=TRIES, default=[],
                        help="also try fixes that change numerics or compile: amp (autocast bf16), compile "
                             "(torch.compile of the model); repeatable")
    parser.add_argument("--dry-run", action="store_true", help="list the trials verify would run, run none")


def check_verify(args: argparse.Namespace) -> None:
    """What verify needs, said before anything runs: a script, sane numbers."""
    if Path(args.target).suffix != ".py":
        raise UsageError(f"verify reruns a script, and {args.target} is not a .py script (a trace, a saved session "
                         "or a job cannot be rerun: `advisor diagnose` reads them)")
    if args.max_fixes < 1:
        raise UsageError("--max-fixes must be at least 1")
    if args.budget <= 0:
        raise UsageError("--budget must be a positive number of seconds")
    if args.trial_steps is not None and args.trial_steps < 1:
        raise UsageError("--trial-steps must be at least 1")


def verified(args: argparse.Namespace, diagnosis: Any, chosen: Any, say: Any) -> list[Any] | None:
    """The diagnosis's findings verified, ranked by measured saving where measured; None
    after a --dry-run's list is printed."""
    from advisor.collect.steps import DEFAULT_RECORDED_STEPS, DEFAULT_WARMUP_STEPS, StepWindow
    from advisor.collect.torch_hooks import import_torch
    from advisor.findings import NotVerified
    from advisor.verify.run import (
        DEFAULT_TRIAL_STEPS,
        MAX_PAIRS,
        TrialsStopped,
        plan_trials,
        rank_by_measured,
        verify_findings,
    )

    specs = {spec.id: spec for spec in chosen.specs}
    findings = list(diagnosis.findings)
    meta = diagnosis.session.meta
    if (meta.trace_metadata or {}).get("ending") == "interrupt":
        # Ctrl-C or a signal stopped the script's run: the diagnosis of what it ran is the
        # report, and no trial runs the script again.
        how = _stopped_how(meta.exit_code)
        print(f"advisor: verify {how} during the diagnosis: no trial runs; the report is the diagnosis of the "
              "steps that ran", file=sys.stderr)
        reason = f"not measured: verify was {how} during the diagnosis, before any trial"
        return [finding.model_copy(update={"not_verified": NotVerified(reason=reason)})
                if finding.verification is None else finding for finding in findings]
    torch, _ = import_torch()
    gpu = bool(torch is not None and torch.cuda.is_available())
    trials = plan_trials(findings, specs, gpu=gpu, tries=set(args.tries), max_fixes=args.max_fixes)
    window = StepWindow.parse(args.steps) if getattr(args, "steps", None) else StepWindow()
    warmup = window.start if window is not None else DEFAULT_WARMUP_STEPS
    steps = args.trial_steps or max(DEFAULT_TRIAL_STEPS, window.stop - window.start if window is not None
                                    and window.stop is not None else DEFAULT_RECORDED_STEPS)
    if args.dry_run:
        print(f"advisor verify would run {args.target} {MAX_PAIRS * 2} times at most per fix "
              f"({warmup} warm-up steps, then {steps} timed), within {args.budget:.0f} s in all:")
        for trial in trials:
            what = trial.fix.describe() if trial.fix is not None else trial.why_not
            print(f"  {trial.index + 1}. {trial.rule}: {what}")
        return None
    if any(trial.fix is not None for trial in trials):
        print(f"advisor: {VERIFY_WARNING}", file=sys.stderr)
    step_source = (meta.trace_metadata or {}).get("step_source")
    leads = {spec.id for spec in chosen.specs if spec.leads}
    try:
        out = verify_findings(findings, trials, script=str(args.target), args=list(args.script_args or []),
                              step_source=step_source, warmup=warmup, steps=steps, budget_s=args.budget, say=say)
    except TrialsStopped as stopped:
        _report_so_far(args, diagnosis, rank_by_measured(stopped.findings, leads), str(stopped))
        raise stopped.interrupt from None
    return rank_by_measured(out, leads)


def _report_so_far(args: argparse.Namespace, diagnosis: Any, findings: list[Any], how: str) -> None:
    """The report with what the trials measured before they were stopped, written where it
    was asked for; the command then ends as the interrupt says."""
    from advisor.reports import render

    print(f"advisor: verify {how} during its trials: no further trial runs; the report has what was measured",
          file=sys.stderr)
    render(diagnosis.report.model_copy(update={"findings": findings}), args.format, args.output)
    if args.output:
        print(f"advisor: report written to {args.output}", file=sys.stderr)


def _stopped_how(exit_code: int | None) -> str:
    """How a run that ended by an interrupt was stopped, from its exit code (128 + the signal)."""
    import signal

    if exit_code is not None and exit_code > 128 and exit_code != 130:
        try:
            return f"stopped by {signal.Signals(exit_code - 128).name}"
        except ValueError:
            pass
    return "interrupted (Ctrl-C)"
