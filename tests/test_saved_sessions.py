"""A saved session is read back as the profile that was saved, or refused in one line that
names what is wrong: a column edited into another type is never coerced, a value out of
range never reaches the tables, a folder laid out otherwise is not read as one
(advisor.session.saved)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from builders import write_trace

from advisor.cli import main
from advisor.errors import SessionError
from advisor.importers import load
from advisor.session import Session

CASES = Path(__file__).resolve().parents[1] / "cases"


def _trace_events(steps: int = 4) -> list[dict]:
    """Steps of an op that launches a kernel: rows that point at other rows (launch,
    parent_op, top_op)."""
    events = []
    for i in range(steps):
        t = i * 1000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1, "ts": t,
             "dur": 1000},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10, "dur": 500},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 20,
             "dur": 10, "args": {"correlation": 100 + i}},
            {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": t + 40, "dur": 300,
             "args": {"device": 0, "stream": 7, "correlation": 100 + i}},
        ]
    return events


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("saved")
    trace = write_trace(folder / "t.json", _trace_events())
    return load(trace).save(folder / "session")


@pytest.fixture
def copy(saved, tmp_path):
    """A copy of the saved session to edit."""
    def make(name: str = "edited") -> Path:
        return Path(shutil.copytree(saved, tmp_path / name))
    return make


def _one_line(argv: list[str], capsys) -> str:
    code = main(argv)
    said = capsys.readouterr()
    assert code != 0, said.out[-300:]
    assert "Traceback" not in said.err and "internal error" not in said.err, said.err
    lines = said.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advisor: "), said.err
    return lines[0]


def _edit_events(folder: Path, change) -> None:
    events = pd.read_parquet(folder / "events.parquet")
    changed = change(events)
    (changed if changed is not None else events).to_parquet(folder / "events.parquet", index=False)


def _rows(events: pd.DataFrame, kind: str) -> np.ndarray:
    return (events["kind"].astype(str) == kind).to_numpy()


def _start_as_text(e):
    e["start_ns"] = e["start_ns"].astype(str)
    e.loc[_rows(e, "op"), "start_ns"] = "soon"


def _ends_before_it_starts(e):
    e.loc[_rows(e, "kernel"), "end_ns"] = e.loc[_rows(e, "kernel"), "start_ns"] - 1_000_000


def _kind_dropped(e):
    return e.drop(columns=["kind"])


def _int64_minimum_start(e):
    e.loc[0, "start_ns"] = np.iinfo(np.int64).min


def _op_index_out_of_range(e):
    e.loc[_rows(e, "kernel"), "parent_op"] = 10**9
    e.loc[_rows(e, "kernel"), "top_op"] = 10**9


def _launch_negative(e):
    e.loc[_rows(e, "kernel"), "launch"] = -7


def _unknown_kind(e):
    e["kind"] = e["kind"].astype(str)
    e.loc[_rows(e, "kernel"), "kind"] = "teleport"


def _step_with_fractions(e):
    e["step"] = e["step"].astype("float64") + 0.5


def _device_missing(e):
    e["device"] = e["device"].astype("Int64")
    e.loc[_rows(e, "kernel"), "device"] = pd.NA


def _flops_infinite(e):
    e.loc[_rows(e, "kernel"), "flops"] = np.inf


EDITS = {
    "start times as text": (_start_as_text, "column 'start_ns' holds text, not whole numbers"),
    "a range that ends before it starts": (_ends_before_it_starts, "(kernel) ends before it starts"),
    "kind dropped": (_kind_dropped, "it has no 'kind' column"),
    "a start at the int64 minimum": (_int64_minimum_start, "start_ns -9223372036854775808 is out of range"),
    "an op index out of range": (_op_index_out_of_range, "parent_op 1000000000 points at no row"),
    "a launch below -1": (_launch_negative, "launch -7 points at no row"),
    "an unknown kind": (_unknown_kind, "kind 'teleport' is not a kind of event"),
    "steps with fractions": (_step_with_fractions, "column 'step' holds numbers with fractions, not whole numbers"),
    "a device missing": (_device_missing, "column 'device' has missing values"),
    "infinite flops": (_flops_infinite, "flops inf is not a count"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_column_is_refused_not_coerced(copy, capsys, edit):
    change, said = EDITS[edit]
    folder = copy()
    _edit_events(folder, change)
    with pytest.raises(SessionError, match="events.parquet"):
        Session.load(folder)
    line = _one_line(["diagnose", str(folder), "--format", "json"], capsys)
    assert f"{folder / 'events.parquet'}" in line and said in line, line


@pytest.mark.parametrize("command", [["summary", "{s}", "--table", "kernel"], ["timeline", "{s}", "-o", "{out}"],
                                     ["compare", "{s}", "{s}"]], ids=["kernel table", "timeline", "compare"])
@pytest.mark.parametrize("edit", ["a start at the int64 minimum", "an op index out of range"])
def test_values_that_broke_the_tables_are_refused_on_reading(copy, capsys, tmp_path, command, edit):
    folder = copy()
    _edit_events(folder, EDITS[edit][0])
    argv = [word.replace("{s}", str(folder)).replace("{out}", str(tmp_path / "t.json")) for word in command]
    assert EDITS[edit][1] in _one_line(argv, capsys)


def test_metadata_nested_100000_deep_is_refused_in_one_line(copy, capsys):
    folder = copy()
    meta = json.loads((folder / "session.json").read_text())
    meta["trace_metadata"]["deep"] = "DEEP"
    (folder / "session.json").write_text(json.dumps(meta).replace('"DEEP"', "[" * 100_000 + "]" * 100_000))
    line = _one_line(["diagnose", str(folder)], capsys)
    assert "session.json is damaged: values nested more than 64 deep" in line


def test_a_folder_named_events_parquet_is_not_read_as_a_dataset(copy, capsys):
    folder = copy()
    events = folder / "events.parquet"
    data = events.read_bytes()
    events.unlink()
    events.mkdir()
    for part in ("a.parquet", "b.parquet"):  # the same events twice, once per file
        (events / part).write_bytes(data)
    assert "events.parquet is a folder" in _one_line(["diagnose", str(folder)], capsys)


def test_missing_or_special_events_files_are_named(copy, capsys):
    folder = copy("missing")
    (folder / "events.parquet").unlink()
    assert "has no events.parquet" in _one_line(["diagnose", str(folder)], capsys)
    folder = copy("fifo")
    (folder / "events.parquet").unlink()
    os.mkfifo(folder / "events.parquet")
    assert "events.parquet is a FIFO" in _one_line(["diagnose", str(folder)], capsys)


def test_an_honest_session_reads_back_as_it_was_saved(saved):
    again = Session.load(saved)
    events = pd.read_parquet(saved / "events.parquet")
    for column in ("start_ns", "end_ns", "launch", "parent_op", "top_op", "device", "step"):
        np.testing.assert_array_equal(again.events[column].to_numpy(), events[column].to_numpy())
    assert list(again.events["kind"].astype(str)) == list(events["kind"].astype(str))


def test_recorded_sessions_still_read(tmp_path):
    """The recorded cases, stack samples whose sampler's clock made their span negative
    among them (gpu_odd_gemm), are what advisor wrote: all read."""
    folders = sorted(p.parent for p in CASES.glob("*/session/**/events.parquet"))
    assert folders
    for folder in folders:
        Session.load(folder)


def test_a_trace_whose_metadata_holds_a_lone_surrogate_is_saved_and_read_back(tmp_path, capsys):
    trace = tmp_path / "t.json"
    text = json.dumps({"traceEvents": _trace_events(), "comment": "DAMAGED"})
    trace.write_text(text.replace('"DAMAGED"', '"half a pair \\ud800"'))
    folder = tmp_path / "session"
    assert main(["diagnose", str(trace), "--save", str(folder), "--format", "json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    comment = Session.load(folder).meta.trace_metadata["comment"]
    assert comment.startswith("half a pair \ufffd") and comment.encode("utf-8")  # replaced, as every writer needs


def test_a_trace_event_far_from_the_rest_is_skipped_and_the_session_reads_back(tmp_path, capsys):
    """An event 158 years after the rest (5e15 us, inside what int64 ns hold) is damage: the
    reader skips it and says so, and the session saved from the trace reads back."""
    events = _trace_events()
    events[-1]["ts"] = 5e15
    trace = write_trace(tmp_path / "t.json", events)
    folder = tmp_path / "session"
    assert main(["diagnose", str(trace), "--save", str(folder), "--format", "json"]) == 0
    capsys.readouterr()
    session = Session.load(folder)
    assert session.events["start_ns"].max() < 10**15
    assert any("more than 30 days from the rest" in note for note in session.meta.collector.notes)


# -- a saved job ----------------------------------------------------------------------------------


@pytest.fixture
def saved_job(tmp_path, capsys) -> Path:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        write_trace(ranks / f"rank{rank}.json", _trace_events())
    job = tmp_path / "job"
    assert main(["diagnose", str(ranks), "--save", str(job), "--format", "json", "--workers", "1"]) == 0
    capsys.readouterr()
    return job


def test_a_saved_job_whose_two_ranks_name_one_folder_is_refused(saved_job, capsys):
    manifest = json.loads((saved_job / "job.json").read_text())
    manifest["ranks"][1]["session"] = manifest["ranks"][0]["session"]
    (saved_job / "job.json").write_text(json.dumps(manifest))
    line = _one_line(["diagnose", str(saved_job)], capsys)
    assert "job.json is not a valid job manifest: ranks 0 and 1 name the same session folder" in line


def test_a_saved_job_whose_rank_folder_links_to_another_rank_s_is_refused(saved_job, capsys):
    manifest = json.loads((saved_job / "job.json").read_text())
    first, second = (saved_job / entry["session"] for entry in manifest["ranks"])
    shutil.rmtree(second)
    second.symlink_to(first.name)
    assert "name the same session folder" in _one_line(["diagnose", str(saved_job)], capsys)
