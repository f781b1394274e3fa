"""The built-in CUPTI collector, without a GPU: recorded activity streams (what cupti-python
hands the buffer-completed callback) replayed through the collector's own callbacks, the
host side reported as advisor's hooks report it, and the result attributed.

tests/data/cupti/train_steps.json holds four 1 ms training steps. Its records carry
exactly the attribute names of cupti-python's record classes (see the file's "about").
The replaying stand-in for ``cupti.cupti`` delivers a record only if its kind was enabled
when the record happened, as CUPTI does, and releases each buffer after the callback
returns: a collector that kept a record object past its callback fails these tests.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from advisor.collect import cupti as cc
from advisor.collect import cupti_records as rec
from advisor.collect.cupti_host import HostTimeline
from advisor.collect.op_recorder import PythonOpRecorder, describe_inputs
from advisor.errors import UsageError
from advisor.session import EVENT_COLUMNS, Session, SessionMeta, text

STREAM = Path(__file__).parent / "data" / "cupti" / "train_steps.json"


# -- a stand-in for cupti.cupti that replays a recorded stream ------------------------------


class Released(Exception):
    pass


class _Buffer:
    released = False


_record_classes: dict[str, type] = {}


def _record_class(name: str) -> type:
    """One class per cupti-python record type, so the collector's per-type field getters
    see what they see in a real run."""
    if name not in _record_classes:
        def __getattribute__(self, attr):
            if attr not in ("__class__", "__dict__") and object.__getattribute__(self, "_buffer").released:
                raise Released(f"{name}.{attr} read after its buffer was released")
            return object.__getattribute__(self, attr)

        _record_classes[name] = type(name, (), {"__getattribute__": __getattribute__})
    return _record_classes[name]


class _Pod:
    """A nested struct view (``object_id.pt``): also dead once the buffer is released."""

    def __init__(self, buffer, fields):
        self._buffer = buffer
        for key, value in fields.items():
            setattr(self, key, _Pod(buffer, value) if isinstance(value, dict) else value)

    def __getattribute__(self, attr):
        if attr not in ("__class__", "__dict__", "_buffer") and object.__getattribute__(self, "_buffer").released:
            raise Released(f"nested field {attr} read after its buffer was released")
        return object.__getattribute__(self, attr)


def make_record(raw: dict, buffer: _Buffer):
    record = _record_class(raw["_type"])()
    record._buffer = buffer
    for key, value in raw.items():
        if not key.startswith("_"):
            setattr(record, key, _Pod(buffer, value) if isinstance(value, dict) else value)
    return record


class FakeClock:
    """The host clock (time.time_ns): set by the replay, one ns on per read."""

    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        self.now += 1
        return self.now


class ReplayCupti:
    """The parts of ``cupti.cupti`` the collector calls, replaying a recorded stream."""

    ActivityThreadIdType = types.SimpleNamespace(SYSTEM=1)

    def __init__(self, stream: dict, clock: FakeClock):
        self.stream = stream
        self.clock = clock
        self.offset = stream["cupti_minus_host_ns"]
        self.history: list[tuple[int, int, bool]] = []  # (host time, kind, enabled)
        self.callbacks = None
        self.delivered = False
        self.dropped_left = stream["dropped_records"]
        self.external_stack: list[tuple[int, int]] = []
        self.external_log: list[tuple[str, int]] = []
        self.thread_id_type = None
        self.quiet: list[tuple[str, int]] = []

    # registration and switches
    def activity_register_callbacks(self, requested, completed):
        self.callbacks = (requested, completed)

    def set_thread_id_type(self, kind):
        self.thread_id_type = kind

    def activity_enable(self, kind):
        self.history.append((self.clock.now, int(kind), True))

    def activity_disable(self, kind):
        self.history.append((self.clock.now, int(kind), False))

    def activity_enable_runtime_api(self, cbid, enable):
        self.quiet.append(("runtime", cbid))

    def activity_enable_driver_api(self, cbid, enable):
        self.quiet.append(("driver", cbid))

    def get_timestamp(self):
        return self.clock() + self.offset

    def get_callback_name(self, domain, cbid):
        table = rec.RUNTIME_NAMES if domain == rec.DOMAIN_RUNTIME_API else rec.DRIVER_NAMES
        return f"{table[cbid]}_v3020" if cbid in table else None  # CUPTI's names carry the version

    def activity_push_external_correlation_id(self, kind, op_id):
        self.external_stack.append((kind, op_id))
        self.external_log.append(("push", op_id))

    def c_functions(self) -> tuple[int, int]:
        """C functions that push and pop through this stand-in, for the native op recorder
        (which calls libcupti's through their addresses)."""
        import ctypes

        push_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_uint64)
        pop_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64))
        self._c_push = push_type(lambda kind, op_id: self.activity_push_external_correlation_id(kind, op_id) or 0)
        self._c_pop = pop_type(lambda kind, last: self.activity_pop_external_correlation_id(kind) or 0)
        return (ctypes.cast(self._c_push, ctypes.c_void_p).value, ctypes.cast(self._c_pop, ctypes.c_void_p).value)

    def activity_pop_external_correlation_id(self, kind):
        popped_kind, op_id = self.external_stack.pop()
        assert popped_kind == kind
        self.external_log.append(("pop", op_id))
        return op_id

    # delivery
    def enabled_at(self, kind: int, host_time: int) -> bool:
        state = False
        for when, k, on in self.history:
            if k == kind and when <= host_time:
                state = on
        return state

    def _host_time(self, raw: dict) -> int:
        if "_at" in raw:
            return raw["_at"]
        return raw.get("start", raw.get("timestamp", 0)) - self.offset

    def activity_flush_all(self, flag):
        if self.delivered:
            return
        self.delivered = True
        requested, completed = self.callbacks
        size, max_records = requested()
        assert size > 0 and max_records == 0
        for raw_buffer in self.stream["buffers"]:
            buffer = _Buffer()
            records = [make_record(raw, buffer) for raw in raw_buffer
                       if self.enabled_at(raw["kind"], self._host_time(raw))]
            completed(records)
            buffer.released = True  # CUPTI takes the buffer back once the callback returns

    def activity_get_num_dropped_records(self, context, stream_id, address):
        import ctypes

        ctypes.c_size_t.from_address(address).value = self.dropped_left
        self.dropped_left = 0


