"""Advice that holds on a busy machine: workers sized from the cores the job may use (its
affinity and cgroup quota), never from other processes' load at the moment; CPU work that
waited for a core told from waiting on data; a note where the run itself was starved."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO

from advisor.collect import cores
from advisor.collect.assemble import _busy_machine

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"
# Only against a run that hangs, never short enough for a busy machine to fail it.
HANG_GUARD_S = 1800
linux_only = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")


@linux_only
def test_the_usable_cores_follow_the_affinity():
    # In a child: the test process keeps its own affinity.
    code = textwrap.dedent("""
        import os
        from advisor.collect.cores import usable_cores
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        print(usable_cores())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert float(out.stdout) == 1.0


def test_the_usable_cores_follow_a_cgroup_quota(tmp_path, monkeypatch):
    quota = tmp_path / "cpu.max"
    quota.write_text("50000 100000\n")  # half a core, as `docker run --cpus 0.5` sets it
    monkeypatch.setattr(cores, "_CGROUP_V2", quota)
    assert cores.usable_cores() == 0.5
    quota.write_text("max 100000\n")  # no quota: the affinity decides
    assert cores.usable_cores() == float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                         else os.cpu_count())


def _spin(cpu_seconds: float) -> None:
    """Spin until this thread has had ``cpu_seconds`` of a core: judged in CPU time, so a
    busy machine stretches how long it takes, never how much work it is."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


@linux_only
def test_run_delay_counts_the_wait_for_a_core():
    delay = cores.RunDelay()
    if delay.read() is None:
        pytest.skip("this kernel does not count a thread's run-queue wait (/proc/.../schedstat)")
    core = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    # A process pinned to the same core takes half of it while this thread spins; it spins
    # until it is stopped, so it is there for all of this thread's spin however long the
    # machine's other work makes that.
    rival = multiprocessing.get_context("fork").Process(target=_spin, args=(math.inf,))
    try:
        rival.start()
        os.sched_setaffinity(rival.pid, {core})
        began = delay.read()
        _spin(0.6)
        waited = delay.read() - began
    finally:
        os.sched_setaffinity(0, before)
        rival.kill()
        rival.join()
        delay.close()
    assert waited > 50_000_000, f"waited {waited} ns for a core shared with a spinning process"
    assert delay.read() is None  # closed


def test_a_run_that_waited_for_cores_says_so():
    note = _busy_machine({"wall_ns": 10_000_000_000, "run_delay_ns": 2_300_000_000})
    assert "busy" in note and "23%" in note
    assert _busy_machine({"wall_ns": 10_000_000_000, "run_delay_ns": 500_000_000}) == ""
    assert _busy_machine({}) == ""


def test_a_busy_run_with_operator_threads_says_which_way_its_shares_lean():
    """Other processes slow a team of operator threads far more than plain Python: a busy
    run's note says the Python work's shares are likely understated, and how to measure."""
    wait = {"wall_ns": 10_000_000_000, "run_delay_ns": 7_800_000_000}
    note = _busy_machine(wait, threads=4)
    assert "78%" in note and "4 threads" in note and "smaller here than on a quiet machine" in note
    assert "advisor verify" in note
    assert "threads" not in _busy_machine(wait, threads=1)  # one thread: nothing leans
    # Where the operators were timed again at one thread, the step was weighed as on a quiet machine.
    retimed = {"ops": [{"name": "aten::mm"}] * 12, "covered_share": 0.97}
    note = _busy_machine(wait, threads=4, retimed=retimed)
    assert "12 kinds of operator call (97%" in note and "weighed as on a quiet machine" in note
    assert "smaller here" not in note


# The loader's "file read": long beside what a busy machine adds to each item (the wait for
# a core after every sleep, a few ms with a rival on each core and one more busy), so the
# item is mostly waiting however busy the machine, as the test means it to be. At 2 ms (the
# example's default) that wait alone made the sleeping loader look CPU-bound with one core
# busy. Eight items a batch keep the step near the default's length.
LOADER = ["--steps", "12", "--item-delay-ms", "20", "--batch-size", "8"]


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2


def _diagnose(tmp_path, name: str, rivals: int) -> dict:
    """advisor diagnose examples/starved_loader.py, with ``rivals`` processes spinning on
    every core meanwhile."""
    out = tmp_path / f"{name}.json"
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(rivals)]
    try:
        subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--format", "json", "-o", str(out),
                        str(EXAMPLES / "starved_loader.py"), *LOADER],
                       check=True, cwd=REPO, capture_output=True, timeout=HANG_GUARD_S)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return json.loads(out.read_text())


def test_a_waiting_loader_gets_the_same_advice_on_a_busy_machine(tmp_path):
    """The loader sleeps most of each item (a file read): it overlaps the step without a
    free core, so two processes spinning on the cores change nothing of the advice."""
    quiet = _diagnose(tmp_path, "quiet", 0)
    busy = _diagnose(tmp_path, "busy", max(2, _usable_cores()))
    top = [report["findings"][0] for report in (quiet, busy)]
    assert [f["rule"] for f in top] == ["dataloader-starvation"] * 2
    assert top[0]["severity"] == top[1]["severity"] == "high"
    # The same advice: as many workers, give or take the quarter by which the loader's
    # measured CPU share moves between two runs (7 against 8); the busy machine's failure
    # was one worker against four, and a saving of zero.
    quiet_workers, busy_workers = (int(f["metrics"]["advice"].partition("=")[2]) for f in top)
    assert 0.75 * quiet_workers <= busy_workers <= quiet_workers / 0.75, (quiet_workers, busy_workers)
    assert top[0]["metrics"]["job_cores"] == top[1]["metrics"]["job_cores"]
    assert top[1]["saving"]["ms_per_step"] > 0.5 * top[0]["saving"]["ms_per_step"]
    for finding in top:  # sleeping is waiting, whoever holds the cores
        assert finding["metrics"]["fetch_cpu_demand"] < 0.5
        assert not math.isnan(finding["metrics"]["job_cores"])
