"""A diagnosis of a script stops the script once it has what it needs (the recorded window
and the steps timed after it), cleanly; --run-to-end runs it whole; verify's runs die with
the process that started them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from advisor.collect.steps import EnoughSteps, StopAfter
from advisor.verify import processes

REPO = Path(__file__).resolve().parents[1]


def test_it_stops_by_count_after_the_window():
    stop = StopAfter(steps=10, seconds=1e9)
    assert not any(stop.enough(n) for n in range(7, 17))  # 0..9 steps timed after the window
    assert stop.enough(17) and stop.after(17) == 10


def test_it_stops_by_time_once_a_few_steps_are_in(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("advisor.collect.steps.time.monotonic", lambda: now[0])
    stop = StopAfter(steps=1000, seconds=60, min_steps=5)
    assert not stop.enough(7)
    now[0] += 61
    assert not stop.enough(9)  # two steps: fewer than min_steps
    assert stop.enough(12)


def test_a_distributed_job_stops_by_count_alone(monkeypatch):
    """Its ranks must stop at the same step: a rank stopped by its own clock would leave
    the others waiting in a collective."""
    now = [0.0]
    monkeypatch.setattr("advisor.collect.steps.time.monotonic", lambda: now[0])
    stop = StopAfter(steps=50, seconds=1, distributed=lambda: True)
    stop.enough(7)
    now[0] += 100
    assert not stop.enough(20)
    assert stop.enough(57)


def test_the_stop_is_not_an_error_the_script_catches():
    assert not issubclass(EnoughSteps, Exception)


ENDLESS = textwrap.dedent("""
    import torch
    from torch import nn
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    step = 0
    try:
        while True:
            try:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            except Exception:  # the script's own error handling does not swallow advisor's stop
                pass
            step += 1
            if step >= LIMIT:
                break
    finally:
        print(f"endless: {step} steps")
""")


def _diagnose(tmp_path: Path, limit: int, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "endless.py"
    script.write_text(ENDLESS.replace("LIMIT", str(limit)))
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "-f", "json", "-o", str(out), *extra,
                           str(script)], capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
                          env={**os.environ, "ADVISOR_NO_PROGRESS": "1"})
    return done, json.loads(out.read_text())


@pytest.mark.slow
def test_a_script_that_never_ends_is_stopped_once_its_steps_are_in(tmp_path):
    done, report = _diagnose(tmp_path, 10**12)
    assert done.returncode == 0, done.stderr
    assert "endless: 307 steps" in done.stdout  # its finally ran: two warm-up, five recorded, 300 timed
    notes = report["session"]["collector"]["notes"]
    assert any("advisor stopped the script at step 307" in n and "--run-to-end" in n for n in notes)
    assert report["session"]["steps"]["unrecorded_steps"] >= 290


@pytest.mark.slow
def test_run_to_end_runs_it_whole(tmp_path):
    done, report = _diagnose(tmp_path, 400, "--run-to-end")
    assert done.returncode == 0, done.stderr
    assert "endless: 400 steps" in done.stdout
    assert not any("advisor stopped" in n for n in report["session"]["collector"]["notes"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_run_dies_with_the_process_that_started_it(tmp_path):
    """A parent killed outright (SIGKILL: no clean-up of its own runs) takes its run with it."""
    pid_file = tmp_path / "pid"
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        from advisor.verify import processes
        child = processes.start([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)
    """)
    runner = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the parent never started its run"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(child):
            assert time.monotonic() < deadline, "the run outlived the process that started it"
            time.sleep(0.1)
    finally:
        runner.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for init to reap it is gone for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_start_arms_the_signal_only_on_linux():
    assert (processes._dies_with_parent(signal.SIGKILL) is not None) == sys.platform.startswith("linux")


def test_what_stopping_the_recording_cost_is_said(tmp_path):
    """torch.profiler processes what it recorded as the window closes: time the script
    spends between two steps, in no step's figure; where it is worth a note, it is said."""
    from advisor.collect.assemble import _recording_stop_note

    assert "took the script 0.9 s" in _recording_stop_note({"recording": {"stop_s": 0.9}})
    assert _recording_stop_note({"recording": {"stop_s": 0.01}}) == ""
    assert _recording_stop_note({}) == ""
