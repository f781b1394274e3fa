"""Every op the script runs while the CUPTI collector records: name, inputs, time, thread, id.

Two recorders with one face (``start``, ``stop``, ``frame``, ``facts``):

- :class:`NativeOpRecorder`: torch's RecordFunction callbacks in C++ (advisor.collect.native),
  the way torch.profiler records ops. Around each op it pushes the op's id as a CUPTI
  *external correlation id* (through the address of cuptiActivityPushExternalCorrelationId,
  with no Python in between), so every kernel, copy and set the op launches points back at
  it. It records ops on every thread (autograd's included), the script's own
  ``record_function`` ranges and the ranges torch.compile'd code opens ("Torch-Compiled
  Region: 0/0"), and Dynamo does not see it: compiled code stays compiled.
- :class:`PythonOpRecorder`: a TorchDispatchMode, for where the native one cannot be built
  (no compiler). It keeps a raw tuple an op and formats after the run, but Python still runs
  for every op (tens of microseconds each) and Dynamo runs compiled frames eager under a
  dispatch mode: the collector says so in its notes.

:func:`calibrate` measures what recording costs an op on this machine, in this run: a
burst of cheap ops on a private scratch tensor, with the recorder off and on, alternated.
The collector carries the figure in the session, so the diagnosis can reason at the job's
own pace.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from advisor.collect.cupti_host import HOST_ROW_COLUMNS, host_rows_frame
from advisor.session import empty_events

__all__ = ["DTYPE_NAMES", "NativeOpRecorder", "PythonOpRecorder", "calibrate", "describe_inputs", "make_op_recorder"]

# torch dtypes as Kineto's "Input type" spells them (caffe2 TypeMeta names), checked
# against a CPU torch.profiler trace of torch 2.13; the native recorder asks torch itself.
DTYPE_NAMES = {
    "float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
    "uint8": "unsigned char", "bool": "bool", "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>", "complex32": "c10::complex<c10::Half>",
    "float8_e4m3fn": "c10::Float8_e4m3fn", "float8_e5m2": "c10::Float8_e5m2",
    "float8_e4m3fnuz": "c10::Float8_e4m3fnuz", "float8_e5m2fnuz": "c10::Float8_e5m2fnuz",
}
# RecordFunction scopes (at::RecordScope): USER_SCOPE ranges are annotations, as Kineto files them.
USER_SCOPE = 7
COMPILED_REGION = "Torch-Compiled Region"
MAX_ROWS = 20_000_000  # a bound on memory (~50 bytes a row); rows past it are counted, not kept


class NativeOpRecorder:
    """Ops recorded by the native library (see the module docstring)."""

    kind = "native"

    def __init__(self, library: Any, *, push_address: int | None = None, pop_address: int | None = None,
                 external_kind: int = 0, record_inputs: bool = True, pid: int | None = None):
        self._lib = library
        self._pid = os.getpid() if pid is None else pid
        self._chunks: list[dict[str, np.ndarray]] = []
        self._active = False
        library.advisor_ops_configure(push_address, pop_address, int(external_kind), int(record_inputs), MAX_ROWS)

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        if not self._active:
            self._lib.advisor_ops_start()
            self._active = True

    def stop(self) -> None:
        if self._active:
            self._lib.advisor_ops_stop()
            self._active = False
            self._chunks.append(self._take())

    def discard(self) -> None:
        """Forget every row recorded so far (a calibration burst's)."""
        self._take()
        self._chunks.clear()

    def _take(self) -> dict[str, np.ndarray]:
        n = int(self._lib.advisor_ops_count())
        arrays = {name: np.zeros(n, dtype=np.int64) for name in ("start", "end", "tid", "op_id")}
        arrays.update({name: np.zeros(n, dtype=np.int32) for name in ("name", "inputs", "scope", "depth")})

        def at(name: str, kind: Any) -> Any:
            return arrays[name].ctypes.data_as(ctypes.POINTER(kind))

        i64, i32 = ctypes.c_int64, ctypes.c_int32
        got = int(self._lib.advisor_ops_take(n, at("start", i64), at("end", i64), at("tid", i64), at("op_id", i64),
                                             at("name", i32), at("inputs", i32), at("scope", i32), at("depth", i32)))
        return {name: values[:got] for name, values in arrays.items()}

    @property
    def dropped(self) -> int:
        return int(self._lib.advisor_ops_dropped())

    def frame(self, to_session_ns: Callable[[np.ndarray], np.ndarray]) -> pd.DataFrame:
        """The rows recorded, as session events (ops, and the script's own ranges as annotations)."""
        if self._active:
            self.stop()
        chunks = [c for c in self._chunks if len(c["start"])]
        if not chunks:
            return empty_events()
        rows = {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
        strings = [self._lib.advisor_ops_string(i).decode("utf-8", "replace")
                   for i in range(int(self._lib.advisor_ops_strings()))]
        table = np.asarray(strings + [""], dtype=object)
        described = [s.split("\x1f", 1) if "\x1f" in s else ("", "") for s in strings] + [("", "")]
        dims = np.asarray([d for d, _ in described], dtype=object)
        types = np.asarray([t for _, t in described], dtype=object)
        inputs = np.where(rows["inputs"] >= 0, rows["inputs"], len(strings))
        # A compiled region (Dynamo's range around a compiled frame) is the op the user's
        # code called: the Triton kernels it launches, which no ATen op wraps, are its own.
        is_compiled_region = np.asarray([s.startswith(COMPILED_REGION) for s in strings] + [False])
        raw = pd.DataFrame({
            "name": pd.Categorical(table[rows["name"]]),
            "kind": np.where((rows["scope"] == USER_SCOPE) & ~is_compiled_region[rows["name"]], "annotation", "op"),
            "start": rows["start"], "end": rows["end"], "tid": rows["tid"], "external_id": rows["op_id"],
            "input_dims": pd.Categorical(dims[inputs]), "input_types": pd.Categorical(types[inputs]),
        })
        return host_rows_frame(raw, self._pid, to_session_ns)

    def facts(self) -> dict[str, Any]:
        return {"op_recorder": self.kind, "ops_recorded": int(sum(len(c["start"]) for c in self._chunks)),
                "ops_dropped": self.dropped}


def describe_inputs(values: list[Any], tensor_type: type) -> tuple[str, str]:
    """Input Dims and Input type as Kineto records them, as compact JSON text."""
    return _describe(tuple(_summary(v, tensor_type) for v in values))


def _summary(value: Any, tensor_type: type) -> Any:
    """What of an input the op's description needs, taken while the op runs (no reference
    to the tensor is kept): (shape, dtype), ("TensorList", shapes), or a type word."""
    if isinstance(value, tensor_type):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, tensor_type) for v in value):
            return ("TensorList", tuple(tuple(v.shape) for v in value))
        return "ScalarList"
    if isinstance(value, (bool, int, float, complex)):
        return "Scalar"
    return ""  # None, devices, dtypes, layouts: Kineto leaves these blank


