"""Run a user's training script the way ``python train.py args`` would, under the host
collector, and keep what it left behind whatever way it ended.

The script runs in this process with ``runpy.run_path(..., run_name="__main__")``;
``sys.argv`` is swapped for ``[script, *args]`` and the script's folder put first on
``sys.path``, both restored afterwards; the working directory is left alone. An exception,
``sys.exit(n)`` or KeyboardInterrupt in the script ends the run, not advisor: the trace is
still exported from what was collected, the user's traceback is shown on stderr as Python
would show it, and the exit code Python would have given is kept.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from advisor.collect import torch_hooks
from advisor.collect.sampler import DEFAULT_INTERVAL_S, HostSampler, HostSamples
from advisor.collect.stacks import DEFAULT_INTERVAL_S as STACK_INTERVAL_S
from advisor.collect.stacks import (
    StackSampler,
    StackSamples,
    install_worker_sampling,
    read_worker_samples,
)
from advisor.collect.steps import EnoughSteps, StepWindow, StopAfter
from advisor.errors import ScriptError
from advisor.session import CollectionGap

NORMAL = "normal"
EXCEPTION = "exception"
EXIT = "exit"
INTERRUPT = "interrupt"
ENOUGH = "enough"  # advisor stopped the script once the window and the timed steps after it were in

INTERRUPT_EXIT_CODE = 130  # what a shell reports for a process ended by SIGINT
# Held while the profile is read back: Ctrl-C, and SIGTERM / SIGHUP where advisor's
# command handles them (advisor.cli: raised as advisor.errors.Stopped).
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Events a whole-run recording (--steps all) may write before it stops recording: about
# 1 to 2 GB of memory while reading them back.
DEFAULT_EVENT_BUDGET = 3_000_000

_HOOKS_DIR = os.path.dirname(os.path.abspath(torch_hooks.__file__)) + os.sep


@dataclass(frozen=True)
class ScriptRun:
    """One run of a user's script under the host collector."""

    script: Path
    args: list[str]
    command: list[str]
    """``sys.argv`` as the script saw it: the script path as given, then its arguments."""
    exit_code: int
    ending: str
    """``normal``, ``exception``, ``exit`` (SystemExit, any code), ``interrupt`` or ``enough``
    (stopped by advisor once it had the steps it needs)."""
    error: str | None
    """How it ended, in one line, where not normally: ``ValueError: bad shape``,
    ``SystemExit: 3``, ``KeyboardInterrupt``."""
    wall_time_s: float
    trace_path: Path | None
    """The Chrome trace torch.profiler exported (its first part, where the run was recorded
    in parts); None where nothing was profiled."""
    step_source: str | None = None
    """What started a step: ``dataloader``, ``optimizer`` or ``forward`` (see advisor.collect.hooks.steps)."""
    steps: int = 0
    partial_steps: list[int] = field(default_factory=list)
    batch_size: int | None = None
    batch_size_source: str | None = None
    host_syncs: list[dict] = field(default_factory=list)
    """Host-blocking calls per source line (see advisor.collect.hooks.syncs.HostSyncSite), most time first."""
    torch_version: str | None = None
    notes: list[str] = field(default_factory=list)
    """One line each: what was not collected and why."""
    gpu_capture: Any = None
    """The CUPTI collector's CuptiCapture (events already attributed) where it ran."""
    gpu_not_measured: str | None = None
    """Why the GPU side was not collected, in one line, where it was not."""
    host_facts: dict = field(default_factory=dict)
    """The hooks' account of the run (step source, partial steps, batch size, host syncs,
    every step's time, the loaders, child processes), complete at the run's end."""
    host_samples: HostSamples | None = None
    """The host sampler's reads over the script's run (CPU use, RSS); None where sampling
    was off or could not start."""
    trace_parts: list[Path] = field(default_factory=list)
    """Every Chrome trace file of the run, in order (one, or the parts of a whole-run
    recording)."""
    stacks: list[StackSamples] = field(default_factory=list)
    """Python stack samples: the main thread's, then each DataLoader worker's."""
    gaps: list[CollectionGap] = field(default_factory=list)
    """What the collectors failed to measure, structured (notes says it in words)."""
    window: StepWindow | None = None
    """The steps asked for (None: the whole run)."""
    work_dir: Path | None = None
    """The temporary folder of the run's files (traces, worker samples); the caller's to
    remove once read."""
    gpu_available: bool = False
    """Whether torch saw a CUDA device (a GPU left unmeasured is then a gap)."""
    children_dir: Path | None = None
    """Where the ranks the script started with torch.multiprocessing.spawn saved their
    sessions (rank-N/, advisor.collect.spawned), where they were profiled; the caller's."""

    @property
    def profiled(self) -> bool:
        return self.trace_path is not None or self.gpu_capture is not None

    @property
    def script_error(self) -> str | None:
        """``error`` where the run did not end well (a ``sys.exit(0)`` ended well)."""
        return None if self.exit_code == 0 else self.error


