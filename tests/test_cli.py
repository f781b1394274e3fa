"""The `advisor` command as a user types it.

Where the process itself is what is tested (its exit code, what reaches stderr, a real
SIGINT) the command runs as ``python -m advisor``; elsewhere ``advisor.cli.main(argv)``
runs in this process, which is the same code without the start-up cost. Reports are made
from the saved sessions in cases/ wherever running a script is not the point; the few
scripts here are written into tmp_path and train a tiny model for three steps.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.cli import FAIL_ON_EXIT, main
from advisor.reports.schema import validate_report
from advisor.rules import builtin_specs

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "cases"
STARVED = CASES / "cpu_starved_loader" / "session"
# No built-in rule finds anything here (its problem is the example pack's slow-user-region).
NO_FINDING = CASES / "cpu_validate_every_step" / "session"

# A tiny training loop: three steps of a linear model fed by a DataLoader, then ENDING
# in the third step's body (so two steps are whole and the third is cut off).
TRAIN = """\
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 8), torch.randint(0, 2, (24,)))
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(DataLoader(data, batch_size=8)):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step == 2:
            {ending}
    print("trained")


main()
"""
RAISE = 'raise ValueError("bad batch")'
EXIT = "sys.exit(3)"
INTERRUPT = "os.kill(os.getpid(), signal.SIGINT); time.sleep(30)"


def train_script(folder: Path, ending: str = "pass", name: str = "train.py") -> Path:
    path = folder / name
    path.write_text(TRAIN.replace("{ending}", ending))
    return path


def advisor(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m advisor ARGS`` in a new process."""
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, check=False)


def error_line(stderr: str) -> str:
    """The one ``advisor: ...`` line of a bad-input run. Nothing else may be on stderr but an
    argparse usage line (argparse's own option errors print one before their message)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    ours = [line for line in lines if line.startswith("advisor")]
    assert len(ours) == 1 and lines[-1] == ours[0], stderr
    rest = lines[:-1]
    assert not rest or (rest[0].startswith("usage:") and all(r.startswith(" ") for r in rest[1:])), stderr
    # advisor's own errors, or argparse's (which name the subcommand): "advisor diagnose: error: ..."
    assert ours[0].startswith(("advisor:", "advisor diagnose: error:", "advisor summary: error:")), stderr
    return ours[0]


def run_main(argv: list[str]) -> int:
    """main(argv), with argparse's own exits turned into their exit code."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def findings_of(report: dict) -> list[tuple[str, str, float]]:
    """(rule, severity, ms saved per step) of every finding, nested ones included."""
    out = []
    for finding in report["findings"]:
        out.append((finding["rule"], finding["severity"], finding["saving"]["ms_per_step"]))
        out.extend(findings_of({"findings": finding.get("explains") or []}))
    return out


@pytest.fixture
def trace(make_trace) -> Path:
    """A small Kineto trace: two ProfilerStep ranges with an op each."""
    events = []
    for i in range(2):
        start = 1_000 + i * 1_000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "ts": start,
                       "dur": 900, "pid": 1, "tid": 1})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": start + 100, "dur": 500,
                       "pid": 1, "tid": 1, "args": {"Input Dims": [[8, 8], [8, 8]]}})
    return make_trace(events)


# -- bad input: one line, a non-zero exit, no traceback ------------------------------------