class RecordedOps:
    """The op source: records the stream's ops only while started, as OpRecorder does,
    pushing and popping their external correlation ids through the collector."""

    def __init__(self):
        self.collector = None
        self.active = False

    def start(self):
        self.active = True

    def stop(self):
        self.active = False

    def run(self, event: dict, clock: FakeClock):
        if not self.active:
            return
        self.collector.push_external(event["op_id"])
        clock.now = event["end"]
        self.collector.pop_external()
        self.collector.timeline.add_op(event["name"], event["start"], event["end"], self.collector.timeline.thread_id(),
                                       event["op_id"], event["input_dims"], event["input_types"])


def replay(window: cc.StepWindow | None, *, max_records: int = cc.DEFAULT_MAX_RECORDS):
    """Run the recorded stream through a collector; returns (capture, collector, api, stream)."""
    stream = json.loads(STREAM.read_text())
    clock = FakeClock(stream["host_clock_start_ns"])
    api = ReplayCupti(stream, clock)
    ops = RecordedOps()
    collector = cc.CuptiCollector(api, window=window, ops=ops, clock=clock, max_records=max_records,
                                  pid=stream["pid"], thread_id=lambda: stream["tid"])
    ops.collector = collector
    collector.start()
    tokens = {}
    for event in stream["host"]:
        clock.now = max(clock.now, event["t"])
        if event["do"] == "step":
            collector.step_started(event["number"])
        elif event["do"] == "open":
            tokens[event["key"]] = collector.range_opened(event["name"])
        elif event["do"] == "close":
            collector.range_closed(tokens.pop(event["key"]))
        else:
            ops.run(event, clock)
    clock.now = stream["end_ns"]
    return collector.stop(), collector, api, stream


def rows(events, kind):
    return events[text(events["kind"]) == kind].reset_index(drop=True)


@pytest.fixture(scope="module")
def window_1_3():
    return replay(cc.StepWindow(1, 3))


