"""Inputs made to break advisor, and what it does with each: one clear line and a non-zero
exit where nothing can be read, a report that says what is wrong where something can,
never a traceback, a hang or an internal error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from builders import one_line, write_trace
from conftest import REPO

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow


def _steps(n: int = 4, name: str = "aten::mm") -> list[dict]:
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
               "ts": i * 1000, "dur": 1000} for i in range(n)]
    events += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": i * 1000 + 10, "dur": 500}
               for i in range(n)]
    return events


def advisor(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=timeout, check=False)


def report_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def rules_of(report: dict) -> list[str]:
    return [f["rule"] for f in report["findings"]]


# -- text the writers cannot take -------------------------------------------------------------


def test_a_lone_surrogate_in_an_event_name_is_replaced_not_fatal(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": _steps()}).replace('"aten::mm"', '"aten::\\ud800mm"', 1))
    done = advisor("diagnose", str(trace), "--format", "json", "--no-cache")
    report_of(done)
    assert "aten::\ufffd" in done.stdout or "aten::\\ufffd" in done.stdout


def test_a_trace_whose_file_name_is_not_utf8(tmp_path):
    trace = write_trace(tmp_path / os.fsdecode(b"r\xe9sum\xe9.json"), _steps())
    for _ in range(2):  # read, then from the cache
        report = report_of(advisor("diagnose", str(trace), "--format", "json"))
        assert report["session"]["source"].endswith("r\ufffdsum\ufffd.json")


def test_a_step_number_past_int64_is_an_annotation_not_an_overflow(tmp_path):
    events = _steps()
    events[0]["name"] = "ProfilerStep#" + "9" * 23
    done = advisor("diagnose", str(write_trace(tmp_path / "t.json", events)), "--format", "json")
    report_of(done)


# -- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["removed", "zero", "one in ten missing"])
def test_a_trace_without_durations_says_its_timing_cannot_be_trusted(tmp_path, how):
    events = _steps(8)
    for i, event in enumerate(events):
        if how == "removed" or (how == "one in ten missing" and i % 10 == 3):
            event.pop("dur")
        elif how == "zero":
            event["dur"] = 0
    report = report_of(advisor("diagnose", str(write_trace(tmp_path / "t.json", events)), "--format", "json"))
    top = report["findings"][0]
    assert top["rule"] == "profile-incomplete" and top["severity"] == "high"
    assert "duration" in top["message"]
    assert "low-gpu-utilization" not in rules_of(report)


# -- special files: refused in one line, never opened -----------------------------------------


@pytest.fixture
def fifo(tmp_path):
    def make(name: str) -> Path:
        path = tmp_path / name
        os.mkfifo(path)
        return path
    return make


def test_a_fifo_named_like_a_trace_is_refused_not_read(fifo):
    line = one_line(advisor("diagnose", str(fifo("t.json")), timeout=60))
    assert "is a FIFO" in line


def test_a_device_is_refused_not_read():
    assert "character device" in one_line(advisor("diagnose", "/dev/zero", timeout=60))


def test_a_fifo_as_a_rule_pack_is_refused(fifo, tmp_path):
    pack = fifo("p.yaml")
    done = advisor("rules", "validate", str(pack), timeout=60)
    assert done.returncode == 1 and "is a FIFO, not a rule pack file" in done.stdout + done.stderr
    trace = write_trace(tmp_path / "t.json", _steps())
    assert "is a FIFO, not a rule pack file" in one_line(advisor("diagnose", str(trace), "--rules", str(pack),
                                                                 timeout=60))


def test_a_fifo_as_the_configuration_is_refused(fifo, tmp_path):
    trace = write_trace(tmp_path / "t.json", _steps())
    line = one_line(advisor("diagnose", str(trace), "--config", str(fifo("advisor.toml")), timeout=60))
    assert "is a FIFO" in line


def test_rank_files_that_are_not_files_are_named_in_the_job(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    for rank in (0, 1):
        write_trace(folder / f"rank{rank}.json", _steps())
    os.mkfifo(folder / "rank2.json")
    (folder / "rank3.json").mkdir()
    (folder / "rank4.json").symlink_to("/dev/zero")
    report = report_of(advisor("diagnose", str(folder), "--format", "json", timeout=120))
    said = json.dumps(report)
    for rank in (2, 3, 4):
        assert f"rank{rank}.json" in said, f"rank{rank}.json is not named"


# -- a saved job's manifest ------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_job_once(tmp_path_factory):
    """A job of two ranks saved by `advisor diagnose --save`, once for the module."""
    root = tmp_path_factory.mktemp("saved-job")
    folder = root / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        write_trace(folder / f"rank{rank}.json", _steps())
    job = root / "job"
    done = advisor("diagnose", str(folder), "--save", str(job), "--format", "json")
    assert done.returncode == 0, done.stderr
    return job


@pytest.fixture
def saved_job(saved_job_once, tmp_path):
    """A copy of the saved job of this test's own, to edit."""
    job = tmp_path / "job"
    shutil.copytree(saved_job_once, job, symlinks=True)
    return job