def _bad_inputs(tmp_path: Path, trace: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, a word the error line must contain)."""
    truncated = tmp_path / "truncated.json"  # cut before its first event: nothing to salvage
    truncated.write_bytes(trace.read_bytes()[:20])
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    binary = tmp_path / "binary.json"
    binary.write_bytes(bytes(range(256)) * 16)
    wrong_shape = tmp_path / "wrong_shape.json"
    wrong_shape.write_text('{"traceEvents": 3}')
    no_events = tmp_path / "no_events.json"
    no_events.write_text("[1, 2, 3]")
    folder = tmp_path / "not_a_session"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    return {
        "truncated trace": (["diagnose", str(truncated)], "truncated"),
        "empty file": (["diagnose", str(empty)], "empty"),
        "binary file": (["diagnose", str(binary)], "binary.json"),
        "wrong-shaped JSON": (["diagnose", str(wrong_shape)], "wrong_shape.json"),
        "JSON that is no trace": (["diagnose", str(no_events)], "no_events.json"),
        "missing script": (["diagnose", str(tmp_path / "nope.py")], "nope.py"),
        "missing trace": (["diagnose", str(tmp_path / "nope.json")], "nope.json"),
        "directory that is no session": (["diagnose", str(folder)], "not_a_session"),
        "unknown table": (["summary", str(STARVED), "--table", "nosuch"], "nosuch"),
        "unknown table before the target": (["summary", "--table", "nosuch", str(trace)], "nosuch"),
        # the error names the trace, not the word after it
        "a word after a trace": (["diagnose", str(trace), "extra"], f"after {trace} are only for scripts"),
        "a script after a trace": (["diagnose", str(trace), str(tmp_path / "train.py")],
                                   f"after {trace} are only for scripts"),
        "an option after a trace that is not advisor's": (["diagnose", str(trace), "--steps", "3"], "--steps"),
        "a script's words after a session": (["summary", str(STARVED), "--table", "model", "x"],
                                             f"after {STARVED} are only for scripts"),
        "unknown rule": (["rules", "show", "no-such-rule"], "no-such-rule"),
        "unknown format": (["diagnose", "--format", "pdf", str(trace)], "pdf"),
    }


BAD_INPUTS = [
    "truncated trace", "empty file", "binary file", "wrong-shaped JSON", "JSON that is no trace",
    "missing script", "missing trace", "directory that is no session", "unknown table",
    "unknown table before the target", "a word after a trace", "a script after a trace",
    "an option after a trace that is not advisor's", "a script's words after a session",
    "unknown rule", "unknown format",
]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_a_non_zero_exit(case, tmp_path, trace, capsys):
    argv, word = _bad_inputs(tmp_path, trace)[case]
    code = run_main(argv)
    captured = capsys.readouterr()
    assert code != 0
    assert word in error_line(captured.err)
    assert "advisor report" not in captured.out


def test_bad_inputs_list_is_complete(tmp_path, trace):
    assert set(BAD_INPUTS) == set(_bad_inputs(tmp_path, trace))


@pytest.mark.parametrize("case", ["truncated trace", "missing script", "a word after a trace"])
def test_bad_input_in_a_real_process(case, tmp_path, trace):
    argv, word = _bad_inputs(tmp_path, trace)[case]
    done = advisor(*argv, cwd=tmp_path)
    assert done.returncode == 2
    assert word in error_line(done.stderr)
    assert done.stdout == ""


def test_a_trace_cut_off_midway_is_read_up_to_the_cut_and_says_so(tmp_path, trace):
    """A job killed while writing its trace: the events before the cut are reported, led by
    profile-incomplete, and a --fail-on gate trips."""
    cut = tmp_path / "cut.json"
    cut.write_bytes(trace.read_bytes()[: len(trace.read_bytes()) // 2])
    done = advisor("diagnose", "--fail-on", "high", str(cut), cwd=tmp_path)
    assert done.returncode == FAIL_ON_EXIT, done.stderr
    first = next(line for line in done.stdout.splitlines() if line.startswith("1. "))
    assert "[profile-incomplete]" in first
    assert "cut off" in done.stdout and "Traceback" not in done.stderr


def test_a_missing_script_runs_nothing(tmp_path, monkeypatch, capsys):
    """`advisor diagnose nope.py` in the user's folder: the relative path is named as typed."""
    monkeypatch.chdir(tmp_path)
    assert run_main(["diagnose", "nope.py"]) == 2
    assert error_line(capsys.readouterr().err) == "advisor: nope.py: no such script"


# -- scripts that end badly: their exit code, their traceback, and still a report ---------


