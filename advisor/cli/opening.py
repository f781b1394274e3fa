"""What `advisor diagnose` (and verify, summary, timeline) opens for the target it was
given, through the target stage (advisor.targets): a script run under the collectors (its
profile kept on disk until the report is written, the ranks it spawned found, a run that
never reached its code said in one line), a launch of many ranks, a job's rank sources or a
merged trace split into them, or one profile read; each judged against the GPU chosen and
given its counters alike.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from advisor.cli.parser import options_hint
from advisor.errors import UsageError
from advisor.targets import is_script as _is_script


def session_for(args: argparse.Namespace, *, kept=None):
    """The Session for TARGET as read or collected, and the script's exit code where a
    script ran, judged against --gpu where given (its step model, advisor.step, is built by
    whatever judges it next: the diagnosis, the tables). With ``kept``, a script's profile
    is kept on disk until the command is done (advisor.cli.keep). A trace or saved session
    is opened by the target stage, as every door opens one (advisor.targets.open_profile)."""
    from advisor.targets import gpu_id

    gpu = gpu_id(args.gpu)  # an unknown name is a UsageError before anything runs
    if not _is_script(Path(args.target)):
        return _read(args, gpu), None
    if kept is not None:
        session, exit_code, _ranks = collected(args, kept)
    else:
        session, exit_code, _ranks = _collect(args)
    return judged(session, args, gpu), exit_code


def read_from(args: argparse.Namespace) -> Path | None:
    """The trace file whose session cache entry keeps the tables of TARGET's session: the
    target where it is one trace file read through the cache, without counters added
    from elsewhere (``--ncu``); None for anything else (advisor.importers.cache.tables)."""
    target = Path(args.target)
    if (not getattr(args, "use_cache", False) or getattr(args, "ncu", None) or getattr(args, "script_args", None)
            or _is_script(target) or not target.is_file()):
        return None
    return target


def judged(session, args: argparse.Namespace, gpu: str | None = None):
    """The session judged against the chosen GPU and given its counters, as every door
    does it (advisor.targets.with_gpu, with_counters)."""
    from advisor.targets import with_counters, with_gpu

    return with_counters(with_gpu(session, gpu or args.gpu), Path(args.target), getattr(args, "ncu", None) or ())


def _ended_before_first_step(script: Path, exit_code: int, error: str, script_args: list[str] | None = None,
                             command: str = "diagnose"):
    from advisor.errors import ScriptError

    failed = ScriptError(f"{script} ended before its first step (exit code {exit_code}: {error}); there is "
                         "nothing to diagnose" + options_hint(script, exit_code, script_args or [], command))
    failed.exit_code = exit_code
    return failed


def _check_it_ran(session, exit_code: int | None, script: Path, script_args: list[str] | None = None,
                  command: str = "diagnose") -> None:
    """A script that failed before it ran any of its model (a syntax error, an import
    error, an argparse exit) is said in one line with its own message and exit code: its
    profile is empty, and a report of it would only mislead."""
    error = session.meta.script_error
    if not exit_code or error is None or session.meta.timed_steps or error.startswith(("stopped by",
                                                                                         "KeyboardInterrupt")):
        return
    if session.events["kind"].isin(("op", "step", "kernel", "memcpy", "memset")).any():
        return
    if _ran_its_own_code(session.events):
        return
    raise _ended_before_first_step(script, exit_code, error, script_args, command)


# Sampled stacks of the script's own work (outside imports) that show it ran more than its
# set-up: at the sampler's 16 ms, about 50 ms of work. An argparse exit or an import error
# spends its time importing.
OWN_WORK_SAMPLES = 3


def _ran_its_own_code(events) -> bool:
    """Whether the main thread's sampled stacks show the script working outside imports (a
    script with no steps records no op outside a window, but it ran its model)."""
    from advisor.session import text

    stacks = events[(events["kind"] == "stack").to_numpy()]
    if len(stacks) < OWN_WORK_SAMPLES:
        return False
    own = [stack for stack in text(stacks["call_stack"]) if stack and "importlib._bootstrap" not in stack]
    return len(own) >= OWN_WORK_SAMPLES


def collected(args: argparse.Namespace, kept, *, spawned_ranks: bool = False):
    """``_collect`` for a script, its profile then put on disk before anything
    else runs (``kept``; --save where given and the run is stopped). A Ctrl-C from the
    script's end until then waits, then stops the run with the profile kept."""
    from advisor.cli.keep import save_whole
    from advisor.collect.script import HeldInterrupts, syntax_error

    refused = syntax_error(Path(args.target)) if Path(args.target).is_file() else None
    if refused is not None:
        raise _ended_before_first_step(Path(args.target), 1, refused)  # 1: as Python exits on it
    held = HeldInterrupts()
    save = getattr(args, "save", None)
    try:
        session, exit_code, launched = _collect(args, spawned_ranks=spawned_ranks, held=held)
        if launched is None:
            _check_it_ran(session, exit_code, Path(args.target), list(args.script_args or []), args.command)
        if launched is None and not save:
            kept.session(session, Path(args.target).stem)
        elif launched is None and held.came:
            try:
                save_whole(session, save)
            finally:  # an interrupt raised by save_whole comes after a whole save
                if (save / "session.json").is_file():
                    kept.saved(save)
    finally:
        held.release()
    if held.came:
        _raise_held(held.signum)
    return session, exit_code, launched


