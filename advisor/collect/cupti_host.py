"""The host side recorded beside the CUPTI collector: advisor's ranges.

While the built-in CUPTI collector runs, torch.profiler must not: even with CPU activities
only, Kineto on a machine with a GPU asks CUPTI for runtime, driver and external
correlation records (torch's ``kCpuTypes``) and registers its own buffer callbacks, which
replaces the collector's. So inside the recorded steps the host side is recorded here:

- :class:`HostTimeline` keeps the ranges advisor's hooks open and close (steps
  ``ProfilerStep#N``, phases ``advisor::Forward``..., host-blocking calls
  ``advisor::sync item @ train.py(42): main``), timed with ``time.time_ns``. They cost two
  clock reads each: no ``record_function`` is opened for them while the CUPTI collector
  records (it would cost an op of its own, and nothing else listens).
- the ops come from advisor.collect.op_recorder, which pushes each op's id as a CUPTI
  *external correlation id*. CUPTI then writes, for every runtime or driver call the op
  makes, a record tying the call's correlation id to the op's id, so each kernel, copy and
  set reaches the op that caused it exactly, however deep the call sits and on whichever
  thread (autograd's included) it runs.

Why ``time.time_ns``: on Linux CUPTI's default timestamps are ``clock_gettime(
CLOCK_REALTIME)`` in ns (cupti_activity.h, cuptiActivityRegisterTimestampCallback), the
clock ``time.time_ns`` reads, so host rows and CUPTI rows share one clock; the collector
still measures the offset between the two at start (see advisor.collect.cupti).
Thread ids are ``threading.get_native_id()`` (gettid), what CUPTI writes once the
collector sets ``ActivityThreadIdType.SYSTEM``.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from advisor.session import conform_events, empty_events


class HostTimeline:
    """advisor's ranges on the CUPTI clock, kept as plain tuples (and ops, where a stand-in
    recorder adds them)."""

    def __init__(self, *, clock: Callable[[], int] = time.time_ns, pid: int | None = None,
                 thread_id: Callable[[], int] = threading.get_native_id):
        self.clock = clock
        self.pid = os.getpid() if pid is None else pid
        self.thread_id = thread_id
        # (name, kind, start, end, tid, external_id, input_dims, input_types)
        self.rows: list[tuple] = []
        self._open: dict[int, tuple[str, int, int]] = {}
        self._tokens = itertools.count(1)

    def open_range(self, name: str) -> int:
        token = next(self._tokens)
        self._open[token] = (name, self.clock(), self.thread_id())
        return token

    def close_range(self, token: int | None) -> None:
        opened = self._open.pop(token, None) if token is not None else None
        if opened is not None:
            name, start, tid = opened
            self.rows.append((name, "annotation", start, self.clock(), tid, -1, "", ""))

    def close_all(self) -> int:
        """Close ranges still open (the run ended inside them); how many there were."""
        open_now = len(self._open)
        for token in list(self._open):
            self.close_range(token)
        return open_now

    def add_op(self, name: str, start: int, end: int, tid: int, op_id: int, dims: str, types: str) -> None:
        self.rows.append((name, "op", start, end, tid, op_id, dims, types))

    def frame(self, to_session_ns: Callable[[np.ndarray], np.ndarray]) -> pd.DataFrame:
        if not self.rows:
            return empty_events()
        return host_rows_frame(pd.DataFrame.from_records(self.rows, columns=list(HOST_ROW_COLUMNS)), self.pid,
                               to_session_ns)


# A host row as the timeline and the op recorders keep it.
HOST_ROW_COLUMNS = ("name", "kind", "start", "end", "tid", "external_id", "input_dims", "input_types")


def host_rows_frame(raw: pd.DataFrame, pid: int, to_session_ns: Callable[[np.ndarray], np.ndarray]) -> pd.DataFrame:
    """Host rows (HOST_ROW_COLUMNS, times on the host clock) as session events."""
    if not len(raw):
        return empty_events()
    return conform_events(pd.DataFrame({
        "name": raw["name"], "kind": raw["kind"], "category": "advisor-host",
        "start_ns": to_session_ns(raw["start"].to_numpy(dtype="int64")),
        "end_ns": to_session_ns(raw["end"].to_numpy(dtype="int64")),
        "pid": pid, "tid": raw["tid"], "external_id": raw["external_id"],
        "input_dims": raw["input_dims"], "input_types": raw["input_types"],
    }))
