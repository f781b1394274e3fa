"""The session cache: a trace's Session kept for the next command on the same file, and
never a reason for a command to fail or to read a changed file wrongly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, write_trace

from advisor.importers import cache, load, loader


def events(kernels: int) -> list[dict]:
    out = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}]
    for i in range(kernels):
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 + 20 * i, "dur": 15})
    return out


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(folder))
    monkeypatch.delenv("ADVISOR_NO_CACHE", raising=False)
    return folder


def test_the_second_load_of_a_trace_reads_the_cache_not_the_trace(tmp_path, cache_dir, monkeypatch):
    trace = write_trace(tmp_path / "t.json", events(5))
    first = load(trace)
    assert len(list(cache_dir.iterdir())) == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("the trace was read again")

    monkeypatch.setattr(loader, "load_kineto", no_reading)
    second = load(trace)
    assert second.events.equals(first.events) and second.meta.source == first.meta.source


def test_a_changed_trace_is_read_again(tmp_path, cache_dir):
    trace = write_trace(tmp_path / "t.json", events(5))
    assert (load(trace).events["name"] == "aten::mm").sum() == 5
    write_trace(trace, events(7))
    os.utime(trace, ns=(1, 1))  # even with its old time stamp wiped, the contents differ
    assert (load(trace).events["name"] == "aten::mm").sum() == 7


def test_no_cache_keeps_nothing(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("ADVISOR_NO_CACHE", "1")
    load(write_trace(tmp_path / "t.json", events(3)))
    assert not cache_dir.exists()


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
