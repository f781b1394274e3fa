"""A large plain trace read in parts by forked processes (advisor.importers.parts) gives
what one process reading it gives: the same frame, metadata, process names, damage and
progress, wherever the parts are cut."""

from __future__ import annotations

import gzip
import json
import functools
import multiprocessing
from pathlib import Path

import pandas as pd
import pytest
from builders import synth_trace

from advisor.importers import kineto, parts
from advisor.importers.kineto import open_trace, read_events

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="reading in parts needs fork")


@pytest.fixture
def small_parts(monkeypatch, processes):
    """Parts of a few tens of KB, so small traces are read in several, each in chunks."""
    monkeypatch.setattr(parts, "PART_MIN_BYTES", 16 << 10)
    monkeypatch.setattr(kineto, "BLOCK", 4 << 10)
    processes(4)


def _read(path: Path, monkeypatch, processes: int, progress=None):
    monkeypatch.setenv("ADVISOR_PROCESSES", str(processes))  # with small_parts, which lets advisor fork
    stream = open_trace(path)
    try:
        return read_events(stream, path, progress=progress, in_parts=functools.partial(parts.read_in_parts, processes=processes)
                           if processes > 1 else None)
    finally:
        stream.close()


def _same(one, other):
    frame, metadata, names = one
    frame2, metadata2, names2 = other
    pd.testing.assert_frame_equal(frame, frame2)
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.CategoricalDtype):
            assert list(frame[column].cat.categories) == list(frame2[column].cat.categories), column
    assert metadata == metadata2
    assert names == names2


def _forks(monkeypatch) -> list[int]:
    """Records the starts of the parts read by processes of their own."""
    started: list[int] = []
    real = parts._fork

    def fork(reader, start, *args):
        started.append(start)
        return real(reader, start, *args)

    monkeypatch.setattr(parts, "_fork", fork)
    return started


def _read_on(monkeypatch) -> list[int]:
    """Records each time the parts were dropped and the file read again in one process."""
    calls: list[int] = []
    real = kineto.EventReader.run

    def run(self):
        if self.read_rest is None:  # read again in one process
            calls.append(1)
        return real(self)

    monkeypatch.setattr(kineto.EventReader, "run", run)
    return calls


def test_a_training_trace_read_in_parts_equals_one_read(tmp_path, small_parts, monkeypatch):
    path = tmp_path / "trace.json"
    synth_trace(path, 20_000)
    started = _forks(monkeypatch)
    heard = []
    in_parts = _read(path, monkeypatch, 4, progress=lambda done, total, events=0: heard.append((done, events)))
    assert len(started) == 3  # the first part read here, three by processes of their own
    assert heard[-1][0] == path.stat().st_size and heard[-1][1] >= len(in_parts[0])
    assert [d for d, _ in heard] == sorted(d for d, _ in heard)
    _same(_read(path, monkeypatch, 1), in_parts)


def _event(i: int, **extra) -> dict:
    event = {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": float(i), "dur": 0.5,
             "args": {"External id": i}}
    event.update(extra)
    return event


def test_labels_large_ids_and_names_first_seen_in_later_parts(tmp_path, small_parts, monkeypatch):
    events = [_event(i) for i in range(2000)]
    events += [_event(i, tid=f"stream label {'xyz'[i % 3]}", pid="host", args={"External id": 2**64 + i % 5})
               for i in range(2000, 3000)]
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]
    events += [_event(i, tid="other", args={"correlation": 2**65 + i % 3}) for i in range(3000, 4000)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0}], "after": [1, 2]}))
    started = _forks(monkeypatch)
    read_on = _read_on(monkeypatch)
    in_parts = _read(path, monkeypatch, 4)
    assert len(started) == 3 and read_on == [1]  # numbered in order of first sight: read again
    one = _read(path, monkeypatch, 1)
    _same(one, in_parts)
    assert in_parts[1]["after"] == [1, 2]
    assert in_parts[1]["_damage"]["repaired"]["integer past int64"] == 2000


