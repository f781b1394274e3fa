"""Step timing for advisor.Profiler: the clock behind ``step_info()``, ``timer_only`` and
the Perf summary.

Every ``Profiler.step()`` ends a step on ``time.perf_counter_ns``; a wrapper around the
DataLoader iterators' ``__next__`` adds the time each read takes to the open step (the
reader cost). That is all it does per step: two clock reads and a few integer appends,
no events, no profiler, so ``timer_only=True`` costs a few microseconds a step at most
(benchmarks/timer_only.py measures it).

Definitions, as the Perf table's (advisor.tables.perf) so that the two agree:

- batch_cost: a step's duration, from the ``step()`` that began it to the one that ends it;
- reader_cost: time inside DataLoader ``__next__`` during the step;
- ips: samples (``step(num_samples=...)``) or steps per second, over the steps' total time.

Only reads on the thread that started the Profiler count (DataLoader workers are other
processes and never call the wrapped ``__next__``). At the end the timed steps become a
Session (steps and Dataloader phases only), so the same tables and rules read them.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from array import array
from typing import Any

__all__ = ["StepTimer", "StepStats"]

_ACTIVE: StepTimer | None = None


class StepStats:
    """Means over some timed steps: what ``step_info()`` prints."""

    def __init__(self, steps: int, batch_ns: int, reader_ns: int | None, samples: int | None):
        self.steps = steps
        self.batch_cost_s = batch_ns / steps / 1e9 if steps else math.nan
        self.reader_cost_s = reader_ns / steps / 1e9 if steps and reader_ns is not None else None
        total_s = batch_ns / 1e9
        counted = samples if samples is not None else steps
        self.ips = counted / total_s if total_s > 0 else math.nan
        self.per_sample = samples is not None

    def line(self, unit: str | None = None) -> str:
        """``reader_cost: 0.00101 s batch_cost: 0.03121 s ips: 256.310 samples/s``, as paddle's
        step_info prints it; reader_cost is left out where no DataLoader was read."""
        if not self.steps:
            return "no step has ended yet"
        rate = f"{unit or 'samples'}/s" if self.per_sample else "steps/s"
        parts = []
        if self.reader_cost_s is not None:
            parts.append(f"reader_cost: {self.reader_cost_s:.5f} s")
        parts.append(f"batch_cost: {self.batch_cost_s:.5f} s")
        parts.append(f"ips: {self.ips:.3f} {rate}")
        return " ".join(parts)


class StepTimer:
    """The step clock of one Profiler run (see the module docstring)."""

    def __init__(self) -> None:
        self.numbers = array("q")
        self.starts = array("q")
        self.ends = array("q")
        self.reader = array("q")
        self.samples = array("q")  # -1: not given
        self.reads = array("q")  # start, end and step of every read, flat
        self.loader_seen = False
        self.base_wall_ns = 0
        self.base_clock_ns = 0
        self._info_from = 0
        self._step = 0
        self._step_start = 0
        self._reader_ns = 0
        self._reads_in_step = 0
        self._thread = 0
        self._native_thread = 0
        self._pid = 0
        self._undo: Any = None

    # -- life cycle ------------------------------------------------------------------------

    def start(self, step: int = 0) -> None:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("another advisor.Profiler is running in this process; stop it first")
        _ACTIVE = self
        self._thread = threading.get_ident()
        self._native_thread = threading.get_native_id()
        self._pid = os.getpid()
        self.base_wall_ns = time.time_ns()
        self.base_clock_ns = time.perf_counter_ns()
        self._install()
        self.begin_step(step)

    def stop(self, *, keep_open_step: bool) -> None:
        """End timing. The open step (begun by the last ``step()``) is timed only where
        ``keep_open_step``."""
        global _ACTIVE
        if keep_open_step:
            self.end_step(None)
        if self._undo is not None:
            self._undo()
            self._undo = None
        if _ACTIVE is self:
            _ACTIVE = None

    @property
    def read_in_open_step(self) -> bool:
        """Whether a DataLoader returned a batch in the open step."""
        return self._reads_in_step > 0

    # -- the clock -------------------------------------------------------------------------

    def end_step(self, num_samples: int | None) -> None:
        now = time.perf_counter_ns()
        self.numbers.append(self._step)
        self.starts.append(self._step_start)
        self.ends.append(now)
        self.reader.append(self._reader_ns)
        self.samples.append(-1 if num_samples is None else int(num_samples))

    def begin_step(self, number: int) -> None:
        self._step = number
        self._reader_ns = 0
        self._reads_in_step = 0
        self._step_start = time.perf_counter_ns()

    def read(self, start: int, end: int, returned: bool) -> None:
        self.loader_seen = True
        self._reader_ns += end - start
        self.reads.append(start)
        self.reads.append(end)
        self.reads.append(self._step)
        if returned:
            self._reads_in_step += 1

    # -- figures ---------------------------------------------------------------------------

    def stats(self, first: int = 0) -> StepStats:
        """Means over the timed steps from position ``first`` on."""
        n = len(self.ends) - first
        if n <= 0:
            return StepStats(0, 0, None, None)
        batch = sum(self.ends[first:]) - sum(self.starts[first:])
        reader = sum(self.reader[first:]) if self.loader_seen else None
        given = [s for s in self.samples[first:] if s >= 0]
        samples = sum(given) if len(given) == n else None
        return StepStats(n, batch, reader, samples)

    def step_info(self, unit: str | None = None) -> str:
        """The means over the steps timed since the previous call (all so far, the first
        time), as one line; the next call starts from here."""
        line = self.stats(self._info_from).line(unit)
        self._info_from = len(self.ends)
        return line

    def batch_size(self) -> int | None:
        """Samples per step where every timed step gave the same ``num_samples``."""
        given = set(self.samples)
        if len(given) == 1 and min(given) > 0:
            return int(min(given))
        return None

    def session(self, *, source: str = "advisor.Profiler (timer_only)") -> Any:
        """The timed steps as a Session: one ``ProfilerStep#N`` per step and one
        ``advisor::Dataloader`` phase per read, on this process's clock (ns since start)."""
        import numpy as np  # noqa: PLC0415
        import pandas as pd  # noqa: PLC0415

        from advisor.collect.hooks.collection import STEP_PREFIX  # noqa: PLC0415
        from advisor.session import (  # noqa: PLC0415
            CollectorInfo,
            DeviceInfo,
            Session,
            SessionMeta,
            conform_events,
        )

        def ints(values: array) -> np.ndarray:
            return np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, np.int64)

        base = self.base_clock_ns
        numbers = ints(self.numbers)
        reads = ints(self.reads).reshape(-1, 3)
        steps = pd.DataFrame({"name": [f"{STEP_PREFIX}{n}" for n in numbers], "kind": "step",
                              "start_ns": ints(self.starts) - base, "end_ns": ints(self.ends) - base, "step": numbers})
        # The relations are known here (a read belongs to the step open when it ran), so
        # the rows are written attributed; a read in the step left untimed belongs to none.
        timed = np.isin(reads[:, 2], numbers)
        loads = pd.DataFrame({"name": "advisor::Dataloader", "kind": "phase", "phase": "Dataloader",
                              "start_ns": reads[:, 0] - base, "end_ns": reads[:, 1] - base,
                              "step": np.where(timed, reads[:, 2], -1)})
        frame = pd.concat([steps, loads], ignore_index=True)
        frame["category"] = "user_annotation"
        frame["pid"] = self._pid
        frame["tid"] = self._native_thread
        frame["_outer"] = -frame["end_ns"]
        events = conform_events(frame.sort_values(["start_ns", "_outer"], kind="stable"))
        size = self.batch_size()
        metadata: dict[str, Any] = {"step_source": "manual", "steps_timed": len(numbers)}
        if size is not None:
            metadata["batch_size"] = size
        notes = ["timer_only: steps and DataLoader reads were timed; no other event was collected"]
        if not self.loader_seen:
            notes.append("no torch DataLoader was read between start() and stop(): reader_cost not measured")
        meta = SessionMeta(
            source=source,
            source_format="profiler-timer",
            collector=CollectorInfo(name="timer", activities=["steps"], gpu_measured=False, notes=notes),
            devices=[DeviceInfo(id=-1, kind="cpu", name="host CPU")],
            base_time_ns=self.base_wall_ns,
            trace_metadata=metadata,
        )
        return Session(meta, events)

    # -- the DataLoader hook -----------------------------------------------------------------

    def _install(self) -> None:
        try:
            from torch.utils.data import dataloader  # noqa: PLC0415
        except Exception:  # no torch: steps are still timed, reads are not
            return
        owner = dataloader._BaseDataLoaderIter
        had_own = "__next__" in vars(owner)
        original = owner.__next__
        wrapped = _timed_next(original)
        owner.__next__ = wrapped

        def undo() -> None:
            if vars(owner).get("__next__") is not wrapped:  # replaced since: leave it
                return
            if had_own:
                owner.__next__ = original
            else:
                delattr(owner, "__next__")

        self._undo = undo


def _timed_next(original: Any) -> Any:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        timer = _ACTIVE
        if timer is None or threading.get_ident() != timer._thread:
            return original(self)
        start = time.perf_counter_ns()
        try:
            batch = original(self)
        except BaseException:
            timer.read(start, time.perf_counter_ns(), False)
            raise
        timer.read(start, time.perf_counter_ns(), True)
        return batch

    return __next__
