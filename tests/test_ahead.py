"""A trace read ahead by a forked process while the command starts up
(advisor.importers.ahead) is the trace read here, and a command that ends without the
interpreter's teardown (advisor.cli.console_main) has written and flushed everything."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from builders import synth_trace

from advisor.errors import TraceError
from advisor.importers import ahead, cache, loader
from advisor.importers.forked import processes_allowed

pytestmark = [pytest.mark.slow, pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                                  reason="a second process is forked")]


@pytest.fixture
def two(monkeypatch, tmp_path, processes):
    processes(2)
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """A gzipped training-loop trace of about 20 k events."""
    plain = synth_trace(tmp_path_factory.mktemp("ahead") / "loop.json", 20_000)
    packed = plain.with_suffix(".json.gz")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    return packed


def _same_session(one, other):
    pd.testing.assert_frame_equal(one.events, other.events)
    # Everything but when each was read.
    assert one.meta.model_dump(exclude={"created"}) == other.meta.model_dump(exclude={"created"})


def test_a_trace_read_ahead_is_the_trace_read_here(two, trace):
    started = ahead.start(trace, processes=processes_allowed())
    assert started is not None
    heard = []
    got = loader.load(trace, ahead=started, progress=lambda done, total, events=None: heard.append((done, events)))
    _same_session(got, loader.load_kineto(trace))
    assert heard and heard[-1][0] == trace.stat().st_size  # the forked read's progress, to its end
    assert heard[-1][1] > 0


def test_no_read_ahead_where_it_does_not_pay(two, trace, tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_PROCESSES", "1")
    assert ahead.start(trace, processes=processes_allowed()) is None  # one process allowed
    monkeypatch.setenv("ADVISOR_PROCESSES", "2")
    monkeypatch.setattr(ahead, "MAX_BYTES", 1 << 20)
    assert ahead.start(trace, processes=processes_allowed()) is None  # more JSON than a read ahead holds (the gzip trailer's size)
    plain = tmp_path / "big.json"
    plain.write_bytes(b" " * (2 << 20))
    assert ahead.start(plain, processes=processes_allowed()) is None  # likewise, a plain file
    monkeypatch.setattr(ahead, "MAX_BYTES", 128 << 20)
    cache.store(trace, loader.load_kineto(trace))
    assert ahead.start(trace, processes=processes_allowed()) is None  # the cache holds it: loading that is this process's work


def test_a_failed_read_ahead_is_read_again_here(two, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [1, 2, 3]}')
    with pytest.raises(TraceError) as here:
        loader.load_kineto(broken)
    started = ahead.start(broken, processes=processes_allowed())
    assert started is not None
    with pytest.raises(TraceError) as read_ahead:
        loader.load(broken, ahead=started)
    assert str(read_ahead.value) == str(here.value)


def test_a_read_ahead_stopped_leaves_no_process(two, trace):
    started = ahead.start(trace, processes=processes_allowed())
    process = started._child._process
    started.stop()
    assert not process.is_alive()
    started.stop()  # twice is harmless


def _env(**more: str) -> dict[str, str]:
    """The environment of an `advisor` run, its standard output buffered as usual (the
    flush before the end is part of what is tested)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    return {**env, "ADVISOR_NO_PROGRESS": "1", **more}


def test_the_command_ends_with_everything_written(tmp_path, trace):
    """`advisor` ends a trace's diagnosis without the interpreter's teardown: the report on
    standard output is whole, the file written, the exit code the command's."""
    env = _env(ADVISOR_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--format", "json", str(trace)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["findings"]
    from advisor.cli import main

    out = tmp_path / "report.json"
    assert main(["diagnose", "--format", "json", "-o", str(out), str(trace)]) == 0
    again = json.loads(out.read_text())
    report.pop("generated"), again.pop("generated")
    assert report == again
    failed = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--fail-on", "low", str(trace)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert failed.returncode == 3, failed.stderr


def test_a_script_keeps_the_interpreters_teardown(tmp_path):
    """A script run under advisor may leave a file open: the normal exit flushes it."""
    script = tmp_path / "leaves_open.py"
    note = tmp_path / "note.txt"
    # Held past the script's own end (its globals go with it), until the interpreter's teardown.
    script.write_text(f"import sys\nsys.left_open = open({str(note)!r}, 'w')\nsys.left_open.write('written at exit')\n")
    done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--collector", "host", "--format", "json",
                           "-o", str(tmp_path / "r.json"), str(script)], capture_output=True, text=True,
                          env=_env(ADVISOR_NO_CACHE="1"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert note.read_text() == "written at exit"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device every write to fails")
@pytest.mark.parametrize("command", [["summary", "-t", "device", "-f", "csv"], ["diagnose", "--format", "json"]])
def test_output_that_cannot_be_written_is_an_error_not_a_quiet_exit(tmp_path, trace, command):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "advisor", *command, "--no-cache", str(trace)], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=_env(), timeout=300)
    assert done.returncode != 0
    (line,) = [line for line in done.stderr.splitlines() if line]
    assert line.startswith("advisor: ") and "No space left on device" in line


def test_compare_reads_both_traces_ahead(two, trace, tmp_path, monkeypatch, processes):
    other = synth_trace(tmp_path / "other.json", 8_000)
    started = []
    real = ahead.start
    monkeypatch.setattr(ahead, "start", lambda path, **kw: started.append(path.name) or real(path, **kw))
    from advisor.cli import main

    out = tmp_path / "both.json"
    assert main(["compare", str(trace), str(other), "--no-cache", "--format", "json", "-o", str(out)]) == 0
    assert started == [trace.name, other.name]
    processes(1)
    alone = tmp_path / "alone.json"
    assert main(["compare", str(trace), str(other), "--no-cache", "--format", "json", "-o", str(alone)]) == 0
    assert json.loads(out.read_text()) == json.loads(alone.read_text())


def test_a_command_that_stops_first_leaves_no_read_running(two, trace, tmp_path):
    """A read ahead whose Session is never taken (a bad rule pack stops the command after
    the read began) is stopped before `main` returns."""
    from advisor.cli import main

    assert main(["diagnose", str(trace), "--no-cache", "--rules", str(tmp_path / "missing.yaml")]) != 0
    assert multiprocessing.active_children() == []