@pytest.fixture(scope="module")
def whole_run():
    return replay(None)


# -- translation of each kind ----------------------------------------------------------------


def test_kernels_keep_launch_geometry_resources_and_a_demangled_name(whole_run):
    capture, *_ = whole_run
    kernels = rows(capture.events, "kernel")
    gemm = kernels[kernels["name"].astype(str).str.startswith("void sgemm_128x128<4>")]
    assert len(gemm) == 4
    first = gemm.iloc[0]
    assert first["name"] == "void sgemm_128x128<4>(float const*, float const*, float*, int, int, int)"
    assert (first["grid"], first["block"]) == ("[128,1,1]", "[256,1,1]")
    assert first["registers"] == 64
    assert first["shared_memory"] == 1024 + 4096  # static + dynamic
    assert (first["device"], first["stream"], first["correlation"]) == (0, 7, 1001)
    assert first["category"] == "cupti:CONCURRENT_KERNEL"
    assert first["end_ns"] - first["start_ns"] == 250_000


def test_copies_are_named_like_kineto_with_memory_kinds_and_sync_or_async(whole_run):
    capture, *_ = whole_run
    copies = rows(capture.events, "memcpy")
    names = set(copies["name"].astype(str))
    assert {"Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)",
            "Memcpy PtoP (Device -> Device)"} == names
    upload = copies[copies["name"] == "Memcpy HtoD (Pageable -> Device)"].iloc[0]
    assert (upload["copy_kind"], upload["src_memory"], upload["dst_memory"]) == ("HtoD", "Pageable", "Device")
    assert upload["bytes"] == 4_194_304
    assert upload["category"] == "cupti:MEMCPY async"
    peer = copies[copies["copy_kind"] == "PtoP"].iloc[0]
    assert (peer["stream"], peer["bytes"]) == (8, 1_048_576)


def test_pageable_and_pinned_and_sync_copies_are_told_apart():
    store = rec.RecordStore()
    buffer = _Buffer()
    base = {"_type": "ActivityMemcpy6", "kind": 1, "start": 10, "end": 20, "device_id": 0, "context_id": 1,
            "stream_id": 7, "correlation_id": 5, "bytes": 64}
    store.add_all([
        make_record({**base, "copy_kind": 1, "src_kind": 1, "dst_kind": 3, "flags_": 0}, buffer),
        make_record({**base, "copy_kind": 1, "src_kind": 2, "dst_kind": 3, "flags_": 1}, buffer),
        # a record type spelling the flags without the underscore still reads
        make_record({**base, "_type": "OtherMemcpy", "copy_kind": 2, "src_kind": 3, "dst_kind": 5, "flags": 1}, buffer),
    ])
    events = rec.build_events(store, to_session_ns=lambda t: t).events
    got = list(zip(events["name"].astype(str), events["category"].astype(str)))
    assert got == [("Memcpy HtoD (Pageable -> Device)", "cupti:MEMCPY sync"),
                   ("Memcpy HtoD (Pinned -> Device)", "cupti:MEMCPY async"),
                   ("Memcpy DtoH (Device -> Managed)", "cupti:MEMCPY async")]


def test_memset_sync_and_api_rows(whole_run):
    capture, *_ = whole_run
    events = capture.events
    memset = rows(events, "memset")
    assert list(memset["name"].astype(str)) == ["Memset (Device)"]
    assert memset["bytes"].iloc[0] == 1024
    syncs = rows(events, "sync")
    assert set(syncs["name"].astype(str)) == {"Stream Sync"}
    assert set(syncs["device"]) == {0}  # from the context record: sync records name no device
    runtime = rows(events, "runtime")
    # CUPTI's "_v3020" version suffix is gone, as in Kineto's traces
    assert {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaMemsetAsync",
            "cudaMemcpyPeerAsync"} == set(runtime["name"].astype(str))
    assert set(runtime["tid"]) == {4242} and set(runtime["pid"]) == {4242}
    assert set(events.columns) == set(EVENT_COLUMNS)