def run_script(
    script: str | os.PathLike[str],
    args: list[str] | tuple[str, ...] = (),
    *,
    save_trace_to: str | os.PathLike[str] | None = None,
    record_shapes: bool = True,
    with_stack: bool = False,
    show_traceback: bool = True,
    gpu: bool = True,
    steps: Any = "default",
    sample_interval_s: float | None = DEFAULT_INTERVAL_S,
    stack_interval_s: float | None = STACK_INTERVAL_S,
    event_budget: int | None = DEFAULT_EVENT_BUDGET,
    say: Callable[[str], None] | None = None,
    call: Callable[[], Any] | None = None,
    spawned_ranks: type | None = None,
    hold_interrupts: HeldInterrupts | None = None,
    run_to_end: bool = False,
    stop_seconds: float | None = None,
) -> ScriptRun:
    """Run ``script`` with ``args`` under the step/phase hooks and a collector.

    ``steps`` is the window of steps recorded (a StepWindow; None for the whole run;
    "default" for steps 2 to 6). Where ``gpu`` and the CUPTI collector can run (an NVIDIA
    GPU, a CUDA torch, cupti-python), it records the GPU side for those steps and the host
    side comes from the hooks alone: torch.profiler is not started, since Kineto would take
    CUPTI over. Otherwise torch.profiler (CPU activities; Python stacks only with
    ``with_stack``) records the host side for those steps, and its trace goes to
    ``save_trace_to`` or, without it, to ``trace.json`` in a new temporary folder that the
    caller owns (``work_dir``). The whole run (``steps=None``) is recorded in parts until
    ``event_budget`` events are written. Every step is timed whether recorded or not.

    While the script runs, the host sampler (advisor.collect.sampler) reads the process's
    and the machine's CPU use and the RSS every ``sample_interval_s``, and the stack
    sampler (advisor.collect.stacks) the main thread's and the DataLoader workers' Python
    stacks every ``stack_interval_s`` (None: not at all), whatever way the script ends.
    Without an importable torch the script still runs, unprofiled, and ``notes`` says so.
    ``say(line)`` hears of recording starting and stopping.

    ``call``: run this function instead of the script (a rank that
    torch.multiprocessing.spawn started, advisor.collect.spawned); ``script`` then names
    where it came from. ``spawned_ranks``: the class that runs each rank the script starts
    with torch.multiprocessing.spawn under a collector of its own, saving its session in
    ``children_dir`` (advisor.collect.spawned.ProfiledRank, given by the command, so the
    hooks need not import what runs the ranks); None: the ranks run as the script made them.

    Where a window is recorded, the script is stopped (advisor.collect.steps.StopAfter)
    once the window is over and enough steps after it are timed, unless ``run_to_end``.

    Raises ScriptError only when the script cannot be started (missing, not a file,
    unreadable); whatever the script itself does ends up in the returned ScriptRun.
    """
    argv0 = os.fspath(script)
    path = Path(argv0)
    if call is None:
        _check_runnable(path)
    args = [str(a) for a in args]
    window = StepWindow() if steps == "default" else steps
    work_dir = Path(tempfile.mkdtemp(prefix="advisor-"))
    c = _Collectors(say=say or (lambda line: None))
    # Made before the collectors start, started after them: a thread running when
    # torch.profiler starts is traced by its Python tracer (with_stack), read by read.
    sampler = _make_sampler(sample_interval_s, c.notes)
    _start_collectors(c, window=window, gpu=gpu, record_shapes=record_shapes, with_stack=with_stack,
                      event_budget=event_budget, work_dir=work_dir, spawned_ranks=spawned_ranks,
                      script=argv0, args=args, run_to_end=run_to_end, stop_seconds=stop_seconds)
    stack_sampler, undo_workers = _start_stacks(c.host, stack_interval_s, work_dir / "stacks", c.notes)

    saved_argv, saved_path = sys.argv, sys.path[:]
    if call is None:
        sys.argv = [argv0, *args]
        sys.path.insert(0, os.path.dirname(os.path.realpath(argv0)))
    sampler = _start_sampler(sampler, c.notes)
    start = time.perf_counter()
    try:
        ended = _run_code(argv0, call)
    finally:
        if hold_interrupts is not None:
            hold_interrupts.start()
        wall_time_s = time.perf_counter() - start
        host_samples = _stop_sampler(sampler, c.notes)
        stacks = _stop_stacks(stack_sampler, undo_workers, work_dir / "stacks", c.notes)
        sys.argv = saved_argv
        sys.path[:] = saved_path
        _flush_std()

    collection, gpu_capture = _stop_collectors(c)
    if ended.raised is not None and show_traceback:
        _show_like_python(ended.raised, argv0)
    ended.raised = None  # frames of the script hold its tensors; let them go
    trace_parts = _write_trace(c, Path(save_trace_to) if save_trace_to is not None else work_dir / "trace.json")
    if collection is not None:
        c.notes.extend(collection.notes)
    return ScriptRun(
        script=path,
        args=args,
        command=[argv0, *args],
        exit_code=ended.exit_code,
        ending=ended.ending,
        error=ended.error,
        wall_time_s=wall_time_s,
        trace_path=trace_parts[0] if trace_parts else None,
        step_source=collection.step_source if collection else None,
        steps=collection.steps if collection else 0,
        partial_steps=list(collection.partial_steps) if collection else [],
        batch_size=collection.batch_size if collection else None,
        batch_size_source=collection.batch_size_source if collection else None,
        host_syncs=list(collection.host_syncs) if collection else [],
        torch_version=getattr(c.torch, "__version__", None) if c.torch is not None else None,
        notes=c.notes,
        gpu_capture=gpu_capture,
        gpu_not_measured=c.gpu_not_measured if gpu_capture is None else None,
        host_facts=collection.metadata() if collection is not None else {},
        host_samples=host_samples,
        trace_parts=trace_parts,
        stacks=stacks,
        gaps=c.gaps,
        window=window,
        work_dir=work_dir,
        gpu_available=c.gpu_available,
        children_dir=c.children_dir,
    )


