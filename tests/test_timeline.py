"""`advisor timeline`: the session as Chrome-trace JSON with the findings marked, read back
by advisor's own importer with the same events, to the nanosecond."""

from __future__ import annotations

import gzip
import io
import json

import pytest
from conftest import shared_trace
from report_samples import NASTY, sample_parts, sample_session

from advisor.cli import main
from advisor.importers import load
from advisor.reports.perfetto import (
    FINDING_CATEGORY,
    PHASE_CATEGORY,
    flatten_findings,
    write_timeline,
)
from advisor.rules import run_rules
from advisor.tables import compute_tables


def _read(path):
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    session, _, findings = sample_parts()
    path = write_timeline(session, findings, tmp_path_factory.mktemp("timeline") / "trace.json")
    return session, findings, path, _read(path)


def _kinds(session):
    return session.events["kind"].astype(str).value_counts().to_dict()


def test_the_file_is_chrome_trace_json(exported):
    _, _, _, doc = exported
    events = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms" and isinstance(doc["baseTimeNanoseconds"], int)
    assert {e["ph"] for e in events} == {"X", "i", "M"}
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0
    names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert ("process_name", "GPU 0 (NVIDIA A100-SXM4-40GB)") in names
    assert ("process_name", "advisor findings") in names
    assert any(e["ph"] == "M" and e["args"].get("name") == "stream 7" for e in events)


def test_it_reads_back_with_the_same_events_to_the_nanosecond(exported):
    session, _, path, _ = exported
    again = load(path)
    assert _kinds(again) == _kinds(session)
    assert again.meta.trace_metadata["skipped_events"] == sum(
        1 for e in _read(path)["traceEvents"] if e["ph"] == "X" and e["cat"] in (FINDING_CATEGORY, PHASE_CATEGORY))
    base = int(session.events["start_ns"].min())
    for kind in ("kernel", "op", "runtime", "step", "phase"):
        a = session.events[session.events["kind"] == kind].sort_values(["start_ns", "name"])
        b = again.events[again.events["kind"] == kind].sort_values(["start_ns", "name"])
        assert (a["start_ns"].to_numpy() - base == b["start_ns"].to_numpy()).all(), kind
        assert (a["end_ns"].to_numpy() - base == b["end_ns"].to_numpy()).all(), kind
        assert a["name"].astype(str).tolist() == b["name"].astype(str).tolist(), kind
    assert again.meta.base_time_ns == session.meta.base_time_ns + base
    # The tables come out the same, GPU work still tied to its op, step and phase.
    before, after = compute_tables(session), compute_tables(again)
    for name in ("model", "kernel", "operator", "gpu_idle"):
        cols = [c for c in before[name].columns if c.endswith("_ns") or c == "calls"]
        assert before[name][cols].equals(after[name][cols]), name


def test_sub_microsecond_times_survive(tmp_path):
    session = sample_session()
    ev = session.events
    kernel = ev.index[ev["kind"] == "kernel"][0]
    ev.loc[kernel, "end_ns"] = ev.loc[kernel, "start_ns"] + 400  # a 400 ns kernel
    ev.loc[kernel, "start_ns"] += 7  # starting 7 ns after a whole microsecond
    ev.loc[kernel, "end_ns"] += 7
    text = gzip.decompress(write_timeline(session, [], tmp_path / "t.json.gz").read_bytes()).decode()
    assert '"dur":0.400' in text
    again = load(tmp_path / "t.json.gz")
    kernels = again.events[again.events["kind"] == "kernel"]
    assert (kernels["end_ns"] - kernels["start_ns"]).min() == 400
    assert ((kernels["start_ns"] % 1000) == 7).any()


def test_findings_are_spans_and_marks_on_the_events_they_cite(exported):
    session, findings, _, doc = exported
    events = doc["traceEvents"]
    labelled = flatten_findings(findings)
    spans = [e for e in events if e["ph"] == "X" and e["cat"] == FINDING_CATEGORY]
    assert [e["name"].split(".", 1)[0] for e in spans] == [label.split(".")[0] for label, _ in labelled]
    assert len(spans) == len(labelled) and len({e["tid"] for e in spans}) == len(spans)
    nasty = next(e for e in spans if e["args"]["rule"] == "sample-rule")
    assert nasty["args"]["severity"] == "medium" and NASTY in nasty["args"]["message"]
    assert any(NASTY in line for line in nasty["args"]["evidence"])
    # The cited kernel carries the finding and gets an instant mark at its start.
    cited = next(ev for f in findings for ev in f.evidence if ev.kind == "event")
    row = session.events.loc[cited.event_id]
    kernel = [e for e in events if e["ph"] == "X" and e["name"] == NASTY and "advisor findings" in e["args"]]
    assert len(kernel) == 1 and "A <b>kernel</b> named with markup" in kernel[0]["args"]["advisor findings"][0]
    marks = [e for e in events if e["ph"] == "i"]
    assert len(marks) == 1 and marks[0]["s"] == "t"
    assert (marks[0]["pid"], marks[0]["tid"], marks[0]["ts"]) == (kernel[0]["pid"], kernel[0]["tid"], kernel[0]["ts"])
    assert int(row["device"]) == kernel[0]["args"]["device"]