def test_nvtx_push_pop_and_marks_become_annotations(whole_run):
    capture, *_ = whole_run
    nvtx = capture.events[capture.events["category"].astype(str).str.startswith("cupti:MARKER")]
    by_name = {str(r["name"]): r for _, r in nvtx.iterrows()}
    assert set(by_name) == {"prefetch", "checkpoint"}
    assert by_name["prefetch"]["end_ns"] - by_name["prefetch"]["start_ns"] == 150_000
    assert by_name["checkpoint"]["end_ns"] == by_name["checkpoint"]["start_ns"]
    assert by_name["checkpoint"]["category"] == "cupti:MARKER user"
    assert by_name["prefetch"]["tid"] == 4242


def test_device_record_becomes_device_info(whole_run):
    capture, *_ = whole_run
    (device,) = capture.devices
    assert device.name == "NVIDIA H100 80GB HBM3"
    assert (device.sm_count, device.compute_capability, device.l2_bytes) == (132, "9.0", 52_428_800)
    assert device.memory_bandwidth_gbps == pytest.approx(3352.32)  # kB/s -> GB/s
    assert device.clock_mhz == pytest.approx(1980.0)
    assert device.total_memory_bytes == 85_018_279_936


def test_device_from_torch_properties_computes_bandwidth_from_clock_and_bus():
    props = types.SimpleNamespace(name="NVIDIA A100-SXM4-40GB", major=8, minor=0, multi_processor_count=108,
                                  total_memory=42_505_273_344, L2_cache_size=41_943_040,
                                  memory_clock_rate=1_215_000, memory_bus_width=5120, clock_rate=1_410_000)
    device = rec.device_from_torch(0, props)
    assert device.memory_bandwidth_gbps == pytest.approx(1555.2)  # 2 x 1215 MHz x 5120 bit / 8
    assert (device.compute_capability, device.sm_count, device.clock_mhz) == ("8.0", 108, 1410.0)


# -- attribution -----------------------------------------------------------------------------


def test_every_gpu_activity_reaches_its_launch_op_step_and_phase(window_1_3):
    capture, *_ = window_1_3
    ev = capture.events
    gpu = ev[np.isin(text(ev["kind"]), ["kernel", "memcpy", "memset", "sync"])]
    # Every activity the window launched; work in flight from before it has no launch (below).
    gpu = gpu[gpu["step"] >= 0]
    assert len(gpu) and (gpu["launch"] >= 0).all() and (gpu["parent_op"] >= 0).all()
    launches = ev.loc[gpu["launch"].to_numpy()]
    assert (launches["correlation"].to_numpy() == gpu["correlation"].to_numpy()).all()
    assert set(text(launches["kind"])) == {"runtime"}

    def op_of(name_prefix):
        row = gpu[gpu["name"].astype(str).str.startswith(name_prefix)]
        return row, ev.loc[row["parent_op"].to_numpy()]

    gemm, gemm_ops = op_of("void sgemm")
    assert set(gemm_ops["name"].astype(str)) == {"aten::mm"}
    assert set(gemm_ops["input_dims"].astype(str)) == {"[[64,128],[128,256]]"}
    assert set(gemm_ops["input_types"].astype(str)) == {'["float","float"]'}
    assert sorted(gemm["step"]) == [1, 2] and set(gemm["phase"].astype(str)) == {"Forward"}

    # queued behind other work, the add kernel of step 2 runs in step 3: it still counts in
    # step 2, in the phase that launched it
    add, add_ops = op_of("void at::native::vectorized_elementwise_kernel")
    assert set(add_ops["name"].astype(str)) == {"aten::add_"}
    assert sorted(add["step"]) == [1, 2] and set(add["phase"].astype(str)) == {"Optimization"}
    steps = capture.events[text(capture.events["kind"]) == "step"]
    step2_end = int(steps.loc[steps["step"] == 2, "end_ns"].iloc[0])
    assert int(add.loc[add["step"] == 2, "start_ns"].iloc[0]) > step2_end


def test_host_blocking_calls_reach_their_source_line(window_1_3):
    capture, *_ = window_1_3
    ev = capture.events
    waits = rows(ev, "sync")
    assert len(waits) == 2
    ops = ev.loc[waits["parent_op"].to_numpy()]
    assert set(ops["name"].astype(str)) == {"aten::_local_scalar_dense"}
    assert all("/work/train.py(42): main" in s for s in ops["call_stack"].astype(str))
    calls = ev.loc[waits["launch"].to_numpy()]
    assert set(calls["name"].astype(str)) == {"cudaStreamSynchronize"}