@dataclass
class _Collectors:
    """The collectors of one run, and what they could not do, in words and as gaps."""

    say: Callable[[str], None]
    torch: Any = None
    host: torch_hooks.HostCollector | None = None
    gpu: Any = None
    gpu_not_measured: str | None = None
    gpu_available: bool = False
    children_dir: Path | None = None
    notes: list[str] = field(default_factory=list)
    gaps: list[CollectionGap] = field(default_factory=list)

    def lost(self, note: str, why: str) -> None:
        """The host profile is lost or partly lost: ``note`` for the user, ``why`` as a gap."""
        self.notes.append(note)
        self.gaps.append(CollectionGap(what="host profile", why=why))


def _start_collectors(c: _Collectors, *, window: StepWindow | None, gpu: bool, record_shapes: bool,
                      with_stack: bool, event_budget: int | None, work_dir: Path, spawned_ranks: type | None,
                      script: str, args: list[str], run_to_end: bool = False,
                      stop_seconds: float | None = None) -> None:
    """Start the GPU collector (where it can run) and then the host collector, into ``c``."""
    torch, why_not = torch_hooks.import_torch()
    c.torch = torch
    if torch is None:
        c.lost(f"torch is not importable ({why_not}): the script ran without the host profiler",
               f"torch is not importable ({why_not}): the script ran unprofiled")
        c.gpu_not_measured = "torch is not importable"
        return
    c.gpu_available = _cuda_available(torch)
    if gpu:
        from advisor.collect import cupti  # noqa: PLC0415  (imports cupti-python lazily itself)

        # The GPU side starts first: it must own CUPTI before anything else asks.
        c.gpu, c.gpu_not_measured = cupti.start_collector(torch, window=window)
    else:
        c.gpu_not_measured = "the host collector was asked for"
    in_parts = window is None and c.gpu is None
    if spawned_ranks:
        c.children_dir = Path(tempfile.mkdtemp(prefix="advisor-ranks-"))
    options = {"steps": window, "gpu": gpu, "with_stack": with_stack, "event_budget": event_budget,
               "script": script, "args": list(args), "run_to_end": run_to_end}
    stop = None if run_to_end or window is None else StopAfter(distributed=lambda: _distributed(torch))
    if stop is not None and stop_seconds is not None:
        stop.seconds = stop_seconds
    c.host = torch_hooks.HostCollector(
        torch, record_shapes=record_shapes, with_stack=with_stack, profiler=c.gpu is None,
        listener=c.gpu, window=window, event_budget=event_budget if in_parts else None,
        parts_dir=work_dir / "parts" if in_parts else None, say=c.say,
        ranks=(c.children_dir, options, spawned_ranks) if c.children_dir is not None else None, stop=stop)
    try:
        c.host.start()
    except Exception as exc:
        c.lost(f"torch.profiler could not start ({_one_line(exc)}): the script ran without it",
               f"torch.profiler could not start ({_one_line(exc)})")
        c.host = None


