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
import time
from pathlib import Path
from typing import Any

from advisor.errors import UsageError

VERIFY_HELP = ("advisor verify runs the script again several times, with each fix and without, so whatever "
               "the script does (files it writes, checkpoints, downloads) happens each time: its side effects "
               "are yours.")
VERIFY_WARNING = ("verify now runs the script again, several times, with each fix and without: whatever it "
                  "does (files it writes, checkpoints, downloads) happens each time.")
TRIES = ("amp", "compile")
MAX_BUDGET_S = 7 * 24 * 3600


def add_verify_options(parser: argparse.ArgumentParser, *, flag: bool) -> None:
    """The options of verify; with ``flag``, ``--verify`` turns them on (diagnose)."""
    if flag:
        parser.add_argument("--verify", action="store_true",
                            help="after the diagnosis, apply each finding's fix where advisor can and measure it "
                                 "(as `advisor verify`; runs the script several times)")
    parser.add_argument("--max-fixes", type=int, default=3, metavar="N",
                        help="verify the first N findings (default 3)")
    parser.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                        help="time for the whole command, the diagnosis's run of the script included (default "
                             "300 s): the trials get what the diagnosis leaves, each fix an equal share")
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
    # nan fails both comparisons; inf, or 1e9 s (past what a process wait takes), would
    # fail only once the diagnosis had run the script.
    if not 0 < args.budget <= MAX_BUDGET_S:
        raise UsageError(f"--budget must be a number of seconds above 0 and at most {MAX_BUDGET_S} (a week)")
    if args.trial_steps is not None and args.trial_steps < 1:
        raise UsageError("--trial-steps must be at least 1")
    # The budget covers the whole command: its clock starts here, before the diagnosis.
    args.budget_ends = time.monotonic() + args.budget


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
    ran = _steps_the_script_ran(meta)
    if ran is not None and ran < warmup + steps and any(trial.fix is not None for trial in trials):
        # Said before any trial: a trial cannot time more steps than the script runs.
        timed = max(ran - warmup, 0)
        print(f"advisor: the script ran {ran} steps, so a trial times {timed} of the {steps} asked (after "
              f"{warmup} warm-up steps){_longer_run(args, warmup + steps)}", file=sys.stderr)
    if args.dry_run:
        print(f"advisor verify would run {args.target} {MAX_PAIRS * 2} times at most per fix "
              f"({warmup} warm-up steps, then {steps} timed), within {args.budget:.0f} s in all; the fixes of "
              "this diagnosis (a verify diagnoses the script afresh first, and where a fix's setting depends on "
              "the machine's load, such as the number of workers, its trial can differ):")
        for trial in trials:
            what = trial.fix.describe() if trial.fix is not None else trial.why_not
            print(f"  {trial.index + 1}. {trial.rule}: {what}")
        return None
    left = getattr(args, "budget_ends", time.monotonic() + args.budget) - time.monotonic()
    if left <= 0 and any(trial.fix is not None for trial in trials):
        print(f"advisor: verify's budget of {args.budget:.0f} s was spent by the diagnosis: no trial runs "
              "(give a larger --budget)", file=sys.stderr)
        reason = f"not measured: the diagnosis spent verify's whole budget ({args.budget:.0f} s)"
        return [finding.model_copy(update={"not_verified": NotVerified(reason=reason)})
                if finding.verification is None else finding for finding in findings]
    if any(trial.fix is not None for trial in trials):
        print(f"advisor: {VERIFY_WARNING}", file=sys.stderr)
    step_source = (meta.trace_metadata or {}).get("step_source")
    leads = {spec.id for spec in chosen.specs if spec.leads}
    try:
        out = verify_findings(findings, trials, script=str(args.target), args=list(args.script_args or []),
                              step_source=step_source, warmup=warmup, steps=steps, budget_s=left, say=say)
    except TrialsStopped as stopped:
        _to_ledger(args, stopped.findings)
        _report_so_far(args, diagnosis, rank_by_measured(stopped.findings, leads), str(stopped))
        raise stopped.interrupt from None
    _to_ledger(args, out)
    return rank_by_measured(out, leads)


def _to_ledger(args: argparse.Namespace, findings: list[Any]) -> None:
    """Each measured fix as a record of the ledger (advisor.verify.ledger): the promise and
    what the trials measured. A ledger that cannot be written costs its records, said in
    one line, never the report."""
    from advisor.verify.ledger import LedgerEntry, append

    target = " ".join([str(args.target), *(args.script_args or [])])
    entries = []
    for finding in findings:
        done, promised = finding.verification, finding.saving
        if done is None or promised is None:
            continue
        entries.append(LedgerEntry(
            rule=finding.rule, source="verify", target=target, fix=done.applied,
            predicted_ms=promised.ms_per_step, low_ms=promised.low_ms_per_step, high_ms=promised.high_ms_per_step,
            measured_ms=done.measured_saving_ms_per_step,
            spread_ms=(done.before_spread_ms ** 2 + done.after_spread_ms ** 2) ** 0.5,
            before_ms=done.before_ms_per_step))
    if not entries:
        return
    try:
        path = append(entries)
    except OSError as exc:
        print(f"advisor: the ledger could not be written ({exc.strerror or exc}): this run's "
              f"{len(entries)} measurement(s) are in the report only", file=sys.stderr)
        return
    print(f"advisor: {len(entries)} measurement(s) added to the ledger {path} (`advisor ledger` shows how "
          "advisor's savings held)", file=sys.stderr)


def _steps_the_script_ran(meta: Any) -> int | None:
    """How many steps the diagnosis's run of the script made (None: not known)."""
    facts = (meta.trace_metadata or {}).get("advisor") or {}
    steps = facts.get("steps") if isinstance(facts, dict) else None
    if isinstance(steps, int) and steps > 0:
        return steps
    return len(meta.timed_steps) or None


# A script's own options for how long it runs, as training scripts spell them.
_LENGTH_OPTIONS = ("--steps", "--max-steps", "--max_steps", "--iters", "--iterations", "--num-steps",
                   "--num_steps", "--epochs", "--num-epochs", "--num_epochs", "--train-steps")


def _longer_run(args: argparse.Namespace, needed: int) -> str:
    """The suggestion that ends the too-few-steps line: the script's own option where it
    has one of the usual names, else --trial-steps."""
    script_args = list(args.script_args or [])
    for i, arg in enumerate(script_args):
        name, _, value = arg.partition("=")
        if name in _LENGTH_OPTIONS:
            given = value or (script_args[i + 1] if i + 1 < len(script_args) else "")
            unit = "epochs" if "epoch" in name else "steps"
            if unit == "steps":
                return f": run the script longer ({name} {needed} or more, it has {name} {given})"
            return f": run the script longer ({name} more than {given}), or give fewer --trial-steps"
    return (f": run the script for {needed} steps or more (its own option for how long it runs), "
            "or give fewer --trial-steps")


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