def test_a_script_that_raises(tmp_path):
    """Exit 1, the user's traceback as Python prints it, and the report of what ran; the
    session saved on the way renders the same findings again."""
    script = train_script(tmp_path, RAISE)
    native = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    report_path, saved = tmp_path / "report.json", tmp_path / "saved"
    # --steps 0: records from the first step on: the script dies in its third.
    done = advisor("diagnose", "--steps", "0:", "--format", "json", "-o", str(report_path), "--save", str(saved),
                   str(script))

    assert native.returncode == done.returncode == 1
    # Python's traceback, frame for frame: advisor's and runpy's frames are left out.
    native_tb = native.stderr.strip().splitlines()
    assert native_tb[0] == "Traceback (most recent call last):" and native_tb[-1] == "ValueError: bad batch"
    assert done.stderr.splitlines()[: len(native_tb)] == native_tb
    assert done.stderr.splitlines()[len(native_tb):] == [
        f"advisor: session saved to {saved}", f"advisor: report written to {report_path}"]

    report = json.loads(report_path.read_text())
    validate_report(report)
    assert report["session"]["exit_code"] == 1
    assert report["session"]["script_error"] == "ValueError: bad batch"
    assert report["session"]["steps"]["count"] == 2  # the third, cut off by the error, is partial
    assert any("ValueError: bad batch" in note for note in report["notes"])
    rows = {row["key"]: row for row in report["tables"]["model"]["rows"]}
    assert rows["ProfileStep"]["calls"] == 2 and rows["Dataloader"]["cpu_total_ns"] > 0

    again = tmp_path / "again.json"
    assert main(["diagnose", str(saved), "--format", "json", "-o", str(again)]) == 0
    assert findings_of(json.loads(again.read_text())) == findings_of(report)


def test_a_script_interrupted_by_sigint(tmp_path):
    script = train_script(tmp_path, INTERRUPT)
    done = advisor("diagnose", str(script))
    assert done.returncode == 130
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.strip().splitlines()[-1] == "KeyboardInterrupt"
    assert "advisor report" in done.stdout and "KeyboardInterrupt" in done.stdout
    assert "trained" not in done.stdout


def test_a_script_that_exits_3(tmp_path, capsys):
    script = train_script(tmp_path, EXIT)
    out = tmp_path / "report.json"
    assert main(["diagnose", "--steps", "0:", "-o", str(out), "--format", "json", str(script)]) == 3
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err  # sys.exit(3) prints nothing, in Python as here
    report = json.loads(out.read_text())
    validate_report(report)
    # Steps 0 and 1 ran whole before the script exited in step 2. The step model may judge
    # step 0 start-up (on a busy machine it ran slower than step 1 and held the lazy set-up)
    # and set it apart: each of the two is a steady step or a start-up step, none is lost.
    apart = [s["what"] for s in report["session"]["window"]["set_apart"] if s["kind"] == "start-up step"]
    assert all(what.startswith("step #0:") for what in apart), apart
    assert (report["session"]["exit_code"], report["session"]["steps"]["count"] + len(apart)) == (3, 2)
    assert report["session"]["steps"]["numbers"] == [0, 1][len(apart):]


def test_a_script_that_exits_3_prints_its_report(tmp_path, capsys):
    script = train_script(tmp_path, EXIT)
    assert main(["diagnose", str(script)]) == 3
    out = capsys.readouterr().out
    assert "advisor report" in out and "SystemExit: 3" in out


# -- reports: formats, files, saved sessions ------------------------------------------------