def test_gpu_rows_are_on_the_host_clock(window_1_3):
    capture, _, _, stream = window_1_3
    # CUPTI's clock ran 2 us ahead; the measured offset is within its bracket
    assert abs(capture.clock_offset_ns - stream["cupti_minus_host_ns"]) <= capture.clock_error_ns
    ev = capture.events
    gemm = ev[(text(ev["kind"]) == "kernel") & (ev["step"] == 1)].sort_values("start_ns").iloc[0]
    host_start = stream["host_clock_start_ns"] + 2_000_000 + 150_000  # step 1 starts at +2 ms
    assert abs(int(gemm["start_ns"]) - (host_start - capture.base_time_ns)) <= capture.clock_error_ns
    mm = ev.loc[int(gemm["parent_op"])]
    assert int(mm["start_ns"]) == stream["host_clock_start_ns"] + 2_100_000 - capture.base_time_ns


def test_session_tables_take_the_collected_rows(window_1_3):
    capture, *_ = window_1_3
    from advisor.tables import compute_tables

    meta = SessionMeta(source="train.py", source_format="script", collector=capture.collector,
                       devices=capture.devices, base_time_ns=capture.base_time_ns)
    tables = compute_tables(Session(meta, capture.events))
    kernel_table = next(v for k, v in tables.items() if "kernel" in k.lower())
    assert len(kernel_table) >= 2


# -- the step window and what was lost ---------------------------------------------------------


def test_step_window_keeps_only_the_asked_steps(window_1_3, whole_run):
    capture, _, api, _ = window_1_3
    ev = capture.events
    assert capture.recorded_steps == [1, 2]
    assert sorted(rows(ev, "step")["step"]) == [1, 2]
    gpu = ev[np.isin(text(ev["kind"]), ["kernel", "memcpy", "memset"])]
    launched = gpu[gpu["launch"] >= 0]
    assert set(launched["step"]) == {1, 2}
    # step 0's last kernel, still running when the window opened, is kept: the window's
    # first waits wait behind it, and it is GPU work, not host time or idle. It has no
    # recorded launch and no step.
    in_flight = gpu[gpu["launch"] < 0]
    assert len(in_flight) == 1 and set(in_flight["step"]) == {-1}
    assert in_flight["end_ns"].iloc[0] > ev.loc[ev["kind"] == "step", "start_ns"].min()
    assert len(rows(ev, "kernel")) == 5 and len(rows(ev, "memcpy")) == 5 and len(rows(ev, "op")) == 10
    # step 0's other work (the GPU kinds are on a step early) and step 3's, which arrived
    # while they drained: their launches were not recorded and the window waits for none
    # of it, so out
    assert any("7 GPU activities launched outside the recorded steps" in n for n in capture.collector.notes)
    # the whole run, for comparison, has every step
    whole, *_ = whole_run
    assert sorted(rows(whole.events, "step")["step"]) == [0, 1, 2, 3]
    assert len(rows(whole.events, "kernel")) == 8
    # activities were switched at the step boundaries, not left on
    runtime_switches = [(on, when) for when, kind, on in api.history if kind == rec.KIND_RUNTIME]
    assert [on for on, _ in runtime_switches] == [True, False]
    assert ("runtime", 17) in api.quiet  # cudaGetDevice is not recorded


def test_ops_are_bracketed_with_external_ids(window_1_3):
    _, collector, api, _ = window_1_3
    assert api.external_stack == []
    pushed = [op for what, op in api.external_log if what == "push"]
    assert pushed == [op for what, op in api.external_log if what == "pop"]
    assert sorted(pushed) == sorted(row[5] for row in collector.timeline.rows if row[1] == "op")


