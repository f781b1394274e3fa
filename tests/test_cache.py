"""The session cache: a trace's Session kept for the next command on the same file, and
never a reason for a command to fail or to read a changed file wrongly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from builders import write_trace
from conftest import REPO

from advisor.importers import cache, load, loader
from advisor.step import build_step_model


def steady_of(session):
    """The session as its step model judges it."""
    return build_step_model(session).session


def events(kernels: int) -> list[dict]:
    out = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}]
    for i in range(kernels):
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 + 20 * i, "dur": 15})
    return out


def test_the_second_load_of_a_trace_reads_the_cache_not_the_trace(tmp_path, cache_dir, monkeypatch):
    trace = write_trace(tmp_path / "t.json", events(5))
    first = load(trace)
    assert len(list(cache_dir.iterdir())) == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("the trace was read again")

    monkeypatch.setattr(loader, "load_kineto", no_reading)
    second = load(trace)
    assert second.events.equals(first.events) and second.meta.source == first.meta.source


def test_a_cached_session_names_the_path_it_was_reached_by(tmp_path, cache_dir, monkeypatch):
    trace = write_trace(tmp_path / "t.json", events(5))
    assert load(trace).meta.source == str(trace)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loader, "load_kineto", lambda *a, **k: pytest.fail("the trace was read again"))
    again = load("t.json")  # the same file, spelled from here: served from the cache
    assert again.meta.source == "t.json"


def test_a_changed_trace_is_read_again(tmp_path, cache_dir):
    trace = write_trace(tmp_path / "t.json", events(5))
    assert (load(trace).events["name"] == "aten::mm").sum() == 5
    write_trace(trace, events(7))
    os.utime(trace, ns=(1, 1))  # even with its old time stamp wiped, the contents differ
    assert (load(trace).events["name"] == "aten::mm").sum() == 7


def test_a_session_kept_by_another_reader_is_read_again(tmp_path, cache_dir, monkeypatch):
    """An edited reader or attribution (advisor.importers, advisor.session) misses: the same
    version number holds Sessions that differ (a frame let go, ids renumbered)."""
    trace = write_trace(tmp_path / "t.json", events(5))
    load(trace)
    assert cache.holds(trace)
    monkeypatch.setattr(cache, "reading_fingerprint", lambda: "another reader")
    assert not cache.holds(trace) and cache.cached(trace) is None


def test_no_cache_keeps_nothing(tmp_path, cache_dir, monkeypatch):
    trace = write_trace(tmp_path / "t.json", events(3))
    load(trace, use_cache=False)
    assert not cache_dir.exists()
    # Below the doors nothing reads the environment: the choice is the caller's parameter.
    monkeypatch.setenv("ADVISOR_NO_CACHE", "1")
    assert not cache.wanted()
    load(trace)
    assert cache.holds(trace)


def test_a_cache_that_cannot_be_written_or_read_is_passed_over(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(blocker / "cache"))
    assert len(load(write_trace(tmp_path / "t.json", events(3))).events) > 0
    # A damaged entry is a miss.
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "c2"))
    trace = write_trace(tmp_path / "u.json", events(3))
    load(trace)
    (entry,) = (tmp_path / "c2").iterdir()
    (entry / "events.parquet").write_bytes(b"garbage")
    assert cache.cached(trace) is None and (load(trace).events["name"] == "aten::mm").sum() == 3


def test_least_recently_used_entries_go_past_the_size_limit(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE_MAX_MB", "0.000001")
    for i in range(3):
        load(write_trace(tmp_path / f"t{i}.json", events(3 + i)))
    assert len([p for p in cache_dir.iterdir() if not p.name.startswith(".")]) <= 1


def test_the_cli_reports_the_same_from_the_cache_and_says_no_cache_when_asked(tmp_path, cache_dir):
    trace = write_trace(tmp_path / "t.json", events(4))
    env = {**os.environ}

    def diagnose(*extra):
        done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", str(trace), "--format", "json", *extra],
                              capture_output=True, text=True, cwd=REPO, env=env, check=False)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        report.pop("generated")
        return report

    first = diagnose()
    assert len(list(cache_dir.iterdir())) == 1
    assert diagnose() == first
    for entry in cache_dir.iterdir():
        for part in entry.iterdir():
            part.unlink()
        entry.rmdir()
    assert diagnose("--no-cache") == first and not list(cache_dir.iterdir())


def _counting_compute(calls: list):
    from advisor.tables import compute_tables

    def compute(session, names=None):
        calls.append(names)
        return compute_tables(session, names)

    return compute


def test_the_tables_of_a_cached_session_are_kept_beside_it(tmp_path, cache_dir):
    trace = write_trace(tmp_path / "t.json", events(6))
    calls: list = []
    first = cache.tables(load(trace), _counting_compute(calls), read_from=trace)
    again = cache.tables(load(trace), _counting_compute(calls), read_from=trace)
    assert calls == [None]  # computed once, then read
    assert set(again) == set(first) and all(again[n].equals(first[n]) for n in first)
    assert again["operator"].attrs == first["operator"].attrs  # the documentation and notes travel too
    assert list(cache.tables(load(trace), _counting_compute(calls), ["model"], read_from=trace)) == ["model"] and calls == [None]
    # What the command sees differently is another key: a --gpu target, a start-up step left out.
    retargeted = load(trace)
    retargeted.meta = retargeted.meta.model_copy(update={"target_gpu": "a100-sxm4-80gb"})
    cache.tables(retargeted, _counting_compute(calls), read_from=trace)
    assert calls == [None, None]
    slow_start = write_trace(tmp_path / "s.json", [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": start,
         "dur": took} for n, (start, took) in enumerate([(0, 6000), (6000, 1000), (7000, 1000), (8000, 1000)], 1)])
    whole, steady = load(slow_start), steady_of(load(slow_start))
    assert steady.window() != whole.window()
    def steps(session) -> int:
        return cache.tables(session, _counting_compute(calls), read_from=slow_start)["model"].at["ProfileStep", "calls"]

    # The tables are the steady window's whichever session they are asked of (compute_tables
    # applies the step model); the two sessions' metadata differ (the steady one says what it
    # set apart), so each has its own entry, and asking the steady one again reads it.
    assert (steps(steady), steps(whole), steps(steady_of(load(slow_start)))) == (3, 3, 3)
    assert calls == [None, None, None, None]
    # A session read afresh with the cache off, or built in memory, is computed every time.
    session = loader.load_kineto(trace)
    cache.tables(session, _counting_compute(calls))
    cache.tables(session, _counting_compute(calls))
    assert calls == [None] * 6
    fresh = write_trace(tmp_path / "fresh.json", events(6))  # no entry: nowhere to keep them
    cache.tables(load(fresh, use_cache=False), _counting_compute(calls), read_from=fresh)
    cache.tables(load(fresh, use_cache=False), _counting_compute(calls), read_from=fresh)
    assert calls == [None] * 8 and not cache.holds(fresh)


def test_edited_code_or_knowledge_misses_and_a_damaged_tables_file_is_computed_again(tmp_path, cache_dir,
                                                                                     monkeypatch):
    trace = write_trace(tmp_path / "t.json", events(4))
    calls: list = []
    cache.tables(load(trace), _counting_compute(calls), read_from=trace)
    monkeypatch.setattr(cache, "code_fingerprint", lambda: "another advisor")
    cache.tables(load(trace), _counting_compute(calls), read_from=trace)
    assert calls == [None, None]
    for kept in cache_dir.glob("*/tables-*.json"):
        kept.write_bytes(kept.read_bytes()[:-20])  # cut short
    assert len(cache.tables(load(trace), _counting_compute(calls), read_from=trace)["model"]) > 0 and len(calls) == 3


def test_no_cache_reaches_a_jobs_worker_processes_as_a_parameter(tmp_path, cache_dir):
    """--no-cache is read once by the command and passed to each rank's reader, in this
    process or a pool's (no environment variable carries it)."""
    from test_job import write_job

    from advisor.cli import main

    job = write_job(tmp_path / "job", 2, {})
    assert main(["diagnose", str(job), "--workers", "2", "--no-cache", "-f", "json", "-o", str(tmp_path / "a.json")]) == 0
    assert not cache_dir.exists() and "ADVISOR_NO_CACHE" not in os.environ
    assert main(["diagnose", str(job), "--workers", "2", "-f", "json", "-o", str(tmp_path / "b.json")]) == 0
    assert all(cache.holds(trace) for trace in job.glob("rank*.json"))