def test_json_to_a_file_is_schema_valid(tmp_path, capsys):
    out = tmp_path / "sub" / "report.json"
    assert main(["diagnose", "--format", "json", "-o", str(out), str(STARVED)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"advisor: report written to {out}"
    report = json.loads(out.read_text())
    validate_report(report)
    assert findings_of(report)[0][:2] == ("dataloader-starvation", "high")


def test_json_to_stdout_is_the_report_alone(capsys):
    assert main(["diagnose", str(STARVED), "--format", "json"]) == 0
    validate_report(json.loads(capsys.readouterr().out))


def test_markdown(capsys):
    assert main(["diagnose", "--format", "markdown", str(STARVED)]) == 0
    out = capsys.readouterr().out
    assert out.lstrip().startswith("#")
    assert "dataloader-starvation" in out and "| Dataloader |" in out.replace("`", "")


def test_terminal_is_the_default(capsys):
    assert main(["diagnose", str(STARVED)]) == 0
    out = capsys.readouterr().out
    assert "advisor report" in out and "[dataloader-starvation]" in out


def test_save_then_diagnose_the_saved_folder(tmp_path, trace, capsys):
    saved = tmp_path / "saved"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert main(["diagnose", "--save", str(saved), "--format", "json", "-o", str(first), str(STARVED)]) == 0
    assert (saved / "session.json").is_file() and (saved / "events.parquet").is_file()
    assert main(["diagnose", str(saved), "--format", "json", "-o", str(second)]) == 0
    one, two = json.loads(first.read_text()), json.loads(second.read_text())
    assert findings_of(one) == findings_of(two) and findings_of(one)
    assert one["tables"]["model"] == two["tables"]["model"]


# -- where options go: after a trace they are advisor's, after a script the script's ------


@pytest.mark.parametrize("target", ["trace", "session"])
def test_options_after_a_trace_or_session_are_advisors(target, trace, capsys):
    path = trace if target == "trace" else STARVED
    assert main(["diagnose", str(path), "--format", "json"]) == 0
    validate_report(json.loads(capsys.readouterr().out))


def test_options_after_a_trace_mix_with_those_before(trace, tmp_path, capsys):
    out = tmp_path / "r.md"
    assert main(["diagnose", "--format", "markdown", str(trace), "-o", str(out)]) == 0
    assert out.read_text().lstrip().startswith("#")


ARGV_SCRIPT = "import json, sys\nwith open(sys.argv[0] + '.argv', 'w') as f:\n    json.dump(sys.argv, f)\n"


def _argv_seen(tmp_path: Path, words: list[str], capsys) -> list[str]:
    script = tmp_path / "s.py"
    script.write_text(ARGV_SCRIPT)
    assert main(["diagnose", str(script), *words]) == 0
    assert "advisor report" in capsys.readouterr().out  # advisor's format, not the script's
    return json.loads(Path(str(script) + ".argv").read_text())


def test_everything_after_a_script_is_the_scripts(tmp_path, capsys):
    seen = _argv_seen(tmp_path, ["--format", "x", "-o", "y", "--save", "z", "plain"], capsys)
    assert seen == [str(tmp_path / "s.py"), "--format", "x", "-o", "y", "--save", "z", "plain"]


def test_a_double_dash_after_a_script_reaches_it(tmp_path, capsys):
    seen = _argv_seen(tmp_path, ["--", "--x"], capsys)
    assert seen == [str(tmp_path / "s.py"), "--", "--x"]


# -- --fail-on --------------------------------------------------------------------------------


def test_fail_on_high_exits_3_when_a_high_finding_exists():
    done = advisor("diagnose", "--fail-on", "high", str(STARVED))
    assert done.returncode == FAIL_ON_EXIT == 3
    assert "[dataloader-starvation]" in done.stdout  # the report is still printed
    assert done.stderr.strip().splitlines()[-1] == (
        "advisor: findings at or above 'high': failing as asked by --fail-on")
    assert "Traceback" not in done.stderr


def test_fail_on_high_exits_0_without_one(capsys):
    # a case with no finding (cpu_clean_train's AdamW is a finding since the optimizer rule
    # judges CPU runs)
    assert main(["diagnose", str(NO_FINDING), "--fail-on", "high"]) == 0
    assert main(["diagnose", str(NO_FINDING), "--fail-on", "medium"]) == 0
    assert "--fail-on" not in capsys.readouterr().err


def test_fail_on_thresholds(capsys):
    assert main(["diagnose", "--fail-on", "critical", str(STARVED)]) == 0
    assert main(["diagnose", "--fail-on", "info", str(STARVED)]) == FAIL_ON_EXIT


# -- summary and rules ------------------------------------------------------------------------


def _csv_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """`summary -f csv` output: a '# name' line, then that table's CSV."""
    tables: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# "):
            current = line[2:].strip()
            tables[current] = []
        elif line.strip() and current is not None:
            tables[current].append(line)
    return {name: list(csv.DictReader(io.StringIO("\n".join(lines)))) for name, lines in tables.items()}


def test_summary_csv_parses_and_is_sorted(capsys):
    argv = ["summary", str(STARVED), "--table", "model", "--sort", "cpu_total_ns", "-f", "csv"]
    assert main(argv) == 0
    tables = _csv_tables(capsys.readouterr().out)
    assert list(tables) == ["model"]
    rows = tables["model"]
    assert {r["key"] for r in rows} == {"ProfileStep", "Dataloader", "Forward", "Backward", "Optimization", "Others"}
    totals = [int(r["cpu_total_ns"]) for r in rows]
    assert totals == sorted(totals, reverse=True) and rows[0]["key"] == "ProfileStep"
    assert float(next(r for r in rows if r["key"] == "Dataloader")["cpu_ratio"]) > 0.8


def test_summary_json_and_terminal(capsys):
    assert main(["summary", "-f", "json", "-t", "perf", "-t", "model", str(STARVED)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"perf", "model"}
    assert main(["summary", str(STARVED), "--table", "perf"]) == 0
    assert "reader_cost" in capsys.readouterr().out


def test_rules_list(capsys):
    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert listed == [spec.id for spec in builtin_specs()]
    assert "dataloader-starvation" in listed and "high" in out


def test_rules_show(capsys):
    assert main(["rules", "show", "dataloader-starvation"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dataloader-starvation: The step waits on input data")
    for heading in ("## What it does", "## Why it matters", "## Example", "## Use instead", "## Options"):
        assert heading in out
    assert "dataloader_share = 0.1" in out


def test_version_and_help_in_a_real_process():
    done = advisor("--version")
    assert done.returncode == 0 and done.stdout.startswith("advisor ")
    done = advisor()
    assert done.returncode == 2 and "diagnose" in done.stdout and done.stderr == ""


@pytest.mark.parametrize("argv", [["diagnose"], ["diagnose", "--bogus", "t.json"], ["rules", "frob"],
                                  ["diagnose", "--format", "pdf", "t.json"], ["--nope"]])
def test_usage_errors_are_one_line_too(argv):
    done = advisor(*argv)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advisor: "), done.stderr
    assert "script_args" not in lines[0]


def test_a_report_or_save_that_cannot_be_written_is_one_line(tmp_path, trace):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = advisor("diagnose", str(trace), "-o", str(blocker / "report.json"), cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("advisor: ") and done.stderr.count("\n") == 1
    saved = tmp_path / "saved"
    assert advisor("diagnose", str(trace), "--save", str(saved), "-f", "json", "-o", os.devnull,
                   cwd=tmp_path).returncode == 0
    again = advisor("diagnose", str(trace), "--save", str(saved), cwd=tmp_path)
    assert again.returncode == 2 and "not empty" in again.stderr  # the first session is left as it was


FORKING = """
import os, sys
import torch

for step in range(4):
    torch.randn(32, 32) @ torch.randn(32, 32)
pid = os.fork()
if pid == 0:
    print("child ran")
    sys.exit(4)
_, status = os.waitpid(pid, 0)
print("parent saw", os.waitstatus_to_exitcode(status))
"""


def test_a_script_that_forks_gets_one_report_and_its_child_ends_as_python_ends_it(tmp_path):
    """The forked child runs on to the end of the script inside advisor's process image: it
    must end there (its own exit code), not analyse and report, nor hang in the profiler's
    exit handlers."""
    script = tmp_path / "forking.py"
    script.write_text(FORKING)
    native = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    done = advisor("diagnose", str(script), timeout=180)
    assert done.returncode == native.returncode == 0, done.stderr[-2000:]
    assert "child ran" in done.stdout and "parent saw 4" in done.stdout
    assert done.stdout.count("advisor report") == 1


def test_a_script_that_ends_with_os_exit_is_reported_with_its_exit_code(tmp_path):
    """os._exit would end advisor's process on the spot, the profile with it: on the main
    thread it ends the script instead, and advisor reports and exits with that code."""
    script = train_script(tmp_path, "os._exit(3)")
    done = advisor("diagnose", str(script), timeout=180)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "advisor report" in done.stdout and "os._exit(3)" in done.stdout
    assert "Traceback" not in done.stderr