def test_dropped_records_and_overhead_are_in_the_collector_info(window_1_3):
    capture, *_ = window_1_3
    info = capture.collector
    assert info.name == "cupti" and info.gpu_measured
    assert info.dropped_records == 3
    assert any("CUPTI dropped 3 activity records" in n for n in info.notes)
    assert info.overhead_ns == 50_000  # instrumentation 10 us + buffer flush 40 us
    assert any("buffer flush 0.04 ms" in n for n in info.notes)
    assert any("steps 1:3 were asked for; steps 1-2 were recorded" in n for n in info.notes)


def test_records_past_the_cap_are_counted_as_dropped():
    capture, collector, *_ = replay(None, max_records=20)
    always = {rec.KIND_DEVICE, rec.KIND_CONTEXT, rec.KIND_OVERHEAD}
    kept_activities = sum(n for kind, n in collector.store.by_kind.items() if kind not in always)
    assert kept_activities <= 20 and collector.store.over_cap > 0
    assert collector.store.by_kind[rec.KIND_DEVICE] == 1  # names and devices are kept past the cap
    assert capture.collector.dropped_records == 3 + collector.store.over_cap


def test_a_step_cut_short_is_not_a_step_but_its_work_is_kept():
    stream = json.loads(STREAM.read_text())
    clock = FakeClock(stream["host_clock_start_ns"])
    api = ReplayCupti(stream, clock)
    collector = cc.CuptiCollector(api, window=cc.StepWindow(0, 2), clock=clock, record_ops=False,
                                  pid=stream["pid"], thread_id=lambda: stream["tid"])
    collector.start()
    for number in (0, 1):
        clock.now = stream["host_clock_start_ns"] + 1_000_000 * (number + 1)
        collector.step_started(number)
        token = collector.range_opened(f"ProfilerStep#{number}")
        clock.now += 999_000
        collector.range_closed(token)
        collector.step_ended(number, partial=number == 1)
    capture = collector.stop()
    assert list(rows(capture.events, "step")["step"]) == [0]
    # step 0's two kernels and step 1's gemm are kept; step 1's add kernel would start after
    # the run ended, when a real run waits for the GPU (this replay has no torch to wait with)
    assert len(rows(capture.events, "kernel")) == 3
    # step 1's work belongs to no step, as with the host collector's partial steps
    assert sorted(rows(capture.events, "kernel")["step"]) == [-1, 0, 0]
    assert any("step 1 was cut short" in n for n in capture.collector.notes)


def test_a_window_no_step_reaches_records_nothing_and_says_so():
    capture, *_ = replay(cc.StepWindow(10, 12))
    assert not capture.collector.gpu_measured
    assert any("no step in 10:12 ran" in n for n in capture.collector.notes)
    assert len(rows(capture.events, "kernel")) == 0


def test_a_record_read_after_its_callback_fails_in_this_replay():
    # the guard the other tests rely on: a collector keeping records would trip it
    buffer = _Buffer()
    record = make_record({"_type": "ActivityKernel9", "kind": 10, "name": "k",
                          "object_id": {"pt": {"thread_id": 1}}}, buffer)
    nested = record.object_id.pt
    buffer.released = True
    with pytest.raises(Released):
        _ = record.name
    with pytest.raises(Released):
        _ = nested.thread_id


def test_unreadable_records_do_not_reach_cuptis_thread():
    collector = cc.CuptiCollector(ReplayCupti(json.loads(STREAM.read_text()), FakeClock(0)), window=None)
    collector._buffer_completed([object(), types.SimpleNamespace(kind="x")])
    assert collector.store.unreadable == 2


# -- names, enums, windows ---------------------------------------------------------------------


