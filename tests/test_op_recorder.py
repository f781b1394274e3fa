"""The op recorders the CUPTI collector uses (advisor.collect.op_recorder), on CPU torch.

The native one is built once for the run (tests/conftest.py gives it a folder of its own);
what it records is checked against torch.profiler's own record of the same ops."""

from __future__ import annotations

import ctypes
import json
import os
import threading

import pytest

torch = pytest.importorskip("torch")

from advisor.collect import native, op_recorder  # noqa: E402


@pytest.fixture(scope="module")
def library():
    lib, why = native.load(torch)
    if lib is None:
        pytest.skip(f"the native op recorder cannot be built here: {why}")
    return lib


class CStack:
    """C functions with CUPTI's push/pop signatures, recording what they were given."""

    def __init__(self):
        self.stack: list[int] = []
        self.pushed: list[int] = []
        self.kinds: set[int] = set()
        push_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_uint64)
        pop_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64))
        self._push = push_type(self.push)
        self._pop = pop_type(self.pop)

    def push(self, kind, op_id):
        self.kinds.add(kind)
        self.stack.append(op_id)
        self.pushed.append(op_id)
        return 0

    def pop(self, kind, last):
        last[0] = self.stack.pop()
        return 0

    def addresses(self):
        return ctypes.cast(self._push, ctypes.c_void_p).value, ctypes.cast(self._pop, ctypes.c_void_p).value


def _kineto_inputs(names):
    """Input Dims and Input type of the named ops as torch.profiler (Kineto) records them."""
    import tempfile

    a, b = torch.ones(4, 8), torch.ones(8, 16)
    h = torch.ones(3, dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(a, b)
        h + h
        torch.cat([a, a])
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "t.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    return {e["name"]: (e["args"]["Input Dims"], e["args"]["Input type"])
            for e in events if e.get("name") in names and e.get("cat") == "cpu_op"}


def test_native_ops_are_spelled_as_kineto_spells_them_and_carry_pushed_ids(library):
    ids = CStack()
    push, pop = ids.addresses()
    recorder = op_recorder.NativeOpRecorder(library, push_address=push, pop_address=pop, external_kind=6, pid=1)
    a, b = torch.ones(4, 8), torch.ones(8, 16)
    h = torch.ones(3, dtype=torch.bfloat16)
    recorder.start()
    try:
        with torch.profiler.record_function("my range"):
            torch.mm(a, b)
            h + h
            torch.cat([a, a])
    finally:
        recorder.stop()
    torch.mm(a, b)  # after stop: not recorded
    frame = recorder.frame(lambda t: t)
    ops = frame[frame["kind"] == "op"]
    mine = {str(r.name): (json.loads(r.input_dims), json.loads(r.input_types)) for r in ops.itertuples()}
    kineto = _kineto_inputs({"aten::mm", "aten::add", "aten::cat"})
    assert {name: mine[name] for name in kineto} == kineto
    # The script's own range is an annotation, as Kineto files it; record_function's own
    # enter/exit ops are plumbing, not recorded.
    assert list(frame.loc[frame["kind"] == "annotation", "name"].astype(str)) == ["my range"]
    assert not frame["name"].astype(str).str.startswith("profiler::").any()
    assert (ops["name"].astype(str) == "aten::mm").sum() == 1
    # Every row's id was pushed (CUPTI's external correlation kind as given) and popped.
    assert ids.stack == [] and ids.kinds == {6}
    assert sorted(ids.pushed) == sorted(frame["external_id"])
    assert (frame["end_ns"] >= frame["start_ns"]).all() and (frame["pid"] == 1).all()


def test_native_ops_on_another_thread_carry_that_threads_id(library):
    recorder = op_recorder.NativeOpRecorder(library)
    seen = {}

    def work():
        seen["tid"] = threading.get_native_id()
        torch.ones(5).sum()

    recorder.start()
    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        torch.ones(3).mul(2)
    finally:
        recorder.stop()
    frame = recorder.frame(lambda t: t)
    by_tid = frame.groupby("tid")["name"].agg(lambda n: set(n.astype(str)))
    assert "aten::sum" in by_tid[seen["tid"]]
    assert "aten::mul" in by_tid[threading.get_native_id()]


def test_calibration_measures_a_cost_and_leaves_no_rows(library):
    recorder = op_recorder.NativeOpRecorder(library)
    figures = op_recorder.calibrate(torch, recorder, ops=50, rounds=3)
    assert figures is not None and figures["recorded_ns_per_op"] > 0 and figures["cost_ns_per_op"] >= 0
    assert len(recorder.frame(lambda t: t)) == 0


def _graphs_compiled(recorder) -> int:
    """How many graphs Dynamo hands its backend for one small function, compiled and called
    while ``recorder`` records (None: no recorder)."""
    import torch._dynamo

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()

    @torch.compile(backend=backend)
    def f(x):
        return torch.nn.functional.gelu(x @ x) + 1

    if recorder is not None:
        recorder.start()
    try:
        f(torch.ones(4, 4))
        f(torch.ones(4, 4))
    finally:
        if recorder is not None:
            recorder.stop()
    torch._dynamo.reset()
    return len(graphs)


def test_torch_compile_compiles_under_the_native_recorder_as_without_it(library):
    without = _graphs_compiled(None)
    assert without == 1
    assert _graphs_compiled(op_recorder.NativeOpRecorder(library)) == without


def test_the_python_fallback_is_a_dispatch_mode_dynamo_refuses():
    """Why the native recorder matters: under the Python recorder Dynamo compiles nothing
    (the collector says so in its notes when it has to fall back)."""
    assert _graphs_compiled(op_recorder.PythonOpRecorder(torch)) == 0


def test_without_a_compiler_the_python_recorder_is_used_with_its_reason(monkeypatch):
    monkeypatch.setattr(native, "compiler", lambda: None)
    recorder, why = op_recorder.make_op_recorder(torch)
    assert isinstance(recorder, op_recorder.PythonOpRecorder)
    assert "no C++ compiler" in why


def test_a_library_not_as_built_or_writable_by_others_is_not_loaded(tmp_path):
    folder = tmp_path / "key"
    folder.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o700)
    (folder / native.LIBRARY).write_bytes(b"\x7fELF not really")
    os.chmod(folder / native.LIBRARY, 0o700)
    (folder / native.RECORD).write_text(json.dumps({"sha256": "0" * 64}))
    os.chmod(folder / native.RECORD, 0o600)
    assert "checksum" in native._trusted(folder)
    import hashlib

    (folder / native.RECORD).write_text(json.dumps(
        {"sha256": hashlib.sha256((folder / native.LIBRARY).read_bytes()).hexdigest()}))
    assert native._trusted(folder) is None
    os.chmod(folder / native.LIBRARY, 0o720)
    assert "writable by its group" in native._trusted(folder)
    assert native._trusted(tmp_path / "absent") == "not built yet"
