"""The command line of ``advisor verify`` (and ``advisor diagnose --verify``).

The options, the checks made before the script runs, and the step from a diagnosis to its
findings verified (advisor.verify.run) or, with --dry-run, to the list of trials.
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
    from advisor.verify.run import DEFAULT_TRIAL_STEPS, MAX_PAIRS, plan_trials, rank_by_measured, verify_findings

    specs = {spec.id: spec for spec in chosen.specs}
    findings = list(diagnosis.findings)
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
    meta = diagnosis.session.meta
    step_source = (meta.trace_metadata or {}).get("step_source")
    out = verify_findings(findings, trials, script=str(args.target), args=list(args.script_args or []),
                          step_source=step_source, warmup=warmup, steps=steps, budget_s=args.budget, say=say)
    return rank_by_measured(out, {spec.id for spec in chosen.specs if spec.leads})