def test_api_names_strip_versions_and_fall_back_to_the_table():
    assert rec.api_name(rec.DOMAIN_RUNTIME_API, 211, lambda d, c: "cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert rec.api_name(rec.DOMAIN_DRIVER_API, 307) == "cuLaunchKernel"
    assert rec.api_name(rec.DOMAIN_RUNTIME_API, 99999, lambda d, c: 1 / 0) == "cuda API cbid 99999"


def test_enum_disagreement_is_reported():
    fake = types.SimpleNamespace(ActivityKind=types.SimpleNamespace(CONCURRENT_KERNEL=10, MEMCPY=7))
    assert rec.check_enums(fake) == ["cupti.ActivityKind.MEMCPY is 7, advisor expects 1"]


def test_a_cupti_python_with_other_enum_values_is_refused():
    api = ReplayCupti(json.loads(STREAM.read_text()), FakeClock(0))
    api.ActivityKind = types.SimpleNamespace(MEMCPY=7)
    with pytest.raises(cc.CollectorUnavailable, match="numbers CUPTI's enums differently"):
        cc.CuptiCollector(api, record_ops=False).start()


def test_the_collector_records_torch_ops_itself_while_recording():
    torch = pytest.importorskip("torch")
    stream = json.loads(STREAM.read_text())
    api = ReplayCupti(stream, FakeClock(stream["host_clock_start_ns"]))
    collector = cc.CuptiCollector(api, window=cc.StepWindow(1, 2), torch=torch, external_functions=api.c_functions())
    collector.start()
    api.external_log.clear()  # the calibration burst's pushes
    a = torch.ones(2, 2)
    a @ a  # step 0: warm-up, not recorded
    collector.step_started(1)
    token = collector.range_opened("ProfilerStep#1")
    a @ a
    collector.range_closed(token)
    collector.step_started(2)
    a @ a  # after the window
    capture = collector.stop()
    ops = rows(capture.events, "op")
    names = list(ops["name"].astype(str))
    # The native recorder sees ops as torch.profiler does: matmul, and the mm inside it.
    assert {"aten::matmul", "aten::mm"} <= set(names) and set(ops["step"]) == {1}
    assert capture.collector.cost.op_recorder == "native" and capture.collector.cost.ops_recorded == len(ops)
    assert capture.collector.cost.per_op_ns is not None
    assert api.external_stack == []
    assert sorted(op for what, op in api.external_log if what == "push") == sorted(ops["external_id"])


@pytest.mark.parametrize("given, expected", [
    ("3:8", cc.StepWindow(3, 8)), ("5", cc.StepWindow(5, 6)), ("2:", cc.StepWindow(2, None)),
    (":4", cc.StepWindow(0, 4)), ("all", None),
])
def test_steps_option(given, expected):
    assert cc.StepWindow.parse(given) == expected


@pytest.mark.parametrize("bad", ["5:3", "3:3", "a:b", ":", "", "1:2:3", "-1:4"])
def test_bad_steps_option_is_one_clear_line(bad):
    with pytest.raises(UsageError) as err:
        cc.StepWindow.parse(bad)
    assert "\n" not in str(err.value) and "--steps" in str(err.value)


def test_default_window_skips_the_warm_up():
    window = cc.StepWindow()
    assert 0 not in window and 1 not in window and 2 in window and 6 in window and 7 not in window


# -- when the collector cannot run -------------------------------------------------------------


def fake_torch(*, cuda="12.8", available=True, profiling=False):
    return types.SimpleNamespace(
        version=types.SimpleNamespace(cuda=cuda),
        cuda=types.SimpleNamespace(is_available=lambda: available, device_count=lambda: 1 if available else 0),
        _C=types.SimpleNamespace(_autograd=types.SimpleNamespace(_profiler_enabled=lambda: profiling)),
    )


def test_without_cupti_python_the_reason_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)
    api, why = cc.import_cupti()
    assert api is None and why == "cupti-python is not installed: pip install 'advisor[cuda]'"
    assert cc.unavailable_reason(fake_torch(cuda="12.8")) == \
        "cupti-python is not installed: pip install 'cupti-python==12.8.*'"
    assert cc.unavailable_reason(fake_torch(cuda="13.0")).endswith("pip install 'cupti-python==13.0.*'")


@pytest.mark.parametrize("torch_obj, reason", [
    (None, "torch is not importable"),
    (fake_torch(cuda=None), "this torch is built without CUDA"),
    (fake_torch(available=False), "no CUDA device"),
])
def test_unavailable_reasons_are_one_line(torch_obj, reason):
    assert cc.unavailable_reason(torch_obj, loader=lambda: (object(), None)) == reason