def _describe(summary: tuple) -> tuple[str, str]:
    dims: list[Any] = []
    types: list[str] = []
    for item in summary:
        if isinstance(item, tuple) and len(item) == 2 and item[0] == "TensorList":
            dims.append([list(s) for s in item[1]])
            types.append("TensorList")
        elif isinstance(item, tuple):
            dims.append(list(item[0]))
            dtype = str(item[1]).removeprefix("torch.")
            types.append(DTYPE_NAMES.get(dtype, dtype))
        else:
            dims.append([])
            types.append(item)
    return json.dumps(dims, separators=(",", ":")), json.dumps(types, separators=(",", ":"))


class PythonOpRecorder:
    """Ops recorded by a TorchDispatchMode (see the module docstring): a raw tuple an op while
    the script runs, described after.

    ``push(op_id)`` and ``pop()`` bracket each op with its external correlation id. The mode
    is thread-local: start and stop it on the thread that runs the training loop (autograd
    carries it to its own threads for backward)."""

    kind = "python"

    def __init__(self, torch: Any, *, push: Callable[[int], None] | None = None, pop: Callable[[], None] | None = None,
                 clock: Callable[[], int] = time.time_ns, thread_id: Callable[[], int] = threading.get_native_id,
                 pid: int | None = None, ids: Any = None):
        from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415

        self._pid = os.getpid() if pid is None else pid
        self.rows: list[tuple] = []
        append = self.rows.append
        tensor_type = torch.Tensor
        next_id = (ids or itertools.count(1)).__next__
        do_push = push or (lambda op_id: None)
        do_pop = pop or (lambda: None)

        class _RecordOps(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                op_id = next_id()
                do_push(op_id)
                start = clock()
                try:
                    return func(*args, **kwargs)
                finally:
                    end = clock()
                    do_pop()
                    append((func, start, end, thread_id(), op_id,
                            tuple(_summary(v, tensor_type) for v in (*args, *kwargs.values()))))

        self._mode_type = _RecordOps
        self._mode: Any = None
        self._recorded = 0

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

    def discard(self) -> None:
        self.rows.clear()

    def frame(self, to_session_ns: Callable[[np.ndarray], np.ndarray]) -> pd.DataFrame:
        self.stop()
        if not self.rows:
            return empty_events()
        described: dict[tuple, tuple[str, str]] = {}
        names: dict[Any, str] = {}
        out = []
        for func, start, end, tid, op_id, summary in self.rows:
            name = names.get(func)
            if name is None:
                name = names[func] = func._schema.name
            text = described.get(summary)
            if text is None:
                text = described[summary] = _describe(summary)
            out.append((name, "op", start, end, tid, op_id, text[0], text[1]))
        self._recorded = len(out)
        return host_rows_frame(pd.DataFrame.from_records(out, columns=list(HOST_ROW_COLUMNS)), self._pid, to_session_ns)

    def facts(self) -> dict[str, Any]:
        return {"op_recorder": self.kind, "ops_recorded": self._recorded or len(self.rows), "ops_dropped": 0}


def make_op_recorder(torch: Any, *, push_address: int | None = None, pop_address: int | None = None,
                     external_kind: int = 0, push: Callable[[int], None] | None = None,
                     pop: Callable[[], None] | None = None, native: bool = True,
                     say: Callable[[str], None] | None = None) -> tuple[Any, str | None]:
    """The native recorder where it can be built and loaded, else the Python one, with the
    one-line reason the native one is not used (None where it is)."""
    reason = "the native op recorder was not asked for"
    if native:
        from advisor.collect import native as native_lib  # noqa: PLC0415

        library, reason = native_lib.load(torch, say=say)
        if library is not None:
            return NativeOpRecorder(library, push_address=push_address, pop_address=pop_address,
                                    external_kind=external_kind), None
    return PythonOpRecorder(torch, push=push, pop=pop), reason


def calibrate(torch: Any, recorder: Any, *, ops: int = 200, rounds: int = 5) -> dict[str, float] | None:
    """What recording costs one op here: ``rounds`` bursts of ``ops`` in-place adds on a
    private one-element tensor with the recorder off, then on; the per-op difference of the
    fastest bursts. The rows the bursts recorded are discarded. None where it cannot be
    measured (the recorder is already running)."""
    if recorder.active:
        return None
    scratch = torch.zeros(1)
    add = scratch.add_

    def burst() -> int:
        began = time.perf_counter_ns()
        for _ in range(ops):
            add(1)
        return time.perf_counter_ns() - began

    off: list[int] = []
    on: list[int] = []
    burst()  # warm the path once
    try:
        for _ in range(rounds):
            off.append(burst())
            recorder.start()
            try:
                on.append(burst())
            finally:
                recorder.stop()
    finally:
        recorder.discard()
    plain = min(off) / ops
    recorded = min(on) / ops
    return {"plain_ns_per_op": round(plain, 1), "recorded_ns_per_op": round(recorded, 1),
            "cost_ns_per_op": round(max(recorded - plain, 0.0), 1),
            "spread_ns_per_op": round(statistics.pstdev([t / ops for t in off]), 1), "ops": ops * rounds}
