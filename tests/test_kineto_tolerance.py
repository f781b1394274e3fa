"""The Kineto reader on damaged traces: a bad event is skipped (or repaired) and counted by
reason, the rest is read; a file cut off keeps the events before the cut; nothing raises
but TraceError and nothing hangs. The fast path never takes the careful one on a good file.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import shared_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import (
    RenderedTrace,
    byte_flips,
    damaged_bytes,
    deleted_keys,
    expected_rows,
    render,
    small_trace,
    touched_by,
    traces,
    truncations,
    wrong_types,
)

from advisor.errors import TraceError
from advisor.importers import kineto, load
from advisor.importers.kineto import open_trace, read_events

SMALL = small_trace(4)
ROWS = expected_rows(SMALL)


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail instead of hanging: a reader that loops past ``seconds`` is stopped."""

    def stop(signum, frame):
        raise AssertionError(f"reading took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def read(path: Path):
    stream = open_trace(path)
    try:
        with deadline(20):
            return read_events(stream, path)
    finally:
        stream.close()


def read_bytes(tmp_path: Path, data: bytes, name: str = "trace.json"):
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return read(path)


def rows(raw) -> set[tuple[str, float]]:
    return set(zip(raw["name"].astype(str), raw["ts"].astype(float)))


def load_or_one_line(path: Path, data: bytes, seconds: float):
    """The Session of ``data`` written to ``path``, or None where loading it is one
    TraceError line; anything else (a traceback, more than ``seconds``) fails the test."""
    path.write_bytes(data)
    try:
        with deadline(seconds):
            return load(path)
    except TraceError as exc:
        one_line(exc)
        return None


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text
    return text


def event_index(name: str) -> int:
    return next(i for i, e in enumerate(SMALL) if e.get("name") == name)


def edited(trace: RenderedTrace, edits: dict[str, tuple[bytes, bytes]]) -> bytes:
    """The trace's bytes with, in the event of each name, the first ``old`` made ``new``.
    Edited from the end backwards, so the spans of the events not yet edited still hold."""
    data = trace.data
    for name, (old, new) in sorted(edits.items(), key=lambda kv: -trace.spans[event_index(kv[0])][0]):
        start, end = trace.spans[event_index(name)]
        piece = data[start:end]
        assert old in piece, (name, old)
        data = data[:start] + piece.replace(old, new, 1) + data[end:]
    return data


@pytest.fixture(params=["kineto", "line"])
def layout(request) -> str:
    return request.param


# -- every kind of damage, counted ----------------------------------------------------------


def test_a_good_trace_reads_whole_with_no_damage(tmp_path, layout):
    raw, meta, names = read_bytes(tmp_path, render(SMALL, layout).data)
    assert rows(raw) == ROWS
    assert meta["_damage"] == {"skipped": {}, "repaired": {}, "truncated": False,
                               "durations": {"events": len(ROWS), "missing": 0, "zero": 0},
                               "bytes_read": len(render(SMALL, layout).data),
                               "bytes_total": len(render(SMALL, layout).data)}
    assert meta["_skipped_events"] == 0
    assert meta["traceName"] == "trace.json" and meta["deviceProperties"][0]["numSms"] == 108
    assert names == {"process_name:10:0": "python3"}


def test_an_event_that_does_not_parse_is_skipped(tmp_path, layout):
    trace = render(SMALL, layout)
    damaged = ["cpu_op#2", "kernel#9"]
    data = edited(trace, {name: (b'"cat":', b'"cat" ') for name in damaged})  # a colon missing
    raw, meta, _ = read_bytes(tmp_path, data)
    assert meta["_damage"]["skipped"] == {"unparseable": 2}
    assert meta["_skipped_events"] == 2
    assert rows(raw) == {r for r in ROWS if r[0] not in damaged}


@pytest.mark.parametrize("field, value", [("cat", ["cpu_op"]), ("ts", "soon"), ("ts", [1.0]), ("name", {"a": 1}),
                                          ("pid", [1]), ("dur", "long")])
def test_an_event_of_the_wrong_shape_is_skipped(tmp_path, layout, field, value):
    events = json.loads(json.dumps(SMALL))
    events[event_index("cpu_op#7")][field] = value
    raw, meta, _ = read_bytes(tmp_path, render(events, layout).data)
    assert meta["_damage"]["skipped"] == {"wrong type": 1}
    assert rows(raw) == {r for r in ROWS if r[0] != "cpu_op#7"}


def test_args_of_the_wrong_type_are_dropped_and_the_event_kept(tmp_path, layout):
    events = json.loads(json.dumps(SMALL))
    events[event_index("kernel#4")]["args"]["correlation"] = "c1004"  # (digits and hex as text are ids)
    events[event_index("kernel#9")]["args"]["device"] = [0]
    events[event_index("cpu_op#2")]["args"] = [1, 2]
    raw, meta, _ = read_bytes(tmp_path, render(events, layout).data)
    assert meta["_damage"]["skipped"] == {}
    assert meta["_damage"]["repaired"] == {"wrong type": 3}
    assert rows(raw) == ROWS
    by_name = raw.set_index(raw["name"].astype(str))
    assert by_name.loc["kernel#4", "correlation"] == -1 and by_name.loc["kernel#9", "device"] == -1
    assert by_name.loc["cuda_runtime#3", "correlation"] == 1003  # the others untouched


def test_torch_unescaped_quotes_in_a_name_are_repaired(tmp_path, layout):
    """pytorch#146900: frames of generated code named after a dict, quotes unescaped."""
    bad_name = '{"device": "cpu", "dtype": "float32"}(12): run'
    data = edited(render(SMALL, layout), {"python_function#1": (b'"python_function#1"',
                                                                b'"' + bad_name.encode() + b'"')})
    raw, meta, _ = read_bytes(tmp_path, data)
    assert meta["_damage"]["repaired"] == {"unescaped quotes": 1}
    assert meta["_damage"]["skipped"] == {}
    ts = SMALL[event_index("python_function#1")]["ts"]
    assert rows(raw) == {r for r in ROWS if r[0] != "python_function#1"} | {(bad_name, ts)}


def test_unescaped_quotes_outside_a_name_skip_the_event(tmp_path, layout):
    """Only names are repaired (torch writes only those unescaped); elsewhere the event goes."""
    data = edited(render(SMALL, layout), {"python_function#6": (b'"cat": "python_function"',
                                                                b'"cat": "python_"function"')})
    raw, meta, _ = read_bytes(tmp_path, data)
    assert meta["_damage"]["skipped"] == {"unparseable": 1}
    assert rows(raw) == {r for r in ROWS if r[0] != "python_function#6"}


def test_nan_and_infinity(tmp_path, layout):
    """In a time the event cannot be placed and is skipped; anywhere else it is read."""
    data = edited(render(SMALL, layout), {
        "cpu_op#2": (b'"ts": ', b'"ts": NaN, "was": '),
        "kernel#4": (b'"dur": 1.5', b'"dur": Infinity'),
        "cpu_op#7": (b'"Sequence number": 7', b'"Sequence number": -Infinity'),
        "gpu_memcpy#5": (b'"stream": 7', b'"stream": 7, "x": NaN'),
    })
    raw, meta, _ = read_bytes(tmp_path, data)
    assert meta["_damage"]["skipped"] == {"NaN or Infinity": 2}
    assert meta["_damage"]["repaired"] == {"NaN or Infinity": 2}
    assert rows(raw) == {r for r in ROWS if r[0] not in ("cpu_op#2", "kernel#4")}


def test_invalid_utf8_is_replaced(tmp_path, layout):
    data = edited(render(SMALL, layout), {"cpu_op#12": (b"cpu_op#12", b"cpu_op\xff#12")})
    raw, meta, _ = read_bytes(tmp_path, data)
    assert meta["_damage"]["repaired"] == {"invalid UTF-8": 1}
    assert meta["_damage"]["skipped"] == {}
    assert "cpu_op\ufffd#12" in set(raw["name"].astype(str))
    assert len(raw) == len(ROWS)


def test_integers_past_int64_keep_ids_linked(tmp_path, layout):
    """HTA's large_integer trace: ids that json.load reads exactly must not crash anything;
    a runtime call and its kernel that share a huge correlation id stay linked."""
    huge = 2**64 + 5
    events = json.loads(json.dumps(SMALL))
    for name in ("cuda_runtime#3", "kernel#4"):
        events[event_index(name)]["args"]["correlation"] = huge
    events[event_index("cpu_op#2")]["args"]["Comms Id"] = 2**70
    events[event_index("cpu_op#7")]["args"]["External id"] = -(2**66)
    events[event_index("gpu_memcpy#5")]["args"]["bytes"] = 2**64
    events[event_index("python_function#6")]["pid"] = 2**65
    path = tmp_path / "big.json"
    path.write_bytes(render(events, layout).data)
    raw, meta, _ = read(path)
    assert rows(raw) == ROWS
    assert meta["_damage"]["skipped"] == {}
    assert meta["_damage"]["repaired"] == {"integer past int64": 5}
    by_name = raw.set_index(raw["name"].astype(str))
    assert by_name.loc["cuda_runtime#3", "correlation"] == by_name.loc["kernel#4", "correlation"] >= 2**62
    assert by_name.loc["gpu_memcpy#5", "bytes"] == -1
    session = load(path)  # the whole importer, attribution included
    ev = session.events
    kernel = ev.index[ev["name"].astype(str) == "kernel#4"][0]
    runtime = ev.index[ev["name"].astype(str) == "cuda_runtime#3"][0]
    assert ev.loc[kernel, "launch"] == runtime


@pytest.mark.parametrize("where", ["args", "head", "tail"])
def test_very_deep_nesting_neither_hangs_nor_recurses(tmp_path, where):
    deep = "[" * 100_000 + "]" * 100_000
    trace = render(SMALL)
    if where == "args":
        data = edited(trace, {"cpu_op#2": (b'"Sequence number": 2', b'"deep": ' + deep.encode())})
    elif where == "head":
        data = trace.data.replace(b'"schemaVersion": 1', b'"deep": ' + deep.encode(), 1)
    else:
        data = trace.data.replace(b'"traceName": "trace.json"', b'"deep": ' + deep.encode(), 1)
    started = time.perf_counter()
    raw, meta, _ = read_bytes(tmp_path, data)
    assert time.perf_counter() - started < 60  # a guard against a square, not a speed: 0.1 s here
    if where == "args":
        assert meta["_damage"]["skipped"] == {"nested too deep": 1}
        assert rows(raw) == {r for r in ROWS if r[0] != "cpu_op#2"}
    else:
        assert rows(raw) == ROWS
        assert sum(meta["_damage"]["skipped"].values()) == 1  # the one top-level key


def test_times_no_timeline_holds_are_skipped(tmp_path, layout):
    """Past int64 nanoseconds, or past what a float holds: the event cannot be placed."""
    events = json.loads(json.dumps(SMALL))
    events[event_index("kernel#4")]["ts"] = 10**400
    events[event_index("cpu_op#7")]["dur"] = 2.0**62
    events[event_index("cpu_op#12")]["args"]["flops"] = 10**400
    raw, meta, _ = read_bytes(tmp_path, render(events, layout).data)
    assert meta["_damage"]["skipped"] == {"time out of range": 2}
    assert meta["_damage"]["repaired"] == {"wrong type": 1}
    assert rows(raw) == {r for r in ROWS if r[0] not in ("kernel#4", "cpu_op#7")}


def test_missing_ts_is_counted(tmp_path, layout):
    events = json.loads(json.dumps(SMALL))
    del events[event_index("kernel#14")]["ts"]
    raw, meta, _ = read_bytes(tmp_path, render(events, layout).data)
    assert meta["_damage"]["skipped"] == {"missing ts": 1}
    assert rows(raw) == {r for r in ROWS if r[0] != "kernel#14"}


def test_non_objects_in_the_event_array_are_skipped(tmp_path, layout):
    trace = render(SMALL, layout)
    start, end = trace.spans[event_index("cpu_op#2")]
    raw, meta, _ = read_bytes(tmp_path, trace.data[:start] + b"[1, 2]" + trace.data[end:])
    assert meta["_damage"]["skipped"] == {"not an object": 1}
    assert rows(raw) == {r for r in ROWS if r[0] != "cpu_op#2"}


# -- cut off ------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("fraction", [0.3, 0.55, 0.8, 0.97])
def test_a_trace_cut_off_keeps_every_whole_event_before_the_cut(tmp_path, layout, gz, fraction):
    trace = render(SMALL, layout)
    if gz:
        compressed = gzip.compress(trace.data)
        path = tmp_path / "cut.json.gz"
        path.write_bytes(compressed[: int(len(compressed) * fraction)])
    else:
        path = tmp_path / "cut.json"
        path.write_bytes(trace.data[: int(len(trace.data) * fraction)])
    raw, meta, _ = read(path)
    damage = meta["_damage"]
    assert damage["truncated"] is True and damage["skipped"] == {}
    read_so_far = damage["bytes_read"]
    assert damage["bytes_total"] == (None if gz else read_so_far)
    whole = [e for e, (_, end) in zip(SMALL, trace.spans) if end <= read_so_far]
    assert rows(raw) == expected_rows(whole)


def test_a_trace_cut_in_the_keys_after_the_events_keeps_them_all(tmp_path):
    trace = render(SMALL)
    cut = trace.data.index(b'"displayTimeUnit"') + 5
    raw, meta, _ = read_bytes(tmp_path, trace.data[:cut])
    assert rows(raw) == ROWS
    assert meta["_damage"]["truncated"] is True
    assert meta["traceName"] == "trace.json"


def test_a_cut_after_many_keys_past_the_events_is_quick(tmp_path):
    """Each ']' is a candidate end of the array; a parse that failed is not redone from
    inside it, so thousands of them do not make a square."""
    trace = render(SMALL)
    data = trace.data[: trace.data.rindex(b"]") + 1] + b"".join(b', "k%d": []' % i for i in range(30000))
    started = time.perf_counter()
    raw, meta, _ = read_bytes(tmp_path, data + b', "cut": ')
    assert time.perf_counter() - started < 60  # a guard against a square, not a speed: 0.1 s here
    assert rows(raw) == ROWS and meta["_damage"]["truncated"] is True and "k29999" in meta


# -- good files stay on the fast path -----------------------------------------------------


@pytest.fixture
def no_careful_path(monkeypatch):
    def refuse(self, chunk, *, final):
        raise AssertionError("a good file went down the careful path")

    monkeypatch.setattr(kineto.EventReader, "_careful", refuse)


@pytest.mark.parametrize("block", [64, 1 << 18])
def test_good_files_never_take_the_careful_path(tmp_path, layout, no_careful_path, monkeypatch, block):
    monkeypatch.setattr(kineto, "BLOCK", block)
    raw, meta, _ = read_bytes(tmp_path, render(SMALL, layout).data, "good.json.gz")
    assert rows(raw) == ROWS and meta["_damage"]["skipped"] == {}


@pytest.mark.parametrize("name", ["resnet50_v100_num_workers_0.pt.trace.json.gz", "ddp_cnn_a100_rank0.json.gz",
                                  "qwen0.5b_infer_h100.json.gz"])
def test_real_traces_read_without_damage(name, no_careful_path):
    raw, meta, _ = read(shared_trace(name))
    assert len(raw) > 1000
    assert meta["_damage"]["skipped"] == {} and meta["_damage"]["repaired"] == {}
    assert meta["_damage"]["truncated"] is False
    assert meta["_damage"]["bytes_read"] == meta["_damage"]["bytes_total"] > 1_000_000


def test_a_cut_that_lands_inside_a_string_is_read_again(tmp_path, monkeypatch, layout):
    """A name holding '}, {' looks like the end of an event; the chunk cut there fails to
    decode and is read again whole: nothing is lost or counted."""
    events = json.loads(json.dumps(SMALL))
    for i in range(0, len(events), 3):
        if events[i].get("ph") == "X":
            events[i]["name"] = events[i]["name"] + " {'a': 1}, {'b': 2} },\n  {"
    monkeypatch.setattr(kineto, "BLOCK", 100)
    raw, meta, _ = read_bytes(tmp_path, render(events, layout).data)
    assert rows(raw) == expected_rows(events)
    assert meta["_damage"]["skipped"] == {} and meta["_damage"]["repaired"] == {}


def test_keys_after_the_events_that_hold_lists_of_objects(tmp_path, monkeypatch):
    """As HTA writes them: deviceProperties after the event array."""
    monkeypatch.setattr(kineto, "BLOCK", 128)
    tail = {"deviceProperties": [{"id": 0, "name": "A"}, {"id": 1, "name": "B"}], "traceName": "x ], {"}
    raw, meta, _ = read_bytes(tmp_path, render(SMALL, head={"schemaVersion": 1}, tail=tail).data)
    assert rows(raw) == ROWS
    assert meta["deviceProperties"][1]["name"] == "B" and meta["traceName"] == "x ], {"
    assert meta["_damage"]["skipped"] == {}


def test_a_bare_array_and_a_trailing_comma(tmp_path, layout):
    data = render(SMALL, layout, array=True).data
    raw, meta, _ = read_bytes(tmp_path, data)
    assert rows(raw) == ROWS and meta["_damage"]["truncated"] is False
    data = data.rstrip()[:-1].rstrip() + b",\n]"
    raw, meta, _ = read_bytes(tmp_path, data)
    assert rows(raw) == ROWS and meta["_damage"]["skipped"] == {}


@pytest.mark.parametrize("data, word", [(b'{"traceEvents": [1, 2, 3]}', "none of its events"),
                                        (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "soon"}]}',
                                         "wrong type"),
                                        (b'{"traceEvents": {"a": 1}}', "not a list"),
                                        (b'{"metadata": {"x": 1}, "other": []}', "no traceEvents"),
                                        (b'{"traceEvents"', "truncated")])