def test_an_active_torch_profiler_is_said_plainly(monkeypatch):
    monkeypatch.setattr(cc, "cupti_python_version", lambda: "12.8.0")
    assert cc.unavailable_reason(fake_torch(profiling=True), loader=lambda: (object(), None)) == \
        "torch.profiler is active and holds CUPTI"
    collector = cc.CuptiCollector(ReplayCupti(json.loads(STREAM.read_text()), FakeClock(0)),
                                  torch=fake_torch(profiling=True), record_ops=False)
    with pytest.raises(cc.CollectorUnavailable, match="torch.profiler is active and holds CUPTI"):
        collector.start()


def test_a_real_torch_profiler_is_detected():
    torch = pytest.importorskip("torch")
    assert not cc.torch_profiler_active(torch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert cc.torch_profiler_active(torch)
    assert not cc.torch_profiler_active(torch)


def test_cuda_major_mismatch_names_the_right_package():
    assert cc.version_mismatch("12.8", "12.8.0") is None
    assert cc.version_mismatch("12.6", "13.4.0") == \
        "cupti-python 13.4.0 is for CUDA 13 but torch is built with CUDA 12.6: pip install 'cupti-python==12.6.*'"
    assert cc.install_hint("12.9") == "pip install 'cupti-python==12.8.*'"
    assert cc.install_hint("13.1") == "pip install 'cupti-python==13.0.*'"
    assert cc.install_hint(None) == "pip install 'advisor[cuda]'"


def test_not_measured_is_one_line():
    line = cc.not_measured_line("no CUDA device")
    assert "\n" not in line and line.startswith("GPU not measured (no CUDA device)") and "advisor[cuda]" in line


def test_start_collector_on_this_machine_falls_back_with_a_reason():
    torch = pytest.importorskip("torch")
    collector, why = cc.start_collector(torch)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the fallback path is not taken")
    assert collector is None and why in ("this torch is built without CUDA", "no CUDA device")


# -- the op recorder on CPU torch --------------------------------------------------------------


def test_python_op_recorder_records_shapes_dtypes_and_brackets_external_ids():
    torch = pytest.importorskip("torch")
    stack, log = [], []

    def push(op_id):
        stack.append(op_id)
        log.append(op_id)

    recorder = PythonOpRecorder(torch, push=push, pop=stack.pop, pid=1, thread_id=lambda: 7)
    a, b = torch.ones(4, 8), torch.ones(8, 16)
    h = torch.ones(3, dtype=torch.bfloat16)
    recorder.start()
    try:
        torch.mm(a, b)
        h + h
        torch.cat([a, a])
    finally:
        recorder.stop()
    torch.mm(a, b)  # after stop: not recorded
    ops = recorder.frame(lambda t: t)
    by_name = {str(r.name): r for r in ops.itertuples()}
    assert {"aten::mm", "aten::add", "aten::cat"} <= set(by_name)
    assert (by_name["aten::mm"].input_dims, by_name["aten::mm"].input_types) == ("[[4,8],[8,16]]", '["float","float"]')
    assert json.loads(by_name["aten::add"].input_types)[:2] == ["c10::BFloat16", "c10::BFloat16"]
    assert json.loads(by_name["aten::cat"].input_types)[0] == "TensorList"
    assert stack == [] and sorted(log) == sorted(ops["external_id"])
    assert (ops["tid"] == 7).all() and (ops["end_ns"] >= ops["start_ns"]).all()
    assert (ops["name"].astype(str) == "aten::mm").sum() == 1


def test_describe_inputs_spells_like_kineto():
    torch = pytest.importorskip("torch")
    dims, kinds = describe_inputs([torch.ones(2, 3, dtype=torch.float16), None, 1.5, [1, 2]], torch.Tensor)
    assert dims == "[[2,3],[],[],[]]" and kinds == '["c10::Half","","Scalar","ScalarList"]'


def test_host_timeline_closes_ranges_left_open():
    clock = FakeClock(100)
    timeline = HostTimeline(clock=clock, pid=1, thread_id=lambda: 2)
    timeline.open_range("ProfilerStep#5")
    assert timeline.close_all() == 1
    frame = timeline.frame(lambda t: t - 100)
    assert list(frame["name"].astype(str)) == ["ProfilerStep#5"] and frame["start_ns"].iloc[0] == 1
