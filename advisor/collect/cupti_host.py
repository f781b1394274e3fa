"""The host side recorded beside the CUPTI collector: advisor's ranges and the ops.

While the built-in CUPTI collector runs, torch.profiler must not: even with CPU activities
only, Kineto on a machine with a GPU asks CUPTI for runtime, driver and external
correlation records (torch's ``kCpuTypes``) and registers its own buffer callbacks, which
replaces the collector's. So inside the recorded steps the host side is recorded here:

- :class:`HostTimeline` keeps the ranges advisor's hooks open and close (steps
  ``ProfilerStep#N``, phases ``advisor::Forward``..., host-blocking calls
  ``advisor::sync item @ train.py(42): main``) and the ops, timed with ``time.time_ns``.
- :class:`OpRecorder` sees every ATen op the script runs (a TorchDispatchMode), with its
  input shapes and dtypes spelled as Kineto spells them, and around each one pushes the
  op's id as a CUPTI *external correlation id*. CUPTI then writes, for every runtime or
  driver call the op makes, a record tying the call's correlation id to the op's id, so
  each kernel, copy and set reaches the op that caused it exactly, however deep the call
  sits and on whichever thread (autograd's included) it runs. Time containment would
  only guess where calls nest or cross threads; NVTX ranges (torch's emit_nvtx) carry
  shapes but no dtypes and need NVTX injection set up before the process starts.

Why ``time.time_ns``: on Linux CUPTI's default timestamps are ``clock_gettime(
CLOCK_REALTIME)`` in ns (cupti_activity.h, cuptiActivityRegisterTimestampCallback), the
clock ``time.time_ns`` reads, so host rows and CUPTI rows share one clock; the collector
still measures the offset between the two at start (see advisor.collect.cupti).
Thread ids are ``threading.get_native_id()`` (gettid), what CUPTI writes once the
collector sets ``ActivityThreadIdType.SYSTEM``.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from advisor.session import conform_events, empty_events

# torch dtypes as Kineto's "Input type" spells them (caffe2 TypeMeta names), checked
# against a CPU torch.profiler trace of torch 2.13.
DTYPE_NAMES = {
    "float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
    "uint8": "unsigned char", "bool": "bool", "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>", "complex32": "c10::complex<c10::Half>",
    "float8_e4m3fn": "c10::Float8_e4m3fn", "float8_e5m2": "c10::Float8_e5m2",
    "float8_e4m3fnuz": "c10::Float8_e4m3fnuz", "float8_e5m2fnuz": "c10::Float8_e5m2fnuz",
}


class HostTimeline:
    """Host rows (ranges and ops) on the CUPTI clock, kept as plain tuples."""

    def __init__(self, *, clock: Callable[[], int] = time.time_ns, pid: int | None = None,
                 thread_id: Callable[[], int] = threading.get_native_id):
        self.clock = clock
        self.pid = os.getpid() if pid is None else pid
        self.thread_id = thread_id
        # (name, kind, start, end, tid, external_id, input_dims, input_types)
        self.rows: list[tuple] = []
        self._open: dict[int, tuple[str, int, int]] = {}
        self._tokens = itertools.count(1)
        self._op_ids = itertools.count(1)

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

    def next_op_id(self) -> int:
        return next(self._op_ids)

    def add_op(self, name: str, start: int, end: int, tid: int, op_id: int, dims: str, types: str) -> None:
        self.rows.append((name, "op", start, end, tid, op_id, dims, types))

    def frame(self, to_session_ns: Callable[[np.ndarray], np.ndarray]) -> pd.DataFrame:
        if not self.rows:
            return empty_events()
        raw = pd.DataFrame.from_records(self.rows, columns=[
            "name", "kind", "start", "end", "tid", "external_id", "input_dims", "input_types"])
        return conform_events(pd.DataFrame({
            "name": raw["name"], "kind": raw["kind"], "category": "advisor-host",
            "start_ns": to_session_ns(raw["start"].to_numpy(dtype="int64")),
            "end_ns": to_session_ns(raw["end"].to_numpy(dtype="int64")),
            "pid": self.pid, "tid": raw["tid"], "external_id": raw["external_id"],
            "input_dims": raw["input_dims"], "input_types": raw["input_types"],
        }))


def describe_inputs(values: list[Any], tensor_type: type) -> tuple[str, str]:
    """Input Dims and Input type as Kineto records them, as compact JSON text."""
    dims: list[Any] = []
    types: list[str] = []
    for value in values:
        if isinstance(value, tensor_type):
            dims.append(list(value.shape))
            types.append(DTYPE_NAMES.get(str(value.dtype).removeprefix("torch."), str(value.dtype)))
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, tensor_type) for v in value):
            dims.append([list(v.shape) for v in value])
            types.append("TensorList")
        elif isinstance(value, (list, tuple)):
            dims.append([])
            types.append("ScalarList")
        elif isinstance(value, (bool, int, float, complex)):
            dims.append([])
            types.append("Scalar")
        else:  # None, devices, dtypes, layouts: Kineto leaves these blank
            dims.append([])
            types.append("")
    return json.dumps(dims, separators=(",", ":")), json.dumps(types, separators=(",", ":"))


class OpRecorder:
    """Records every ATen op (name, shapes, dtypes, time, thread) into a HostTimeline
    and brackets it with an external correlation id, while started.

    ``push(op_id)`` and ``pop()`` are the collector's wrappers of
    ``cupti.activity_push_external_correlation_id`` / ``..._pop_...``. The mode is
    thread-local: start and stop it on the thread that runs the training loop (autograd
    carries it to its own threads for backward)."""

    def __init__(self, torch: Any, timeline: HostTimeline, *, push: Callable[[int], None], pop: Callable[[], None]):
        from torch.utils._python_dispatch import TorchDispatchMode

        tensor_type = torch.Tensor
        clock = timeline.clock
        add_op = timeline.add_op
        next_id = timeline.next_op_id
        get_tid = timeline.thread_id

        class _RecordOps(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                op_id = next_id()
                push(op_id)
                start = clock()
                try:
                    return func(*args, **kwargs)
                finally:
                    end = clock()
                    pop()
                    dims, dtypes = describe_inputs([*args, *kwargs.values()], tensor_type)
                    add_op(func._schema.name, start, end, get_tid(), op_id, dims, dtypes)

        self._mode_type = _RecordOps
        self._mode: Any = None

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        if self._mode is None:
            self._mode = self._mode_type()
            self._mode.__enter__()

    def stop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