def test_files_with_nothing_to_read_are_one_line(tmp_path, data, word):
    path = tmp_path / "odd.json"
    path.write_bytes(data)
    with pytest.raises(TraceError) as info:
        read(path)
    assert word in one_line(info.value)


def test_the_loader_reports_the_damage(tmp_path):
    events = json.loads(json.dumps(SMALL))
    events[event_index("cpu_op#7")]["cat"] = ["cpu_op"]
    data = render(events).data
    path = tmp_path / "cut.json"
    path.write_bytes(data[: len(data) * 3 // 4])
    meta = load(path).meta.trace_metadata
    assert meta["skipped_events"] == 1
    assert meta["damage"]["skipped"] == {"wrong type": 1}
    assert meta["damage"]["truncated"] is True and meta["damage"]["bytes_read"] == len(data) * 3 // 4


# -- properties over mutations of a small synthetic trace ---------------------------------

# ADVISOR_FUZZ_EXAMPLES=5000 for a longer hunt than CI's.
PROPERTY = settings(max_examples=int(os.environ.get("ADVISOR_FUZZ_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])


def read_or_error(tmp_path: Path, data: bytes, name: str = "fuzz.json"):
    """(raw, metadata) or the TraceError; any other exception fails the test."""
    try:
        raw, meta, _ = read_bytes(tmp_path, data, name)
    except TraceError as exc:
        one_line(exc)
        return exc
    return raw, meta


@PROPERTY
@given(data=st.data())
def test_cut_off_at_any_byte(tmp_path, data):
    trace = data.draw(traces())
    gz = data.draw(st.booleans())
    if gz:
        compressed = gzip.compress(trace.data)
        cut = data.draw(st.integers(0, len(compressed) - 1))
        path = tmp_path / "cut.json.gz"
        path.write_bytes(compressed[:cut])
        try:
            raw, meta, _ = read(path)
        except TraceError as exc:
            one_line(exc)
            return
        read_so_far = meta["_damage"]["bytes_read"]
    else:
        cut_data, cut = data.draw(truncations(trace))
        result = read_or_error(tmp_path, cut_data)
        if isinstance(result, TraceError):
            assert not any(end <= cut for _, end in trace.spans), "whole events were lost"
            return
        raw, meta = result
        read_so_far = cut
        assert meta["_damage"]["truncated"] is (cut < len(trace.data.rstrip()))
    whole = [e for e, (_, end) in zip(trace.events, trace.spans) if end <= read_so_far]
    assert rows(raw) == expected_rows(whole)
    assert meta["_damage"]["skipped"] == {}


@PROPERTY
@given(data=st.data())
def test_a_flipped_byte_loses_no_other_event(tmp_path, data):
    trace = data.draw(traces())
    flipped, at = data.draw(byte_flips(trace))
    touched = touched_by(trace, at)
    untouched = expected_rows([e for i, e in enumerate(trace.events) if i not in touched])
    result = read_or_error(tmp_path, flipped)
    if isinstance(result, TraceError):
        # Only where the flip broke the document around the event array, or left no event.
        assert not (trace.array[0] < at < trace.array[1]) or not untouched
        return
    raw, _ = result
    assert untouched <= rows(raw)


@PROPERTY
@given(data=st.data())
def test_a_deleted_key(tmp_path, data):
    trace = data.draw(traces())
    events, i, key = data.draw(deleted_keys(trace.events))
    raw, meta = read_or_error(tmp_path, render(events, trace.layout).data)
    before = trace.events[i]
    # A GPU activity that lost its category is recognised by its device and stream, and read.
    recognised = (key == "cat" and before.get("ph") == "X" and before.get("cat") in kineto.CATEGORY_KIND
                  and kineto.CATEGORY_KIND[before["cat"]] in ("kernel", "memcpy", "memset", "sync")
                  and {"device", "stream"} <= set(before.get("args", {})))
    assert rows(raw) == expected_rows(events) | ({(before.get("name") or "", before["ts"])} if recognised else set())
    damage = meta["_damage"]
    lost_ts = key == "ts" and events[i].get("ph") == "X" and events[i].get("cat") in kineto.CATEGORY_KIND
    # Whatever loses its phase, or a complete event its category, is counted once: left out
    # (skipped where it was GPU activity), or repaired.
    counted = key == "ph" or (key == "cat" and before.get("ph") == "X")
    if counted:
        _, whole = read_or_error(tmp_path, trace.data, "whole.json")

        def said(record: dict) -> int:
            return sum(sum(record.get(kind, {}).values()) for kind in ("skipped", "dropped", "ignored", "repaired"))

        assert said(damage) == said(whole["_damage"]) + 1, (damage, whole["_damage"])
        assert damage["repaired"] == ({kineto.REPAIRED_GPU: 1} if recognised else {})
    else:
        assert damage["skipped"] == ({"missing ts": 1} if lost_ts else {})


@PROPERTY
@given(data=st.data())
def test_a_value_of_the_wrong_type(tmp_path, data):
    trace = data.draw(traces())
    events, i, _key, _value = data.draw(wrong_types(trace.events))
    result = read_or_error(tmp_path, render(events, trace.layout).data)
    assert not isinstance(result, TraceError)
    raw, meta = result
    others = expected_rows([e for j, e in enumerate(events) if j != i])
    assert others <= rows(raw)
    assert len(rows(raw) - others) <= 1
    assert sum(meta["_damage"]["skipped"].values()) <= 1
    ts = raw["ts"].to_numpy()
    assert all(math.isfinite(t) for t in ts)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_whole_importer_on_mutations(tmp_path, data):
    """load(): the reader, the session's columns and attribution, on any of the mutations."""
    trace = data.draw(traces())
    mutation = data.draw(st.sampled_from(["cut", "flip", "delete", "type"]))
    if mutation == "cut":
        mutated, _ = data.draw(truncations(trace))
    elif mutation == "flip":
        mutated, _ = data.draw(byte_flips(trace))
    elif mutation == "delete":
        mutated = render(data.draw(deleted_keys(trace.events))[0], trace.layout).data
    else:
        mutated = render(data.draw(wrong_types(trace.events))[0], trace.layout).data
    session = load_or_one_line(tmp_path / "fuzz.json", mutated, 30)
    if session is None:
        return
    ev = session.events
    assert (ev["end_ns"].to_numpy() >= ev["start_ns"].to_numpy()).all()
    assert isinstance(session.meta.trace_metadata["damage"], dict)


# -- properties over damage to the real traces: all the way to the report ----------------

_REAL = "bert_small_infer_h100.json.gz"


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("ADVISOR_FUZZ_EXAMPLES", "12")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_a_damaged_real_trace_gives_a_valid_report_or_one_line(tmp_path, data):
    """A real trace damaged anywhere: no traceback, no hang; either one line, or a report
    valid against its schema that says what the reader skipped or where the file ended."""
    from advisor.reports import build_report, render_json
    from advisor.reports.schema import validate_report
    from advisor.rules import run_rules
    from advisor.tables import TABLE_DOCS, compute_tables

    original = gzip.decompress(shared_trace(_REAL).read_bytes())
    mutated, how = data.draw(damaged_bytes(original))
    session = load_or_one_line(tmp_path / "damaged.json", mutated, 60)
    if session is None:
        return
    tables = compute_tables(session)
    result = run_rules(session, tables)
    report = json.loads(render_json(build_report(session, tables, result.findings, table_docs=TABLE_DOCS,
                                                 skipped=result.skipped)))
    validate_report(report)
    assert not result.errors, result.errors
    if how == "cut" and len(mutated) < len(original.rstrip()):
        assert session.meta.trace_metadata["damage"]["truncated"]
        assert report["findings"][0]["rule"] == "profile-incomplete"


# -- damaged metadata and repeated steps: the trace is read, the field is what is lost ----


def _steps_trace(steps: int = 3) -> list[dict]:
    out = []
    for n in range(1, steps + 1):
        start = n * 1000
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                    "ts": start, "dur": 900})
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": start + 10, "dur": 50,
                    "args": {"External id": n}})
        out.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": start + 100, "dur": 40,
                    "args": {"device": 0, "stream": 7, "correlation": n, "External id": n}})
    return out