def _edit(job: Path, change) -> None:
    manifest = json.loads((job / "job.json").read_text())
    change(manifest)
    (job / "job.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("session", ["../../../etc", "/etc", "../other-job/rank-0", "rank-0/../../x", None, 3])
def test_a_job_rank_outside_the_job_folder_is_refused(saved_job, tmp_path, session):
    other = tmp_path / "other-job"
    shutil.copytree(saved_job, other)
    _edit(saved_job, lambda m: m["ranks"][0].update(session=session))
    line = one_line(advisor("diagnose", str(saved_job)))
    assert "job.json is not a valid job manifest" in line
    assert "exist" not in line  # it does not say whether the path is there


@pytest.mark.parametrize("change", [
    lambda m: m["ranks"][0].update(rank=2**64),
    lambda m: m.update(world_size=10**12),
    lambda m: m["ranks"][0].update(rank=-1),
    lambda m: m["ranks"][1].update(rank=m["ranks"][0]["rank"]),
    lambda m: m.update(ranks="all"),
    lambda m: m.update(ranks=[]),
], ids=["rank 2^64", "world 10^12", "negative rank", "a rank twice", "ranks not a list", "no ranks"])
def test_a_job_manifest_out_of_bounds_is_refused(saved_job, change):
    _edit(saved_job, change)
    assert "job.json is not a valid job manifest" in one_line(advisor("diagnose", str(saved_job)))


def test_a_trace_claiming_a_world_of_a_trillion_ranks_is_refused(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        write_trace(folder / f"rank{rank}.json", _steps(),
                    distributedInfo={"backend": "nccl", "rank": rank, "world_size": 10**12})
    assert "past the 1,000,000 ranks" in one_line(advisor("diagnose", str(folder)))


# -- rule packs --------------------------------------------------------------------------------


ENDLESS_PACK = """
pack: endless
version: 1
rules:
  - id: endless-saving
    title: A saving that evaluates to infinity
    severity: low
    table: model
    condition: calls > 0
    saving:
      ns_per_step: cpu_total_ns * 1e308 * 1e308 + 1
      basis: none
    message: "{key}"
    recommendation: Nothing.
    evidence: [calls]
    docs: {what: w, why: y, example: e, instead: i}
"""


def test_a_pack_saving_that_evaluates_to_infinity_turns_that_rule_off_not_the_run(tmp_path):
    pack = tmp_path / "endless.yaml"
    pack.write_text(ENDLESS_PACK)
    assert advisor("rules", "validate", str(pack)).returncode == 0
    trace = write_trace(tmp_path / "t.json", _steps())
    done = advisor("diagnose", str(trace), "--rules", str(pack), "--format", "json")
    report = report_of(done)
    assert "endless-saving" not in rules_of(report)
    assert "rule endless-saving failed and was skipped" in done.stderr and "not a finite number" in done.stderr


# -- output whole or said -------------------------------------------------------------------------


def _limited(size: int):
    """For a child process: files it writes stop at ``size`` bytes (a disk that fills), a
    write past it short, then failing."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


@pytest.mark.parametrize("fmt", ["json", "html"])
def test_a_report_to_stdout_cut_short_by_a_full_disk_is_said(tmp_path, fmt):
    trace = write_trace(tmp_path / "t.json", _steps(40))
    out = tmp_path / f"report.{fmt}"
    with out.open("wb") as handle:
        done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", str(trace), "--format", fmt],
                              stdout=handle, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120,
                              preexec_fn=_limited(4096), check=False)
    assert out.stat().st_size == 4096, "the limit did not cut the report"
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write the report to standard output" in lines[0], done.stderr


# -- signals ------------------------------------------------------------------------------------------


TERMINATED = """
import os, signal, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    if step == 4:
        os.kill(os.getpid(), signal.{signal})
        time.sleep(30)
print("trained")
"""


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_script_stopped_by_a_batch_scheduler_keeps_its_profile(tmp_path, signal_name):
    import signal

    script = tmp_path / "train.py"
    script.write_text(TERMINATED.replace("{signal}", signal_name))
    out = tmp_path / "report.json"
    done = advisor("diagnose", "--format", "json", "-o", str(out), str(script), cwd=tmp_path)
    assert done.returncode == 128 + getattr(signal, signal_name), done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(out.read_text())
    assert report["session"]["script_error"] == f"stopped by {signal_name}"
    assert report["session"]["steps"]["count"] >= 2


def test_bidirectional_controls_in_names_are_shown_escaped_in_html(tmp_path):
    trace = write_trace(tmp_path / "t.json", _steps(name="\u202egnp.exe"))
    done = advisor("diagnose", str(trace), "--format", "html")
    assert done.returncode == 0, done.stderr
    assert "\u202e" not in done.stdout and "\\u202egnp.exe" in done.stdout


# -- a script that fails before it runs its model --------------------------------------------------


@pytest.mark.parametrize("source, code, said", [
    ("import torch\ndef broken(:\n    pass\n", 1, "SyntaxError: invalid syntax"),
    ("import no_such_module_for_advisor\n", 1, "ModuleNotFoundError: No module named 'no_such_module_for_advisor'"),
    ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--data', required=True)\n"
     "parser.parse_args()\n", 2, "SystemExit: 2"),
], ids=["syntax error", "import error", "argparse exit"])
def test_a_script_that_fails_before_its_first_step_is_one_line_with_its_exit_code(tmp_path, source, code, said):
    script = tmp_path / "train.py"
    script.write_text(source)
    done = advisor("diagnose", str(script), cwd=tmp_path)
    assert done.returncode == code
    assert done.stdout == "", "no report of an empty profile"
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"advisor: {script} ended before its first step (exit code {code}: {said}")


STEPLESS_THEN_EXIT_3 = """
import sys, time, torch
w, x = torch.randn(128, 128), torch.randn(32, 128)
began = time.perf_counter()
while time.perf_counter() - began < 0.4:  # the script's model, run without steps
    y = (x @ w).relu()
print(float(y.sum()))
sys.exit(3)
"""


def test_a_script_without_steps_that_ran_its_model_and_exits_3_gets_its_report_and_code_3(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(STEPLESS_THEN_EXIT_3)
    out = tmp_path / "report.json"
    done = advisor("diagnose", "--format", "json", "-o", str(out), str(script), cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "ended before its first step" not in done.stderr
    report = json.loads(out.read_text())
    assert report["session"]["exit_code"] == 3


def test_an_option_after_the_script_that_the_script_refuses_is_said(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    done = advisor("summary", str(script), "--table", "model", cwd=tmp_path)
    assert done.returncode == 2 and "ended before its first step" in done.stderr
    assert "Model Summary" not in done.stdout
    # The one line gives the command with advisor's options before the script.
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"--table went to the script: advisor's options go before it: advisor summary --table model {script}")


def test_advisors_options_after_a_script_that_refuses_them_are_said_with_the_command_that_works(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--steps')\np.parse_args()\n")
    done = advisor("diagnose", str(script), "--steps", "3", "--format", "json", "-o", "r.json", "--no-cache",
                   cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"--format -o --no-cache went to the script: advisor's options go before it: advisor diagnose --format json "
        f"-o r.json --no-cache {script} --steps 3")


GROUPED_PACK = """
pack: grouped
version: 1
rules:
  - id: grouped-pattern
    title: A pattern with a group
    severity: low
    table: operator
    condition: key.str.contains("aten::(mm|addmm)")
    saving:
      ns_per_step: cpu_total_ns / @steps
      basis: the op's time
    message: "{key}"
    recommendation: Nothing.
    evidence: [calls]
    docs: {what: w, why: y, example: e, instead: i}
"""


def test_a_pack_pattern_with_a_group_prints_no_pandas_warning(tmp_path):
    pack = tmp_path / "grouped.yaml"
    pack.write_text(GROUPED_PACK)
    trace = write_trace(tmp_path / "t.json", _steps())
    done = advisor("diagnose", str(trace), "--rules", str(pack), "--format", "json")
    assert "grouped-pattern" in rules_of(report_of(done))
    assert done.stderr == ""


ESCAPES = "aten::mm\x1b]0;window title\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x9b31m"


@pytest.mark.parametrize("command", [
    ["diagnose", "{trace}"], ["diagnose", "{trace}", "--format", "markdown"], ["diagnose", "{trace}", "--format", "html"],
    ["summary", "{trace}", "--table", "operator"], ["compare", "{trace}", "{trace}"],
], ids=["terminal", "markdown", "html", "summary", "compare"])
def test_escape_sequences_in_names_reach_no_reader_as_commands(tmp_path, command):
    """An op named with a window-title, clipboard-write (OSC 52) and clear-screen sequence is
    shown with its control characters escaped, wherever a person or an agent reads it."""
    trace = write_trace(tmp_path / "t.json", _steps(name=ESCAPES))
    done = advisor(*[word.replace("{trace}", str(trace)) for word in command])
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\x9b" not in done.stdout
    if command[0] == "summary" or command[-1] == "html":  # the op's row, its name shown escaped
        assert "\\x1b" in done.stdout