def _raise_held(signum: int | None) -> None:
    """The interrupt held while the profile was put on disk, raised as the signal it was:
    SIGTERM and SIGHUP as advisor.errors.Stopped (said by name, exit 128 + the signal),
    Ctrl-C as KeyboardInterrupt (exit 130)."""
    import signal

    from advisor.errors import Stopped

    if signum is not None and signum != signal.SIGINT:
        raise Stopped(signum)
    raise KeyboardInterrupt


def _collect(args: argparse.Namespace, *, spawned_ranks: bool = False, held=None):
    """The script TARGET run under the collectors: (session, exit code, the launch of the
    ranks the script spawned or None); with ``spawned_ranks``, ranks the script starts with
    torch.multiprocessing.spawn are profiled and saved, each its own session
    (advisor.collect.spawned)."""
    from advisor.collect import collect_script
    from advisor.collect.script import DEFAULT_EVENT_BUDGET
    from advisor.collect.spawned import ProfiledRank
    from advisor.collect.steps import StepWindow

    target, script_args = Path(args.target), args.script_args
    steps = StepWindow.parse(args.steps) if args.steps is not None else "default"
    if args.event_budget is not None and args.event_budget < 1:
        raise UsageError("--event-budget must be at least 1")
    run = collect_script(target, script_args, gpu=args.collector == "auto", steps=steps,
                         with_stack=args.with_stack, say=say,
                         event_budget=args.event_budget or DEFAULT_EVENT_BUDGET,
                         spawned_ranks=ProfiledRank if spawned_ranks else None, held=held,
                         run_to_end=bool(getattr(args, "run_to_end", False)), stop_seconds=_stop_seconds(args))
    say(f"{target.name} {_ended(run.run)}")
    return run.session, run.exit_code, _spawned(run.run, [str(target), *script_args])


def _read(args: argparse.Namespace, gpu: str | None):
    """The trace or saved session TARGET, opened by the target stage: read through the
    session cache (in parts, by as many processes as the command may use, taken from the
    read ahead where one was started), judged against ``gpu`` and given its counters."""
    from advisor.importers.forked import processes_allowed
    from advisor.targets import Target, open_profile

    target, script_args = Path(args.target), args.script_args
    if (getattr(args, "steps", None) is not None or getattr(args, "event_budget", None) is not None
            or getattr(args, "with_stack", False)):
        raise UsageError("--steps, --event-budget and --with-stack choose what a script records; a trace or "
                         "session is read whole")
    if script_args:
        raise UsageError(f"arguments after {target} are only for scripts, and {target} is not a .py script")
    from advisor.cli.progress import progress_bar

    with progress_bar(f"Reading {target.name}", unit="bytes") as update:
        return open_profile(Target(target, "session" if target.is_dir() else "trace"), gpu=gpu or args.gpu,
                            ncu=getattr(args, "ncu", None) or (), progress=update, ahead=getattr(args, "ahead", None),
                            processes=processes_allowed(), give_back=True, use_cache=args.use_cache)


