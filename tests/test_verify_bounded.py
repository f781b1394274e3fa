"""advisor verify stops where it is told to, and a trial ends with its script.

A Ctrl-C or SIGTERM during the diagnosis or the trials stops verify there: the report is
written as far as it got and no trial runs after it. A trial ends when its steps are timed
or its script ends, whatever helpers the script left holding its output, and they end with
it. The scripts log each run; the waits are hang guards only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import REPO

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

HANG_GUARD_S = 600.0

# Starved by its loader (a verifiable finding: more DataLoader workers); each run logs its
# process id when it starts and once it has run nine steps.
STARVED = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
log, steps = sys.argv[1], int(sys.argv[2])
def said(what):
    with open(log, "a") as out:
        out.write(f"{what} {os.getpid()}\\n")
said("started")
class Slow(Dataset):
    def __len__(self):
        return 32 * steps
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(16), i % 4
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=32)):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if step == 8:
        said("ready")
"""


def _lines(log: Path, what: str) -> list[int]:
    if not log.is_file():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith(what + " ")]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _verify(tmp_path: Path, steps: int) -> tuple[subprocess.Popen, Path, Path]:
    script, log, report = tmp_path / "starved.py", tmp_path / "runs.log", tmp_path / "report.json"
    script.write_text(STARVED)
    # Ctrl-C as at a terminal: SIGINT handled, whatever the test runner ignores.
    command = [sys.executable, "-m", "advisor", "verify", "--budget", "600", "--trial-steps", "40", "--format", "json",
               "-o", str(report), "--", str(script), str(log), str(steps)]
    process = subprocess.Popen(command, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                               env={**os.environ, "ADVISOR_NO_PROGRESS": "1", "PYTHONPATH": str(REPO)})
    return process, log, report


def _when(condition, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "hang guard"
        time.sleep(0.1)


def _signal_when(process: subprocess.Popen, ready, signum: int) -> str:
    """Send ``signum`` to verify once ``ready()`` holds; its stderr after it ended."""
    try:
        _when(ready, process)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=HANG_GUARD_S)
    finally:
        if process.poll() is None:
            process.kill()
    return stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_during_the_diagnosis_stops_verify_with_the_diagnosis_reported(tmp_path, signum, code):
    process, log, report = _verify(tmp_path, steps=100_000)  # the diagnosis's run would not end by itself
    stderr = _signal_when(process, lambda: _lines(log, "ready"), signum)
    assert process.returncode == code, stderr
    assert len(_lines(log, "started")) == 1, stderr  # no trial ran the script again
    # (the script's own traceback where Ctrl-C stopped it, as Python shows it; none of advisor's)
    assert "during the diagnosis: no trial runs" in stderr and f'File "{REPO / "advisor"}' not in stderr
    findings = json.loads(report.read_text())["findings"]
    starved = next(f for f in findings if f["rule"] == "dataloader-starvation")
    assert "during the diagnosis, before any trial" in starved["not_verified"]["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_during_the_trials_ends_the_trial_runs_no_other_and_writes_the_report(tmp_path, signum, code):
    process, log, report = _verify(tmp_path, steps=60)
    # (two runs ready: the diagnosis's and the first trial, which is under way)
    stderr = _signal_when(process, lambda: len(_lines(log, "ready")) >= 2, signum)
    assert process.returncode == code, stderr
    started = _lines(log, "started")
    assert len(started) == 2, stderr  # the diagnosis's run and the trial stopped: no other
    assert not _running(started[1])
    assert "during its trials: no further trial runs" in stderr and "Traceback" not in stderr
    findings = json.loads(report.read_text())["findings"]
    starved = next(f for f in findings if f["rule"] == "dataloader-starvation")
    assert starved["verification"] is None and "before this fix's trials were done" in starved["not_verified"]["reason"]


# A script that starts a helper which inherits its output and outlives it.
LEAVES_A_HELPER = """
import subprocess, sys, torch
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open(sys.argv[1], "w") as out:
    out.write(str(helper.pid))
model = torch.nn.Linear(2, 1)
for _ in range(int(sys.argv[2])):
    model(torch.ones(1, 2))
"""


@pytest.mark.parametrize("steps, ended", [(50, "stopped"), (3, "ended")], ids=["steps timed", "script ended"])
def test_a_trial_ends_with_its_script_whatever_helper_holds_its_output(tmp_path, steps, ended):
    from advisor.verify.run import run_trial

    script, helper = tmp_path / "helper.py", tmp_path / "helper.pid"
    script.write_text(LEAVES_A_HELPER)
    # The limit is a hang guard: before, the trial waited it out on the helper's pipe.
    result = run_trial({"script": str(script), "args": [str(helper), str(steps)], "fixes": [],
                        "step_source": "forward", "warmup": 0, "steps": 4}, 180)
    left = _running(int(helper.read_text()))
    if left:  # not to leave it running after a failed test
        os.kill(int(helper.read_text()), signal.SIGKILL)
    assert "error" not in result, result
    assert result["ended"] == ended and len(result["durations_ns"]) == min(steps - 1, 4)
    assert not left


def test_stopping_a_trial_ends_it_and_carries_what_was_measured():
    """A Ctrl-C in a trial: the findings verified before it keep their measure; this one and
    those after it say they were not measured; no trial runs after it."""
    from advisor.findings import Finding, Saving, Severity
    from advisor.verify.fixes import FixPlan
    from advisor.verify.run import Trial, TrialsStopped, verify_findings

    findings = [Finding(rule=rule, title=rule, severity=Severity.high, confidence=0.9,
                        saving=Saving(ms_per_step=10.0, share_of_step=0.5), message="", recommendation="")
                for rule in ("a", "b", "c")]
    trials = [Trial(0, "a", FixPlan("optimizer", {"foreach": True})), Trial(1, "b", FixPlan("zero_grad_set_to_none")),
              Trial(2, "c", FixPlan("optimizer", {"fused": True}))]
    runs = []

    def run(plan, timeout_s):
        runs.append(plan["fixes"])
        if plan["fixes"] and plan["fixes"][0]["name"] == "zero_grad_set_to_none":
            raise KeyboardInterrupt
        return {"durations_ns": [int(20e6 if not plan["fixes"] else 10e6)] * 3}

    with pytest.raises(TrialsStopped) as stopped:
        verify_findings(findings, trials, script="x.py", args=[], step_source=None, warmup=0, steps=3, budget_s=600,
                        say=lambda line: None, run=run)
    out = stopped.value.findings
    assert out[0].verification is not None and out[0].verification.measured_saving_ms_per_step == pytest.approx(10)
    for finding in out[1:]:
        assert "interrupted (Ctrl-C) before this fix's trials were done" in finding.not_verified.reason
    assert isinstance(stopped.value.interrupt, KeyboardInterrupt)
    assert not any(fixes and fixes[0]["name"] == "optimizer" and fixes[0]["settings"].get("fused") for fixes in runs)