def _distributed(torch: Any) -> bool:
    """Whether the script has made a process group (its ranks then stop at one step)."""
    try:
        return bool(torch.distributed.is_available() and torch.distributed.is_initialized())
    except Exception:  # noqa: BLE001  (torch's own state: taken as distributed, the safe side)
        return True


@dataclass
class _Ended:
    """How the script's code ended."""

    ending: str
    exit_code: int
    error: str | None
    raised: BaseException | None
    """What to show as Python would (None: Python would print nothing)."""


def _run_code(argv0: str, call: Callable[[], Any] | None) -> _Ended:
    """Run the script (or ``call``) as ``python script`` would, catching however it ends.

    run_path gives the script the path it is handed as both sys.argv[0] and __file__. It is
    handed the path as the user typed it, so sys.argv[0] is what `python script.py` gives;
    __file__ is then relative where the path was, where Python (3.9+) would make it
    absolute. sys.path[0] is, as in Python, the script's folder with links resolved."""
    owner = os.getpid()
    real_exit = os._exit
    os._exit = _exit_in(owner, real_exit)
    ended = _Ended(NORMAL, 0, None, None)
    try:
        if call is not None:
            call()
        else:
            runpy.run_path(argv0, run_name="__main__")
    except EnoughSteps as exc:  # advisor's own stop: the script ran what the diagnosis needs
        ended = _Ended(ENOUGH, 0, str(exc), None)
    except _HardExit as exc:  # Python prints nothing for os._exit
        ended = _Ended(EXIT, exc.code, f"os._exit({exc.code})", None)
    except SystemExit as exc:
        ended = _Ended(EXIT, _exit_code(exc.code), _one_line(exc), exc)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP where advisor's command turned them into it
        stopped = getattr(exc, "exit_code", None)
        # Python prints nothing for a process a signal ends
        ended = _Ended(INTERRUPT, stopped, f"stopped by {exc.name}", None) if stopped else \
            _Ended(INTERRUPT, INTERRUPT_EXIT_CODE, "KeyboardInterrupt", exc)
    except BaseException as exc:  # the user's error, whatever its type: reported, not raised
        ended = _Ended(EXCEPTION, 1, _one_line(exc), exc)
    finally:
        os._exit = real_exit
        if os.getpid() != owner:  # a child the script forked, at the end of the script's code
            _end_forked_child(ended.raised, ended.exit_code, argv0)
    return ended