def test_inferred_phases_get_a_track_of_their_own(tmp_path):
    # A trace without advisor's phase ranges: the importer infers them from the step.
    session = load(shared_trace("resnet50_v100_num_workers_0.pt.trace.json.gz"))
    tables = compute_tables(session)
    findings = run_rules(session, tables).findings
    path = write_timeline(session, findings, tmp_path / "resnet.json.gz")
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    doc = _read(path)
    phases = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == PHASE_CATEGORY]
    assert len(phases) == int((session.events["kind"] == "phase").sum()) == 36
    assert len({(e["pid"], e["tid"]) for e in phases}) == 1
    again = load(path)
    assert _kinds(again) == _kinds(session)
    assert int((again.events["kind"] == "kernel").sum()) == 8772
    assert [f.rule for f in run_rules(again, compute_tables(again)).findings] == [f.rule for f in findings]
    # The pageable copies the sync finding cites are marked where they ran.
    marks = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    rank = [f.rule for f in findings].index("sync-memcpy-stall") + 1
    assert len(marks) == 3 and all(e["name"].startswith(f"advisor {rank}: ") for e in marks)


def test_an_empty_session_writes_an_empty_trace(tmp_path):
    session = sample_session(steps=0)
    doc = _read(write_timeline(session, [], tmp_path / "empty.json"))
    assert doc["traceEvents"] == []


def test_cli_writes_the_timeline(tmp_path, capsys):
    folder = sample_session().save(tmp_path / "session")
    out = tmp_path / "out" / "trace.json.gz"
    assert main(["timeline", str(folder), "-o", str(out)]) == 0
    assert "timeline written" in capsys.readouterr().err
    assert int((load(out).events["kind"] == "kernel").sum()) == 6


def test_cli_needs_an_output(tmp_path, capsys):
    folder = sample_session().save(tmp_path / "session")
    assert main(["timeline", str(folder)]) == 2
    assert "timeline needs -o PATH" in capsys.readouterr().err


def test_cli_asks_for_one_rank_of_a_job(tmp_path, capsys):
    job = tmp_path / "job"
    for rank in (0, 1):
        sample_session().save(job / f"rank-{rank}")
    out = tmp_path / "trace.json.gz"
    assert main(["timeline", str(job), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is a job of 2 ranks: pass one of them" in err
    assert str(job / "rank-0") in err and not out.exists()
    assert main(["timeline", str(job / "rank-1"), "-o", str(out)]) == 0


# -- progress while reading and writing ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_reading_a_trace_reports_its_progress_in_bytes(tmp_path, name):
    path = write_timeline(sample_session(), [], tmp_path / name)
    heard: list[tuple[int, int]] = []
    load(path, progress=lambda done, total: heard.append((done, total)))
    size = path.stat().st_size
    assert heard and all(total == size for _, total in heard)
    assert [d for d, _ in heard] == sorted(d for d, _ in heard) and heard[-1][0] == size


def test_reading_a_trace_reports_the_events_parsed_to_a_callable_that_asks(tmp_path):
    path = write_timeline(sample_session(), [], tmp_path / "trace.json")
    heard: list[int] = []
    session = load(path, progress=lambda done, total, events: heard.append(events))
    assert heard == sorted(heard) and 0 < heard[-1] >= len(session.events) - 1


def test_the_progress_bar_shows_bytes_and_events(monkeypatch):
    from rich.console import Console

    from advisor.cli import progress

    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    monkeypatch.setattr(progress, "_console", lambda: console)
    with progress.progress_bar("Reading t.json", unit="bytes", show=True) as update:
        update(1024 * 1024, 2 * 1024 * 1024, events=23456)
    text = console.file.getvalue()  # the bar as drawn before it was cleared away
    assert "Reading t.json" in text and "1.0/2.1 MB" in text and "23,456 events" in text


def test_writing_a_timeline_reports_its_progress(tmp_path):
    heard: list[tuple[int, int]] = []
    write_timeline(sample_session(), [], tmp_path / "t.json", progress=lambda d, t: heard.append((d, t)))
    events = len(sample_session().events)
    assert heard[-1] == (events, events)


def test_progress_bars_only_on_a_terminal():
    from advisor.cli.progress import progress_bar, spinner

    with progress_bar("reading") as update:  # pytest's stderr is no terminal
        assert update is None
    with progress_bar("reading", unit="bytes", show=True) as update:
        update(10, 100)
        update(100, 100)
    with spinner("working", show=True):
        pass