def _spawned(run, command: list[str]):
    """The ranks a script started with torch.multiprocessing.spawn, as a launch whose ranks
    saved their sessions, or None where it started none (its folder is then removed)."""
    from advisor.job.launch import Launch

    folder = run.children_dir
    if folder is None:
        return None
    found = Launch.from_folder(Path(folder), command=command, exit_code=run.exit_code)
    if found is None:
        shutil.rmtree(folder, ignore_errors=True)
    return found


def _stop_seconds(args: argparse.Namespace) -> float | None:
    """How long a script runs after its recorded window: advisor's default (None), or
    within verify's budget a quarter of what is left of it (the trials need the rest)."""
    ends = getattr(args, "budget_ends", None)
    if ends is None:
        return None
    import time

    return max(5.0, min(60.0, (ends - time.monotonic()) / 4))


def say(line: str) -> None:
    """One line of progress on stderr while a script runs under advisor, where progress is
    shown (a terminal, ADVISOR_NO_PROGRESS unset): lines, not a bar, since the script
    writes to the same terminal."""
    from advisor.cli.progress import enabled

    if enabled():
        print(f"advisor: {line}", file=sys.stderr, flush=True)


def _ended(run) -> str:
    """How a script's run went, for the line after it: 'ran 30 steps in 12.3 s (exit 0)'."""
    how = {"normal": "", "exit": "", "exception": f", raised {run.error}", "interrupt": ", interrupted",
           "enough": ", stopped by advisor once it had the steps it needs; --run-to-end runs it whole"}
    return (f"ran {run.steps} step{'s' if run.steps != 1 else ''} in {run.wall_time_s:.1f} s "
            f"(exit {run.exit_code}{how.get(run.ending, '')})")


def launch(args: argparse.Namespace):
    """Run a torchrun launch with every rank under the collector, or None where the target
    is not a launcher."""
    from advisor.job.launcher import is_launcher

    if not is_launcher(args.target, args.script_args):
        return None
    from advisor.job.launch import launch

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if args.save:
        from advisor.cli.keep import check_save_dir

        check_save_dir(args.save)
    if args.event_budget is not None and args.event_budget < 1:
        raise UsageError("--event-budget must be at least 1")
    options = {"steps": args.steps, "collector": args.collector, "with_stack": args.with_stack,
               "event_budget": args.event_budget, "run_to_end": bool(getattr(args, "run_to_end", False))}
    return launch(args.target, args.script_args, options=options, save=args.save, say=say)


def target_of(args: argparse.Namespace):
    """TARGET classified once by the target stage (advisor.targets.classify): a script, a
    job's rank sources (a folder of rank traces, a saved job, several traces, a trace that
    merges ranks, split), a saved session or a trace. The options that do not fit it are
    refused in one line."""
    from advisor.targets import classify

    found = classify(args.target, args.script_args)
    for line in found.said:
        print(f"advisor: {line}", file=sys.stderr)
    if found.is_job and (args.steps is not None or args.event_budget is not None or args.with_stack):
        raise UsageError("--steps, --event-budget and --with-stack choose what a script records; a job's traces "
                         "are read whole")
    if found.kind not in ("job", "merged", "script") and (args.workers is not None or args.dask):
        raise UsageError("--workers and --dask are for a job of many ranks (a folder of rank traces, several "
                         "traces, or torchrun)")
    return found


def job_sources(args: argparse.Namespace) -> list[Path] | None:
    """One source per rank where the target is a job (``target_of``), else None."""
    found = target_of(args)
    return list(found.sources) if found.is_job else None


