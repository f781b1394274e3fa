"""Shared test fixtures: where the real traces are, the slow marker, the cache the tests use,
and the list at the end of a run of the suites that skipped and how to run them.

The builders of sessions and traces are in tests/builders.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
from collections import defaultdict
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


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: an end-to-end run (a script, a job, the fuzzer); "
                                       "`pytest -m 'not slow'` leaves them out")


# The longest tests (a minute to three each on two cores), started first: two processes
# (-n 2) then end on short tests together, rather than one waiting out the fuzzer alone.
LONGEST_FIRST = ("test_fuzz.py::test_every_kind_of_hostile_input_is_a_report_or_one_line",
                 "test_verify.py::test_verify_measures_the_starved_loaders_fix_inside_its_range",
                 "test_job.py::test_torchrun_under_advisor_profiles_every_rank_and_names_the_straggler",
                 "test_busy_machine.py::test_a_waiting_loader_gets_the_same_advice_on_a_busy_machine",
                 "test_job.py::test_ranks_a_script_spawns_itself_are_profiled_as_a_job",
                 "test_job.py::test_a_rank_that_crashes_loses_nothing_the_others_collected",
                 "test_tables.py::test_properties")


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.rpartition("/")[2], len(first)))  # stable: the rest as collected


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
    """Each test starts with the cache on, whatever the environment the suite runs in."""
    monkeypatch.delenv("ADVISOR_NO_CACHE", raising=False)


@pytest.fixture(autouse=True)
def _code_as_it_is_now():
    """Each test fingerprints advisor's code afresh. The fingerprint names cache entries and
    kept reports, and a process works it out once (advisor.importers.cache.code_fingerprint):
    without this, a file of advisor's edited while the suite runs leaves the tests' process on
    the old name while every advisor process a test starts uses the new one, and a report kept
    by one is never found by the other."""
    cache = sys.modules.get("advisor.importers.cache")
    if cache is not None:
        cache.code_fingerprint.cache_clear()


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


# -- the suites that skipped, and how to run them ----------------------------------------------------

# A group of tests that skip where something is missing from the machine: its name, a pattern
# its skip reasons match, and what runs it. Listed at the end of every run that skipped any.
SKIP_GROUPS = [
    ("real traces", r"shared/traces|real trace",
     f"put the real traces in {SHARED_TRACES} (../shared/traces beside the checkout)"),
    ("real Nsight Compute output", r"shared/gpu/ncu",
     f"put the ncu output in {REPO.parent / 'shared' / 'gpu' / 'ncu'} (../shared/gpu/ncu beside the checkout)"),
    ("browser", r"[Ss]elenium|Chromium",
     "pip install -e '.[dev]' and apt-get install chromium chromium-driver (bash .ci/run does both)"),
    ("cupti-python", r"cupti-python", "bash .ci/run (it makes .ci/venvs/cupti12 and .ci/venvs/cupti13)"),
    ("MCP", r"MCP SDK", "pip install -e '.[mcp]'"),
    ("torch", r"\btorch\b.*(not installed|could not import|No module)|No module named 'torch'",
     "pip install torch==2.13.0 (the CPU build, as .ci/run installs it)"),
    ("root", r"needs root", "run the suite as root (in a container, as CI does)"),
    ("no-GPU paths", r"this machine has (CUDA|a GPU)", "run on a machine without CUDA (as CI does)"),
    ("GPU", r"GPU|CUDA", "run on a machine with an NVIDIA GPU and a CUDA build of torch"),
]


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest's own summary: each group of skipped tests, how many, why, and what
    runs them, so a suite that did not run says so where the run ends."""
    try:
        return (yield)
    finally:
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for report in terminalreporter.stats.get("skipped", []):
            reason = _skip_reason(report)
            name, how = next(((name, how) for name, pattern, how in SKIP_GROUPS if re.search(pattern, reason)),
                             (reason, "give the test what its reason says is missing"))
            groups[name, how].append((report, reason))
        if groups:
            terminalreporter.write_sep("=", "skipped suites, and how to run them")
            for (name, how), reports in sorted(groups.items(), key=lambda item: -len(item[1])):
                files = sorted({r.nodeid.split("::")[0] for r, _ in reports})
                tests = sum(1 for r, _ in reports if "::" in r.nodeid)
                whole = len(reports) - tests
                counted = ", ".join(part for part in (f"{tests} test{'s' if tests != 1 else ''}" if tests else "",
                                                      f"{whole} whole file{'s' if whole != 1 else ''}" if whole else "")
                                    if part)
                terminalreporter.write_line(f"{name}: {counted} skipped, in {', '.join(files)}")
                reasons = sorted({reason for _, reason in reports})
                if reasons != [name]:
                    terminalreporter.write_line(f"    why: {reasons[0]}" + (f" (and {len(reasons) - 1} more like it)"
                                                                            if len(reasons) > 1 else ""))
                terminalreporter.write_line(f"    to run them: {how}")