def _stop_collectors(c: _Collectors) -> tuple[torch_hooks.HostCollection | None, Any]:
    """Stop the host collector, then the GPU one (told the host's partial steps)."""
    collection = gpu_capture = None
    if c.host is not None:
        try:
            collection = c.host.stop()
        except Exception as exc:
            c.lost(f"torch.profiler failed to stop ({_one_line(exc)}): no trace",
                   f"torch.profiler failed to stop ({_one_line(exc)}): its trace is lost")
            c.host = None
    if c.gpu is not None:
        try:
            gpu_capture = c.gpu.stop(partial_steps=collection.partial_steps if collection is not None else [])
        except Exception as exc:
            c.gpu_not_measured = f"the CUPTI collector failed to stop ({_one_line(exc)})"
    return collection, gpu_capture


def _write_trace(c: _Collectors, target: Path) -> list[Path]:
    """The host collector's Chrome trace files, where torch.profiler recorded."""
    if c.host is None or c.gpu is not None:
        return []
    try:
        return c.host.trace_parts(target)
    except Exception as exc:
        c.lost(f"the trace could not be written to {target} ({_one_line(exc)})",
               f"the trace could not be written to {target} ({_one_line(exc)})")
        return []


def _cuda_available(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken CUDA install: no GPU to miss
        return False


def _start_stacks(collector: Any, interval_s: float | None, directory: Path,
                  notes: list[str]) -> tuple[StackSampler | None, Callable[[], None] | None]:
    """The main thread's stack sampler, and the DataLoader workers' sampling installed
    (its undo), where stacks are asked for and the hooks run."""
    if interval_s is None or collector is None:
        return None, None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        undo = install_worker_sampling(directory, interval_s)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"DataLoader workers' Python stacks could not be sampled ({_one_line(exc)})")
        undo = None
    try:
        sampler = StackSampler(interval_s=interval_s, state=collector.sample_state).start()
    except Exception as exc:  # noqa: BLE001
        notes.append(f"the Python stack sampler could not start ({_one_line(exc)}): where host time goes in "
                     "Python was not measured")
        sampler = None
    return sampler, undo


def _stop_stacks(sampler: StackSampler | None, undo: Callable[[], None] | None, directory: Path,
                 notes: list[str]) -> list[StackSamples]:
    found: list[StackSamples] = []
    if sampler is not None:
        found.append(sampler.stop())
    if undo is not None:
        undo()
        workers, problems = read_worker_samples(directory)
        found.extend(workers)
        notes.extend(f"a DataLoader worker's stack samples could not be read: {p}" for p in problems)
    return found


def _make_sampler(interval_s: float | None, notes: list[str]) -> HostSampler | None:
    if interval_s is None:
        return None
    try:
        return HostSampler(interval_s=interval_s)
    except Exception as exc:  # psutil missing or refused: the run goes on unsampled
        notes.append(f"the host sampler could not start ({_one_line(exc)}): CPU use and RSS were not sampled")
        return None


def _start_sampler(sampler: HostSampler | None, notes: list[str]) -> HostSampler | None:
    if sampler is None:
        return None
    try:
        return sampler.start()
    except Exception as exc:
        notes.append(f"the host sampler could not start ({_one_line(exc)}): CPU use and RSS were not sampled")
        sampler.stop()  # closes what it opened
        return None


def _stop_sampler(sampler: HostSampler | None, notes: list[str]) -> HostSamples | None:
    if sampler is None:
        return None
    try:
        samples = sampler.stop()
    except Exception as exc:
        notes.append(f"the host sampler failed to stop ({_one_line(exc)}): CPU use and RSS were not sampled")
        return None
    notes.extend(samples.notes)
    return samples


