"""The Kineto importer: both schemas, exact timestamps, attribution, and bad input."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import shared_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.errors import AdvisorError, SessionError, TraceError
from advisor.importers import load
from advisor.session import Session

ALL_SHARED = [
    "resnet50_v100_num_workers_0.pt.trace.json.gz",
    "resnet50_v100_num_workers_4.pt.trace.json.gz",
    "ddp_cnn_a100_rank0.json.gz",
    "qwen0.5b_infer_h100.json.gz",
    "bert_small_infer_h100.json.gz",
]


def _new_schema_step(step: int, t0: float) -> list[dict]:
    """One training step in today's schema: loader, a conv launching a kernel, backward
    on the autograd thread, an optimizer step, with sub-microsecond timestamps."""
    corr = 1000 + step * 10
    return [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t0, "dur": 100.0},
        {"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "pid": 1, "tid": 1, "ts": t0 + 0.5, "dur": 30.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": t0 + 31.0, "dur": 10.0,
         "args": {"External id": corr, "Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "pid": 1, "tid": 1, "ts": t0 + 31.5, "dur": 9.0,
         "args": {"External id": corr + 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 32.123, "dur": 3.0,
         "args": {"External id": corr + 1, "correlation": corr}},
        {"ph": "X", "cat": "kernel", "name": "implicit_gemm", "pid": 0, "tid": 7, "ts": t0 + 35.4567, "dur": 0.769,
         "args": {"External id": corr + 1, "device": 0, "stream": 7, "correlation": corr, "grid": [4, 1, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: ConvolutionBackward0",
         "pid": 1, "tid": 2, "ts": t0 + 50.0, "dur": 20.0, "args": {"External id": corr + 2}},
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1, "ts": t0 + 75.0,
         "dur": 20.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": t0 + 96.0, "dur": 2.0,
         "args": {"correlation": corr + 5}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": t0 + 96.5, "dur": 1.0, "args": {"device": 0, "stream": 7, "correlation": corr + 5, "bytes": 4096}},
        {"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": t0 + 32.123, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t0 + 35.4567, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]


NEW_SCHEMA = _new_schema_step(1, 1428625731896.179) + _new_schema_step(2, 1428625731996.179) + [
    {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python3"}},
]


def test_new_schema_links_kernels_to_calls_ops_steps_and_phases(make_trace):
    session = load(make_trace(NEW_SCHEMA, deviceProperties=[{"id": 0, "name": "NVIDIA H100", "numSms": 132,
                                                              "computeMajor": 9, "computeMinor": 0}]))
    ev = session.events
    kernels = ev[ev["kind"] == "kernel"]
    assert len(kernels) == 2
    launch = ev.loc[kernels["launch"].to_numpy()]
    assert list(launch["name"].astype(str)) == ["cudaLaunchKernel"] * 2
    assert list(ev.loc[kernels["parent_op"].to_numpy(), "name"].astype(str)) == ["aten::convolution"] * 2
    assert list(ev.loc[kernels["top_op"].to_numpy(), "name"].astype(str)) == ["aten::conv2d"] * 2
    assert list(kernels["step"]) == [1, 2]
    assert set(kernels["phase"].astype(str)) == {"Forward"}
    copies = ev[ev["kind"] == "memcpy"]
    assert list(copies["src_memory"].astype(str)) == ["Pageable", "Pageable"]
    assert list(copies["copy_kind"].astype(str)) == ["HtoD", "HtoD"]
    assert set(copies["phase"].astype(str)) == {"Others"}
    backward = ev[ev["name"].astype(str).str.contains("Backward")]
    assert set(backward["phase"].astype(str)) == {"Backward"}
    phases = ev[ev["kind"] == "phase"]
    loader = phases[phases["phase"] == "Dataloader"]
    assert list(loader["end_ns"] - loader["start_ns"]) == [30_000, 30_000]
    gpu = [d for d in session.meta.devices if d.kind == "gpu"]
    assert [(d.name, d.sm_count, d.compute_capability) for d in gpu] == [("NVIDIA H100", 132, "9.0")]


def test_sub_microsecond_times_are_exact_not_rounded(make_trace):
    ev = load(make_trace(NEW_SCHEMA)).events
    kernel = ev[ev["kind"] == "kernel"].iloc[0]
    assert kernel["start_ns"] == 1428625731896179 + 35457  # 35.4567 us -> 35457 ns (nearest ns)
    assert kernel["end_ns"] - kernel["start_ns"] == 769
    assert (ev["end_ns"] >= ev["start_ns"]).all()


def test_old_schema_categories_and_gzip(tmp_path):
    from builders import write_trace

    events = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": 9, "tid": "9", "ts": 1000, "dur": 100},
        {"ph": "X", "cat": "Operator", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "pid": 9, "tid": "9", "ts": 1001, "dur": 40},
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 9, "tid": "9", "ts": 1050, "dur": 5,
         "args": {"External id": 3}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": "9", "ts": 1051, "dur": 2,
         "args": {"correlation": 77, "external id": 3}},
        {"ph": "X", "cat": "Kernel", "name": "add_kernel", "pid": 0, "tid": "stream 7", "ts": 1060, "dur": 3,
         "args": {"device": 0, "stream": 7, "correlation": 77, "external id": 3}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 7", "ts": 1070, "dur": 1,
         "args": {"device": 0, "stream": 7, "correlation": 78, "bytes": 64}},
    ]
    session = load(write_trace(tmp_path / "old.pt.trace.json.gz", events))
    ev = session.events
    kinds = dict(zip(ev["name"].astype(str), ev["kind"].astype(str)))
    assert kinds["ProfilerStep#5"] == "step"
    assert kinds["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"] == "annotation"
    assert kinds["add_kernel"] == "kernel" and kinds["Memset (Device)"] == "memset"
    kernel = ev[ev["kind"] == "kernel"].iloc[0]
    assert ev.loc[kernel["parent_op"], "name"] == "aten::add"
    assert kernel["stream"] == 7 and kernel["step"] == 5
    assert session.meta.collector.gpu_measured


def test_saved_session_round_trips(tmp_path, make_trace):
    session = load(make_trace(NEW_SCHEMA))
    folder = session.save(tmp_path / "saved")
    again = load(folder)
    assert again.meta == session.meta
    assert again.events.equals(session.events)


@pytest.mark.parametrize("name", ALL_SHARED)
def test_every_shared_trace_reads(name):
    session = load(shared_trace(name))
    ev = session.events
    assert len(ev) > 1000
    assert (ev["end_ns"] >= ev["start_ns"]).all()
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    assert len(gpu) > 0 and session.meta.collector.gpu_measured


@pytest.mark.parametrize("name", ALL_SHARED[:3])
def test_training_traces_attribute_every_kernel(name):
    ev = load(shared_trace(name)).events
    kernels = ev[ev["kind"] == "kernel"]
    assert (kernels["launch"] >= 0).mean() >= 0.99
    assert (kernels["parent_op"] >= 0).mean() >= 0.99
    assert (kernels["step"] >= 0).mean() >= 0.99


def test_resnet_dataloader_phase_matches_the_trace_own_ranges():
    path = shared_trace("resnet50_v100_num_workers_0.pt.trace.json.gz")
    import json

    raw = json.load(gzip.open(path))["traceEvents"]
    loader_us = sum(e["dur"] for e in raw if e.get("name", "").startswith("enumerate(DataLoader)"))
    ev = load(path).events
    phases = ev[(ev["kind"] == "phase") & (ev["phase"] == "Dataloader")]
    assert (phases["end_ns"] - phases["start_ns"]).sum() == loader_us * 1000
    assert len(load(path).steps()) == 6


def test_ddp_trace_has_distributed_info():
    session = load(shared_trace("ddp_cnn_a100_rank0.json.gz"))
    assert session.meta.distributed is not None
    assert (session.meta.distributed.backend, session.meta.distributed.rank, session.meta.distributed.world_size) == ("nccl", 0, 2)


# -- bad input: one clear line, an AdvisorError, never a traceback ----------------------


def _one_line(exc: Exception) -> str:
    text = str(exc)
    assert "\n" not in text and text
    return text


def test_missing_file(tmp_path):
    with pytest.raises(TraceError) as info:
        load(tmp_path / "nope.json")
    assert "no such file" in _one_line(info.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    with pytest.raises(TraceError) as info:
        load(path)
    assert "empty" in _one_line(info.value)


def test_binary_file(tmp_path):
    path = tmp_path / "random.bin"
    path.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(TraceError) as info:
        load(path)
    assert "not a trace" in _one_line(info.value)


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_trace_keeps_the_events_before_the_cut(tmp_path, make_trace, gz):
    """A job killed while writing its trace: the whole events before the cut are read,
    and the session says the file was truncated and how far it got."""
    full = make_trace(NEW_SCHEMA, name="full.json").read_bytes()
    data = full[: len(full) * 2 // 3]
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    if gz:
        compressed = gzip.compress(full)
        data = compressed[: len(compressed) * 2 // 3]
    path.write_bytes(data)
    session = load(path)
    damage = session.meta.trace_metadata["damage"]
    assert damage["truncated"] is True
    assert 0 < damage["bytes_read"] < len(full)
    assert damage["bytes_total"] == (None if gz else len(data))  # a cut gzip stream does not say
    assert damage["skipped"] == {}  # the event the cut went through is not damage
    # Exactly the complete X events in the bytes that were read survive.
    text = full[: damage["bytes_read"]].decode()
    whole = sum(1 for e in NEW_SCHEMA if e["ph"] == "X" and text.find(json.dumps(e)) >= 0)
    read = session.events[session.events["kind"].astype(str) != "phase"]  # phases are derived
    assert 0 < len(read) == whole


@pytest.mark.parametrize("gz", [False, True])
def test_trace_cut_before_its_first_event_is_one_line(tmp_path, make_trace, gz):
    full = make_trace(NEW_SCHEMA, name="full.json").read_bytes()
    data = full[:30]  # inside the keys before the event array
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    path.write_bytes(gzip.compress(full)[:40] if gz else data)
    with pytest.raises(TraceError) as info:
        load(path)
    assert "truncated" in _one_line(info.value)


@pytest.mark.parametrize("document", [b'{"foo": 1}', b'{"traceEvents": 5}', b'{"traceEvents": [1, 2, 3]}',
                                      b'[1, 2]', b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "soon"}]}'])
def test_wrong_shape(tmp_path, document):
    path = tmp_path / "odd.json"
    path.write_bytes(document)
    with pytest.raises(TraceError) as info:
        load(path)
    _one_line(info.value)


def test_directory_that_is_no_session(tmp_path):
    with pytest.raises(SessionError) as info:
        load(tmp_path)
    assert "not an advisor session" in _one_line(info.value)


def test_damaged_session(tmp_path, make_trace):
    folder = load(make_trace(NEW_SCHEMA)).save(tmp_path / "s")
    (folder / "events.parquet").write_bytes(b"garbage")
    with pytest.raises(SessionError):
        load(folder)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_load_or_fail_cleanly(tmp_path, data):
    path = tmp_path / "fuzz.json"
    path.write_bytes(data)
    try:
        session = load(path)
    except AdvisorError as exc:
        _one_line(exc)
    else:
        assert isinstance(session, Session)
        assert np.all(session.events["end_ns"].to_numpy() >= session.events["start_ns"].to_numpy())


def test_chunked_reading_keeps_every_event(make_trace, monkeypatch):
    import advisor.importers.kineto as kineto

    whole = load(make_trace(NEW_SCHEMA, name="a.json")).events
    monkeypatch.setattr(kineto, "BLOCK", 300)  # many chunks of a few events, and one left over at the end
    chunked = load(make_trace(NEW_SCHEMA, name="b.json")).events
    assert len(chunked) == len(whole)
    assert chunked.equals(whole)
    assert list(chunked["name"].astype(str)) == list(whole["name"].astype(str))
    assert set(chunked["input_dims"].astype(str)) == {"", "[[8,3,32,32],[16,3,3,3]]"}


def test_advisor_sync_ranges_give_their_ops_the_source_line(make_trace):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0.0, "dur": 50.0},
        {"ph": "X", "cat": "user_annotation", "name": "advisor::sync item @ /home/me/train.py(42): main",
         "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 1, "ts": 10.5, "dur": 4.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "pid": 1, "tid": 1, "ts": 11.0, "dur": 2.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 20.0, "dur": 2.0},
    ]
    ev = load(make_trace(events)).events
    stacks = dict(zip(ev["name"].astype(str), ev["call_stack"].astype(str)))
    assert stacks["aten::item"] == "/home/me/train.py(42): main"
    assert stacks["aten::_local_scalar_dense"] == "/home/me/train.py(42): main"
    assert stacks["aten::add"] == ""


@pytest.mark.parametrize("small_buffers", [False, True])
def test_metadata_before_and_after_the_events_is_read(tmp_path, monkeypatch, small_buffers):
    import json

    import advisor.importers.kineto as kineto

    if small_buffers:  # blocks far smaller than an event: every cut and the array's end cross blocks
        monkeypatch.setattr(kineto, "BLOCK", 64)
    document = (
        '{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 4},\n'
        '"traceEvents": ' + json.dumps(NEW_SCHEMA) + ',\n'
        '"INFO": ["CuptiActivityProfiler.cpp:976] Enabling GPU tracing", "a ], \\"b\\": [1]"],\n'
        '"traceName": "t.json", "baseTimeNanoseconds": 1711964646000000000}\n'
    )
    path = tmp_path / "meta.json"
    path.write_text(document)
    session = load(path)
    meta = session.meta
    assert meta.distributed.rank == 1 and meta.distributed.world_size == 4
    assert meta.base_time_ns == 1711964646000000000
    assert meta.trace_metadata["traceName"] == "t.json"
    assert meta.trace_metadata["INFO"][1] == 'a ], "b": [1]'
    assert len(session.events[session.events["kind"] == "kernel"]) == 2