def test_a_cut_inside_a_string_reads_on_in_one_process(tmp_path, small_parts, monkeypatch):
    tricky = "x" * 3000 + '},{"ph": "X", "name": "inside a name"},{' + "y" * 3000
    events = [_event(i) for i in range(1500)] + [_event(1500, name=tricky)] + [_event(i) for i in range(1501, 3000)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    data = path.read_bytes()
    inside = data.index(b'},{\\"ph\\": \\"X\\"') + 2  # the '{' of a cut inside the long name
    monkeypatch.setattr(parts, "_part_starts", lambda reader, head, processes: [inside])
    started = _forks(monkeypatch)
    read_on = _read_on(monkeypatch)
    in_parts = _read(path, monkeypatch, 2)
    assert started == [inside] and read_on == [1]
    one = _read(path, monkeypatch, 1)
    _same(one, in_parts)
    assert in_parts[1]["_damage"]["skipped"] == {}
    assert tricky in set(in_parts[0]["name"].astype(str))


def test_damage_in_a_later_part_is_read_again_in_one_process(tmp_path, small_parts, monkeypatch):
    """Which pieces around damage are recovered depends on where chunks start, so a
    damaged file is read again by one process: the same rows and the same counts."""
    events = [_event(i) for i in range(3000)]
    text = json.dumps({"traceEvents": events})
    # One event whose ts is text, one that is not JSON.
    text = text.replace('"ts": 2100.0', '"ts": "soon"').replace('"pid": 1, "tid": 1, "ts": 2500.0',
                                                                  '"pid": 1 "tid": 1, "ts": 2500.0')
    path = tmp_path / "trace.json"
    path.write_text(text)
    started = _forks(monkeypatch)
    read_on = _read_on(monkeypatch)
    in_parts = _read(path, monkeypatch, 4)
    assert len(started) >= 2 and read_on == [1]
    one = _read(path, monkeypatch, 1)
    _same(one, in_parts)
    assert in_parts[1]["_damage"]["skipped"] == {"unparseable": 1, "wrong type": 1}


def test_a_file_cut_off_is_read_in_parts_and_told_truncated(tmp_path, small_parts, monkeypatch):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [_event(i) for i in range(3000)]})[:-2000])
    started = _forks(monkeypatch)
    read_on = _read_on(monkeypatch)
    in_parts = _read(path, monkeypatch, 4)
    assert len(started) >= 2 and read_on == []
    _same(_read(path, monkeypatch, 1), in_parts)
    assert in_parts[1]["_damage"]["truncated"] and len(in_parts[0]) > 2900


def test_many_lists_of_objects_before_the_arrays_end(tmp_path, monkeypatch):
    """Each of these events ends '}]}' like the array does: the array's end is found past
    all of them (thousands in the file's last chunk) however the file is cut, and nothing
    is called damaged."""
    monkeypatch.setattr(parts, "PART_MIN_BYTES", 64 << 10)
    events = [_event(i) for i in range(2000)] + [_event(i, args={"o": [{"a": i}]}) for i in range(2000, 4000)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, "traceName": "after"}, indent=1))
    in_parts = _read(path, monkeypatch, 4)
    _same(_read(path, monkeypatch, 1), in_parts)
    assert len(in_parts[0]) == 4000 and in_parts[1]["traceName"] == "after"
    assert in_parts[1]["_damage"]["skipped"] == {} and not in_parts[1]["_damage"]["truncated"]


def test_a_part_whose_process_fails_is_read_here(tmp_path, small_parts, monkeypatch):
    path = tmp_path / "trace.json"
    synth_trace(path, 10_000)

    def fails(*args):
        raise MemoryError

    monkeypatch.setattr(parts, "_read_part", fails)
    started = _forks(monkeypatch)
    read_on = _read_on(monkeypatch)
    in_parts = _read(path, monkeypatch, 3)
    assert len(started) == 2 and read_on == [1]
    _same(_read(path, monkeypatch, 1), in_parts)


def test_gzipped_and_small_traces_are_read_in_one_process(tmp_path, monkeypatch):
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as out:
        out.write(json.dumps({"traceEvents": [_event(i) for i in range(3000)]}))
    monkeypatch.setattr(parts, "PART_MIN_BYTES", 1 << 10)
    started = _forks(monkeypatch)
    _read(path, monkeypatch, 4)
    plain = tmp_path / "small.json"
    plain.write_text(json.dumps({"traceEvents": [_event(i) for i in range(100)]}))
    monkeypatch.setattr(parts, "PART_MIN_BYTES", 32 << 20)
    _read(plain, monkeypatch, 4)
    assert started == []


def test_a_stream_that_is_not_the_file_is_read_in_one_process(tmp_path, small_parts, monkeypatch):
    """read_events given bytes from elsewhere (a stream, with a path for messages) reads
    that stream; the parts would read the file at the path."""
    import io

    path = tmp_path / "trace.json"
    synth_trace(path, 10_000)
    other = json.dumps({"traceEvents": [_event(i) for i in range(50)]}).encode()
    started = _forks(monkeypatch)
    frame, _, _ = read_events(io.BytesIO(other), path, in_parts=functools.partial(parts.read_in_parts, processes=4))
    assert started == [] and len(frame) == 50