def _check_runnable(path: Path) -> None:
    if not path.exists():
        raise ScriptError(f"{path}: no such script")
    if not path.is_file():
        raise ScriptError(f"{path} is not a file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ScriptError(f"{path} cannot be read: {exc.strerror or exc}") from None


def syntax_error(path: Path) -> str | None:
    """How Python would refuse to run the script (its SyntaxError, one line), or None: said
    before the collectors start, which take seconds on a GPU."""
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte in the source
        where = f" ({path.name}, line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        return f"{type(exc).__name__}: {getattr(exc, 'msg', None) or exc}{where}"
    except OSError:  # said by the run itself
        return None
    return None


def _exit_code(code: object) -> int:
    """The exit status Python gives ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    return 1


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


class _HardExit(BaseException):
    """os._exit(code) called by the script on advisor's main thread: ends the script as
    os._exit would, but lets advisor report what was collected (os._exit itself would end
    the process on the spot, the profile with it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit_in(owner: int, real_exit: Callable[[int], Any]) -> Callable[[int], Any]:
    """os._exit while the script runs: in advisor's own process and main thread it ends
    the script (``_HardExit``); in a child the script forked, or on another thread, it is
    the real os._exit."""

    def _exit(code: int) -> Any:
        if os.getpid() == owner and threading.current_thread() is threading.main_thread():
            raise _HardExit(int(code))
        return real_exit(code)

    return _exit


class HeldInterrupts:
    """Ctrl-C held back from the moment the script ends until its profile is read back
    (the caller releases it): an interrupt then would lose the trace the profiler is
    writing. ``came`` says whether one was held; the caller then stops once the profile
    is safe. Only the main thread can hold signals; elsewhere this does nothing."""

    def __init__(self) -> None:
        self.came = False
        self.signum: int | None = None  # the last signal held: SIGINT, SIGTERM or SIGHUP
        self._previous: Any = None

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._note) for sig in HELD_SIGNALS
                              if sig == signal.SIGINT or signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN)}

    def _note(self, signum: int, frame: Any) -> None:
        self.came = True
        self.signum = signum

    def release(self) -> None:
        if self._previous is not None:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous = None


def _end_forked_child(raised: BaseException | None, exit_code: int, file_name: str) -> None:
    """End a process the script forked that ran on to the end of the script (a child
    that neither exec'd nor called os._exit): as Python would end it (the traceback, the
    exit code), never by going on into advisor's analysis and report, which belong to the
    process advisor started. Its collectors' threads did not survive the fork, and the
    profiler's exit handlers would wait on them forever, so it leaves with os._exit."""
    if raised is not None:
        _show_like_python(raised, file_name)
    _flush_std()
    os._exit(exit_code)


def _show_like_python(exc: BaseException, file_name: str) -> None:
    """Print what Python prints when ``exc`` ends a script: nothing for sys.exit(int or
    None), the message for sys.exit("msg"), else the traceback from the script's frames
    down (advisor's and runpy's frames are left out)."""
    if isinstance(exc, SystemExit):
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    else:
        tb = _from_script(exc, file_name)
        # An error advisor's own code raised and handled (a hook's, between two of the
        # script's lines) can be the context of the script's: Python would print it first,
        # "During handling of the above exception". The script never saw it.
        hide = (exc.__context__ is not None and not exc.__suppress_context__
                and _raised_in_advisor(exc.__context__))
        if hide:
            exc.__suppress_context__ = True
        try:
            traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        finally:
            if hide:
                exc.__suppress_context__ = False
    _flush_std()


_ADVISOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _raised_in_advisor(exc: BaseException) -> bool:
    """Whether ``exc`` was raised and caught in advisor's own code: every frame of its
    traceback is advisor's (an error the script caught itself has the script's frame)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_ADVISOR_DIR):
            return False
        tb = tb.tb_next
    return True


def _from_script(exc: BaseException, file_name: str) -> TracebackType | None:
    """The traceback from the first frame of the script on, without the frames of
    advisor's hooks that the error passed through (the user did not write them); all of
    it where the script has no frame, except for a SyntaxError, which Python shows
    without frames."""
    tb = exc.__traceback__
    cursor: TracebackType | None = tb
    while cursor is not None and cursor.tb_frame.f_code.co_filename != file_name:
        cursor = cursor.tb_next
    if cursor is None:
        return None if isinstance(exc, SyntaxError) else tb
    kept = []
    while cursor is not None:
        if not cursor.tb_frame.f_code.co_filename.startswith(_HOOKS_DIR):
            kept.append(cursor)
        cursor = cursor.tb_next
    rebuilt: TracebackType | None = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt
