"""Host-side collection for a PyTorch script: torch.profiler on CPU plus step and phase marks.

While a script runs, :class:`HostCollector` keeps a ``torch.profiler.profile`` running with
CPU activities only (the host side never subscribes to CUPTI: the GPU collector owns it)
and installs hooks that mark, without any change to the script, its steps and phases, the
DataLoaders it reads, the host-blocking calls it makes and the processes it starts. Each
concern is its own module in advisor.collect.hooks (its docstring says what it marks and
why); the collector composes them and owns the run's life cycle. Everything is removed
again when the run ends.

Only the thread and process that run the script are marked: DataLoader workers (forked
copies of this process) and helper threads are left alone. The hooks are invisible to
torch.compile and torch.jit.trace (so a ``fullgraph=True`` compile still compiles), and a
warning raised through one of advisor's wrappers is shown at the user's line.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.collect.cores import RunDelay
from advisor.collect.hooks import base
from advisor.collect.hooks.children import Children
from advisor.collect.hooks.compiles import Compiles
from advisor.collect.hooks.collection import HostCollection
from advisor.collect.hooks.loaders import Loaders
from advisor.collect.hooks.recorder import Recorder
from advisor.collect.hooks.steps import Steps
from advisor.collect.hooks.syncs import SyncSites
from advisor.collect.hooks.uploads import Uploads
from advisor.collect.steps import StepClock, StepWindow, StopAfter


def import_torch() -> tuple[Any, str | None]:
    """torch, or None and one line saying why it cannot be imported."""
    try:
        import torch  # noqa: PLC0415  (optional dependency)
        import torch.profiler  # noqa: F401, PLC0415
    except Exception as exc:  # a broken install raises OSError and friends, not only ImportError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        return None, reason
    return torch, None


def library_roots(torch: Any = None) -> list[str]:
    """Folders that hold installed code rather than the user's: the standard library,
    site-packages (user site included), the console scripts, torch's and advisor's own
    folders. A stack frame from a file under none of them is the user's."""
    import site  # noqa: PLC0415
    import sysconfig  # noqa: PLC0415

    roots: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    try:
        roots.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site:
        roots.add(os.path.realpath(user_site))
    advisor_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots.add(advisor_dir)
    if torch is not None:
        roots.add(os.path.dirname(os.path.abspath(torch.__file__)))
    # A code object's file name is the path it was imported by, links and all: both spellings.
    roots |= {os.path.realpath(root) for root in roots} | {os.path.abspath(root) for root in roots}
    return sorted(root.rstrip(os.sep) + os.sep for root in roots)


def _cuda_available(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


class HostCollector:
    """torch.profiler (CPU activities) plus the hooks, for one run.

    ``start()`` before the script, ``stop()`` after it (whatever way it ended), then
    ``export(path)`` or ``trace_parts(path)``. Only one collector can be active in a
    process at a time.
    """

    def __init__(self, torch: Any, *, record_shapes: bool = True, with_stack: bool = True,
                 profiler: bool = True, listener: Any = None, step_source: str = "auto",
                 warmup: bool = False, window: StepWindow | None = None, event_budget: int | None = None,
                 parts_dir: Path | None = None, say: Callable[[str], None] | None = None,
                 ranks: tuple[Path, dict, type] | None = None, stop: StopAfter | None = None):
        """``profiler=False``: run the hooks and ranges without torch.profiler, for when the
        CUPTI collector runs (Kineto would take CUPTI over even with CPU activities only).
        ``listener`` (the CUPTI collector) is told of every step and range as it opens and
        closes, so the GPU side records them on its own timeline.
        ``step_source="manual"``: the caller marks steps (begin_step / end_step); the hooks
        mark phases only. ``warmup``: start() only prepares torch.profiler (Kineto's warm-up,
        nothing recorded) and :meth:`record` starts recording.

        ``window``: record only these steps: torch.profiler is prepared at start, records
        from the window's first step and stops at its end; the steps after are timed only.
        Without one the whole run is recorded, in parts of ``PART_STEPS`` steps written to
        ``parts_dir`` where one is given, until ``event_budget`` events are written.
        ``say(line)`` hears of recording starting and stopping, for the user.
        ``ranks`` (a folder, the collection options, the class that runs a rank): the
        processes the script starts with torch.multiprocessing.spawn run their function
        under a collector of their own and save their sessions there. ``stop``: when the
        script has run long enough after the window (advisor.collect.steps.StopAfter; None:
        it runs to its end)."""
        self._torch = torch
        self._thread = threading.get_ident()
        self._stopped = False
        self.result = HostCollection()
        self.clock = StepClock()
        self._run_delay: RunDelay | None = None
        self._began_ns = 0
        self._began_delay: int | None = None
        # Every installed library's code is not the user's: a host-blocking call made inside
        # torchvision or transformers is counted at the user's line that called into it.
        self._library_dirs = tuple(library_roots(torch))
        # Where the job runs on a GPU, reading a CPU tensor waits for nothing: not a sync.
        self.on_gpu = _cuda_available(torch)
        self.recorder = Recorder(torch, profiler=profiler, listener=listener, record_shapes=record_shapes,
                                 with_stack=with_stack, window=window, event_budget=event_budget,
                                 parts_dir=parts_dir, manual=step_source == "manual", warmup=warmup,
                                 say=say or (lambda line: None), metadata=self._metadata)
        self.loaders = Loaders(torch, lambda: self._run_delay)
        self.steps = Steps(torch, self.result, self.recorder, self.clock, self.loaders,
                           manual=step_source == "manual", library_dirs=self._library_dirs, stop=stop)
        self.syncs = SyncSites(torch, self.recorder, self.steps.open_step)
        self.uploads = Uploads(torch)
        self.children = Children(self.steps.open_step, ranks)
        self.compiles = Compiles(torch, self.recorder, self.steps.open_step)
        self._concerns: list[base.Hooks] = [self.recorder, self.steps, self.loaders, self.syncs, self.uploads,
                                            self.children, self.compiles]
        self._patches = base.Patches()

    @property
    def activities(self) -> list[Any]:
        return self.recorder.activities

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        if base.ACTIVE is not None:
            raise RuntimeError("another advisor collector is already running in this process")
        self.recorder.start()
        # The main thread's wait for a core from here on: a busy machine's mark on the timings.
        self._run_delay = RunDelay()
        self._began_ns, self._began_delay = time.perf_counter_ns(), self._run_delay.read()
        base.activate(self, self._torch)
        try:
            for concern in self._concerns:
                concern.install(self._patches)
            self._patches.patch(warnings, "showwarning", base.wrap_showwarning, only_if_unchanged=True)
        except BaseException:
            self._patches.undo()
            base.deactivate()
            self.recorder.abandon()
            raise

    def record(self) -> None:
        """Start recording, after a ``warmup`` start or where a window's first step opens
        (a no-op otherwise)."""
        if not self._stopped:
            self.recorder.record()

    def recording(self) -> bool:
        """Whether torch.profiler records now."""
        return self.recorder.recording()

    def begin_step(self, number: int) -> None:
        """``manual`` source: end the open step (complete) and begin step ``number``."""
        if not self._stopped:  # after a hand-over the script's own profiler would get the range
            self.steps.begin_step(number)

    def end_step(self, *, partial: bool | None = None) -> None:
        """``manual`` source: end the open step (see Steps.end_step)."""
        self.steps.end_step(partial=partial)

    def stop(self) -> HostCollection:
        """Close whatever is open, remove the hooks and stop the profiler. Safe to call
        once whatever state the script left things in."""
        if self._stopped:
            return self.result
        if self.recorder.state == "prepared":
            # torch's own order for a warm-up that never recorded: start, then stop. (A
            # window whose first step never came records nothing but Kineto's start.)
            self.recorder.record()
        self._stopped = True
        try:
            self._patches.undo()
        finally:
            base.deactivate()
            self.steps.close()
            self.recorder.close()  # the last part's trace written, with the facts so far
            self._fill_result()  # and the result complete: every part, every step
            if self._run_delay is not None:
                self._run_delay.close()
        return self.result

    def hand_over(self, frame: Any) -> None:
        """The script is starting a profiler of its own: end this collection here."""
        while frame is not None and self.is_library_frame(frame):
            frame = frame.f_back
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        if self.recorder.listener is not None:
            self.recorder.listener.hand_over(where)
        self.result.notes.append(
            f"the script starts its own torch profiler{where}; torch runs one at a time, so "
            "advisor's host profile ends there (diagnose the trace the script writes for the rest)"
        )
        self.stop()

    def _metadata(self) -> dict[str, Any]:
        """The run's facts so far, as the trace's ``advisor`` object."""
        self._fill_result()
        return self.result.metadata()

    def _fill_result(self) -> None:
        """The facts of the run so far, into ``result``."""
        result = self.result
        for concern in self._concerns:
            concern.fill(result)
        result.step_times = self.clock.as_records()
        if self.clock.dropped:
            result.recording["untimed_steps"] = self.clock.dropped
        delay = self._run_delay.read() if self._run_delay is not None else None
        if delay is not None and self._began_delay is not None:
            result.cpu_wait = {"wall_ns": time.perf_counter_ns() - self._began_ns,
                               "run_delay_ns": delay - self._began_delay}
        if not result.library_roots:
            result.library_roots = library_roots(self._torch)

    # -- output and questions the hooks ask ----------------------------------------------

    def export(self, path: Path) -> Path:
        """Write the Chrome trace (gzipped where ``path`` ends in .gz)."""
        return self.recorder.export(path)

    def trace_parts(self, path: Path) -> list[Path]:
        """The Chrome trace files of the run (see Recorder.trace_parts)."""
        return self.recorder.trace_parts(path)

    def sample_state(self) -> tuple[int, str]:
        """Where the script is now, for the stack sampler: (open step or -1, phase or '')."""
        return self.steps.sample_state()

    def is_library_frame(self, frame: Any) -> bool:
        return frame.f_code.co_filename.startswith(self._library_dirs)

    def ours(self) -> bool:
        """Whether the caller runs on the script's own thread and process."""
        return base.owned_here(self._thread)
