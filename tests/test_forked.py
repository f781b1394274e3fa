"""advisor.importers.forked: work done in a forked process comes back as it would here: its result,
its warnings said by this process, nothing where it failed; and it cannot hang on this
process's standard streams."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import warnings

import numpy as np
import pytest
from builders import synth_trace

from advisor.importers.forked import Forked, processes_allowed

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="the work is done in a forked process")


def test_the_result_comes_back_with_its_arrays():
    values = np.arange(1_000_000)
    child = Forked.start(lambda: {"sum": int(values.sum()), "twice": values * 2})
    result = child.result()
    assert result["sum"] == int(values.sum())
    assert (result["twice"] == values * 2).all() and result["twice"].flags.writeable


def test_a_failure_gives_nothing():
    assert Forked.start(lambda: 1 / 0).result() is None


def test_its_warnings_are_said_here():
    def work():
        warnings.warn("a column held no values", RuntimeWarning, stacklevel=1)
        return 7

    child = Forked.start(work)
    with pytest.warns(RuntimeWarning, match="a column held no values"):
        assert child.result() == 7


def test_it_writes_past_a_stream_whose_lock_was_held_at_the_fork(monkeypatch):
    """A progress display's stream proxy, its lock held by the display's thread when the
    process forked: the forked process's writes go to the descriptor, not through it."""
    held, taken, done = threading.Lock(), threading.Event(), threading.Event()

    class Proxy:
        def write(self, text):
            with held:
                return len(text)

        def flush(self):
            pass

    def display():  # holds the lock across the fork, as a refresh might
        with held:
            taken.set()
            done.wait(60)

    monkeypatch.setattr(sys, "stderr", Proxy())
    monkeypatch.setattr(sys, "stdout", Proxy())
    thread = threading.Thread(target=display, daemon=True)
    thread.start()
    taken.wait(10)
    try:
        def work():
            print("written by the forked process", file=sys.stderr, flush=True)
            warnings.warn("and warned", UserWarning, stacklevel=1)
            return "done"

        child = Forked.start(work)
        arrived = child._receive.poll(30)
        if not arrived:
            child.stop()
        assert arrived, "the forked process hung on the parent's stream"
    finally:
        done.set()
        thread.join()
    with pytest.warns(UserWarning, match="and warned"):
        assert child.result() == "done"


def test_a_users_process_is_never_forked(monkeypatch, tmp_path):
    """Only a command asks how many processes it may use; a library call reads in one."""
    import advisor.importers.forked
    from advisor.importers import load, parts

    monkeypatch.setenv("ADVISOR_PROCESSES", "4")
    assert processes_allowed() == 4
    monkeypatch.setenv("ADVISOR_PROCESSES", "1")
    assert processes_allowed() == 1
    monkeypatch.setenv("ADVISOR_PROCESSES", "4")
    monkeypatch.setattr(parts, "PART_MIN_BYTES", 1 << 10)
    forks = []
    monkeypatch.setattr(advisor.importers.forked.Forked, "start", classmethod(lambda cls, work: forks.append(1)))
    trace = synth_trace(tmp_path / "t.json", 2_000)
    load(trace, use_cache=False)
    assert forks == []  # the default: this process alone, whatever the environment says
    load(trace, processes=4, use_cache=False)
    assert forks  # asked for: the parts after the first go to forked processes