@pytest.mark.parametrize(("top", "check"), [
    ({"deviceProperties": [{"id": "0", "name": "NVIDIA A100", "computeMajor": "8", "computeMinor": None}]},
     lambda s: [(d.name, d.compute_capability) for d in s.meta.devices if d.id == 0] == [("NVIDIA A100", None)]),
    ({"deviceProperties": [{"id": "0x", "name": "NVIDIA A100"}]},
     lambda s: [d.name for d in s.meta.devices if d.id == 0] == ["GPU 0"]),
    ({"deviceProperties": [{"id": None, "name": "NVIDIA A100"}]},
     lambda s: [d.name for d in s.meta.devices if d.id == 0] == ["GPU 0"]),
    ({"deviceProperties": "not a list"}, lambda s: any(d.id == 0 for d in s.meta.devices)),
    ({"distributedInfo": {"rank": "a", "world_size": "2", "backend": "nccl"}},
     lambda s: (s.meta.distributed.rank, s.meta.distributed.world_size) == (0, 2)),
    ({"distributedInfo": {"rank": -3, "world_size": None}},
     lambda s: (s.meta.distributed.rank, s.meta.distributed.world_size) == (0, 1)),
], ids=["device id as text", "device id not a number", "device id null", "device list not a list", "rank as text", "rank negative"])
def test_a_damaged_metadata_field_loses_that_field_not_the_trace(tmp_path, top, check):
    from builders import write_trace

    session = load(write_trace(tmp_path / "t.json", _steps_trace(), **top))
    assert check(session)
    assert (session.events["kind"] == "kernel").sum() == 3


def test_a_step_recorded_twice_gives_every_table(tmp_path):
    from builders import write_trace

    from advisor.rules import run_rules
    from advisor.tables import compute_tables

    events = _steps_trace()
    # ProfilerStep#3 again: a second record of it (its own External id), not a copy of the
    # same record, which the reader reads once.
    events.append({**events[-3], "args": {"External id": 99}})
    session = load(write_trace(tmp_path / "t.json", events))
    tables = compute_tables(session)
    assert list(tables["step_gpu"].index[:4]) == ["step 1", "step 2", "step 3", "step 3#1"]
    assert not run_rules(session, tables).errors
