"""Shared test fixtures: where the real traces are, the slow marker, the cache the tests use.

The builders of sessions and traces are in tests/builders.py."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from builders import REPO, write_trace

SHARED_TRACES = REPO.parent / "shared" / "traces"

# The tests' session cache (advisor.importers.cache) is their own, not the user's
# ~/.cache/advisor; advisor processes the tests start inherit it.
_CACHE = tempfile.mkdtemp(prefix="advisor-test-cache-")
os.environ["ADVISOR_CACHE_DIR"] = _CACHE
os.environ.pop("ADVISOR_NO_CACHE", None)
# The native op recorder (advisor.collect.native) is built once for the whole run, into a
# folder of the tests' own.
_NATIVE = tempfile.mkdtemp(prefix="advisor-test-native-")
os.environ["ADVISOR_NATIVE_DIR"] = _NATIVE


# A shell starts background jobs with Ctrl-C ignored, and processes inherit that; the tests
# of what advisor does on Ctrl-C (here and in the processes they start) need it delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# End-to-end runs (a script, a job, torchrun, the fuzzer, a real trace through a fresh
# process): marked slow, so `pytest -m "not slow"` is the inner loop while CI runs all.
SLOW_MODULES = {"test_job", "test_hostile_inputs", "test_resources", "test_busy_machine", "test_docs_examples",
                "test_examples", "test_collect", "test_fuzz", "test_script_runner", "test_ahead", "test_pages",
                "test_cache_safety", "test_cli", "test_measurement", "test_sampler", "test_browser", "test_doctor",
                "test_cupti_api", "test_gpu_wiring", "test_gc_pause", "test_report_cache", "test_profiler_api"}
SLOW_TESTS = {"test_properties", "test_generated_traces_hold_the_step_model_s_invariants",
              "test_a_damaged_real_trace_gives_a_valid_report_or_one_line"}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: an end-to-end run (a script, a job, the fuzzer); "
                                       "`pytest -m 'not slow'` leaves them out")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rpartition(".")[2] in SLOW_MODULES or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)
    shutil.rmtree(_NATIVE, ignore_errors=True)


def shared_trace(name: str) -> Path:
    """A trace from ../shared/traces, or a skip where that folder is absent."""
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"real trace {name} not available: ../shared/traces is absent on this machine")
    return path


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch):
    """Each test starts with the cache on: a command run in-process (advisor.cli.main) with
    --no-cache sets ADVISOR_NO_CACHE for the processes it starts; undone after its test."""
    monkeypatch.delenv("ADVISOR_NO_CACHE", raising=False)


@pytest.fixture
def processes(monkeypatch):
    """``processes(n)``: advisor's commands may use ``n`` processes for one trace here
    (ADVISOR_PROCESSES, read by advisor.importers.forked.processes_allowed)."""

    def allow(count: int) -> None:
        monkeypatch.setenv("ADVISOR_PROCESSES", str(count))

    return allow


@pytest.fixture
def make_trace(tmp_path):
    def make(events: list[dict], name: str = "trace.json", **top) -> Path:
        return write_trace(tmp_path / name, events, **top)

    return make


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A session cache of the test's own, empty, in use (the suite's shared one set aside)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(folder))  # (on: every test starts with ADVISOR_NO_CACHE unset)
    return folder
