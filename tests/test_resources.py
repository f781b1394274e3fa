"""Resource failures inside advisor (out of memory, a full disk, a report path that cannot
be written, Ctrl-C, two runs saving into one folder): one ``advisor:`` line and a non-zero
exit, and what a script run had collected is on disk, where `advisor diagnose DIR` reports
it again."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import advisor, error_line, run_main, train_script

import advisor.diagnosis as tables_module  # where every command's tables are computed
import advisor.reports._render as render_module
from advisor.session import Session

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

MARK = "import pathlib; pathlib.Path(__file__).with_name('ran').write_text('yes')"


def kept_folder(line: str) -> Path:
    match = re.search(r"the profile collected is kept in (\S+) \(`advisor diagnose \1` reports it\)", line)
    assert match, line
    return Path(match.group(1))


def test_a_report_path_that_cannot_be_written_is_said_before_the_script_runs(tmp_path):
    script = train_script(tmp_path, MARK)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = advisor("diagnose", "-o", str(blocker / "report.json"), str(script), cwd=tmp_path)
    assert done.returncode == 2
    assert "cannot write there" in error_line(done.stderr)
    assert not (tmp_path / "ran").exists()
    folder = tmp_path / "reports"
    folder.mkdir()
    done = advisor("diagnose", "-o", str(folder), str(script), cwd=tmp_path)
    assert done.returncode == 2 and "is a folder" in error_line(done.stderr) and not (tmp_path / "ran").exists()


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "report.json")


def _no_memory(*args, **kwargs):
    raise MemoryError


def _interrupted(*args, **kwargs):
    raise KeyboardInterrupt


def _a_bug(*args, **kwargs):
    raise RuntimeError("table 'x' has repeated row keys")


@pytest.mark.parametrize(("where", "failure", "code", "said"), [
    (render_module, ("write_text", _no_space), 1, "advisor: No space left on device: report.json; "),
    (tables_module, ("compute_tables", _no_memory), 1, "advisor: out of memory"),
    (tables_module, ("compute_tables", _interrupted), 130, "advisor: interrupted; "),
    (tables_module, ("compute_tables", _a_bug), 1,
     "advisor: internal error (RuntimeError: table 'x' has repeated row keys); ADVISOR_DEBUG=1 shows where; "),
], ids=["full disk while writing the report", "out of memory in the tables", "ctrl-c in the tables", "a bug"])
def test_a_failure_after_the_collection_keeps_the_profile(tmp_path, monkeypatch, capsys, where, failure, code, said):
    script = train_script(tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(where, *failure)
        assert run_main(["diagnose", "--format", "json", "-o", str(tmp_path / "report.json"), str(script)]) == code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("advisor: ") and
             not line.startswith(("advisor: running", "advisor: train.py", "advisor: reading"))]
    assert len(lines) == 1 and lines[0].startswith(said), lines
    folder = kept_folder(lines[0])
    assert Session.load(folder).steps()["step"].tolist()  # the recorded steps are there
    # ... and render the report the run could not write.
    out = tmp_path / "again.json"
    assert run_main(["diagnose", str(folder), "--format", "json", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["session"]["steps"]["count"] > 0


def test_a_run_that_writes_its_report_keeps_nothing(tmp_path, capsys):
    from advisor.importers.cache import cache_dir

    script = train_script(tmp_path)
    before = set((cache_dir() / ".kept").glob("run-*"))  # failures in other tests keep theirs
    assert run_main(["diagnose", "--format", "json", "-o", str(tmp_path / "report.json"), str(script)]) == 0
    assert set((cache_dir() / ".kept").glob("run-*")) == before


def test_a_folder_another_run_is_saving_into_is_refused(tmp_path, make_trace):
    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    saving = tmp_path / "saving"
    saving.mkdir()
    (saving / ".advisor-saving").write_text(f"{os.getpid()}\n")  # this test's process: alive
    done = advisor("diagnose", str(trace), "--save", str(saving), cwd=tmp_path)
    assert done.returncode == 2 and "another advisor run is saving into this folder" in error_line(done.stderr)


def test_a_claim_left_by_a_killed_run_is_taken_over(tmp_path, make_trace):
    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    saving = tmp_path / "saving"
    saving.mkdir()
    (saving / ".advisor-saving").write_text(f"{gone}\n")
    done = advisor("diagnose", str(trace), "--save", str(saving), "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (saving / "session.json").is_file() and not (saving / ".advisor-saving").exists()


def test_two_runs_saving_into_one_folder_at_once(tmp_path, make_trace):
    """Started together, one claims the folder and saves; the other stops with one line
    (whether it looked before or after the first finished), and the saved session is whole."""
    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 * i,
                         "dur": 5} for i in range(2000)])
    saved = tmp_path / "saved"
    runs = [subprocess.Popen([sys.executable, "-m", "advisor", "diagnose", str(trace), "--save", str(saved),
                              "--format", "json", "-o", str(tmp_path / f"report{i}.json")],
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path) for i in range(2)]
    outcomes = sorted((run.wait(timeout=120), run.stderr.read()) for run in runs)
    (ok, _), (refused, why) = outcomes
    assert (ok, refused) == (0, 2), outcomes
    assert re.search(r"another advisor run is saving|exists and is not empty", error_line(why))
    assert len(Session.load(saved).events) >= 2000 and not (saved / ".advisor-saving").exists()


def test_a_launched_job_whose_report_fails_keeps_its_ranks(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    example = Path(__file__).resolve().parent.parent / "examples" / "ddp_straggler.py"
    monkeypatch.setattr(render_module, "write_text", _no_space)
    code = run_main(["diagnose", "--format", "json", "-o", str(tmp_path / "report.json"), "torchrun",
                     "--nproc-per-node=2", str(example), "--steps", "6"])
    assert code == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("advisor: No space")]
    folder = kept_folder(line)
    monkeypatch.undo()
    out = tmp_path / "again.json"
    assert run_main(["diagnose", str(folder), "--format", "json", "-o", str(out)]) == 0
    assert [r["rank"] for r in json.loads(out.read_text())["job"]["ranks"]] == [0, 1]


def test_a_reader_that_stops_reading_gets_the_scripts_exit_code_and_nothing_is_left_kept(tmp_path):
    """`advisor diagnose train.py | head -1`: the report meets a closed pipe; that is the
    reader's choice, not a failure: the script's exit code, no error line, nothing kept."""
    script = train_script(tmp_path)
    cache = tmp_path / "cache"
    env = {**os.environ, "ADVISOR_CACHE_DIR": str(cache)}
    run = subprocess.Popen([sys.executable, "-m", "advisor", "diagnose", str(script)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    assert run.stdout.readline()  # the script's own output first
    run.stdout.close()
    assert run.wait(timeout=180) == 0
    assert not run.stderr.read().strip()
    assert not list((cache / ".kept").glob("run-*"))


def test_a_save_that_fails_takes_away_what_it_wrote_and_keeps_the_profile_elsewhere(tmp_path, monkeypatch, capsys):
    script = train_script(tmp_path)
    saved = tmp_path / "saved"
    real_save = Session.save

    def full_disk(self, folder):  # the disk --save writes to is full; the cache's is not
        if Path(folder) != saved:
            return real_save(self, folder)
        (Path(folder) / "events.parquet").write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Session, "save", full_disk)
    code = run_main(["diagnose", "--save", str(saved), "--format", "json", "-o", str(tmp_path / "r.json"),
                     str(script)])
    monkeypatch.setattr(Session, "save", real_save)
    assert code == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "cannot save" in x]
    assert line.startswith(f"advisor: cannot save the session in {saved} (No space left on device)")
    assert not [p for p in saved.iterdir() if p.name != ".advisor-saving"] if saved.exists() else True
    assert Session.load(kept_folder(line)).steps()["step"].tolist()


def test_ctrl_c_while_a_session_is_saved_waits_for_the_save(tmp_path, make_trace):
    import signal

    from advisor.cli.keep import save_whole
    from advisor.importers import load

    session = load(make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
                                "dur": 5}]))
    real_save = Session.save

    def interrupted_midway(self, folder):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C between the two files
        return real_save(self, folder)

    folder = tmp_path / "kept"
    folder.mkdir()
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(Session, "save", interrupted_midway)
        with pytest.raises(KeyboardInterrupt):
            save_whole(session, folder)
    assert len(Session.load(folder).events) == 1  # whole, and the interrupt came after


def test_timeline_says_its_path_cannot_be_written_before_the_script_runs(tmp_path):
    script = train_script(tmp_path, MARK)
    done = advisor("timeline", "-o", str(script / "t.json"), str(script), cwd=tmp_path)
    assert done.returncode == 2 and "cannot write there" in error_line(done.stderr)
    assert not (tmp_path / "ran").exists()


def test_ctrl_c_while_the_profile_is_read_back_keeps_it(tmp_path, monkeypatch, capsys):
    """Between the script's end and the Session (the profiler writing and advisor reading
    the trace), a Ctrl-C is held until the profile is whole, then stops the run with it kept."""
    import signal

    from advisor.collect import assemble

    real_read = assemble._read_parts

    def interrupted_while_reading(paths):
        signal.raise_signal(signal.SIGINT)
        return real_read(paths)

    monkeypatch.setattr(assemble, "_read_parts", interrupted_while_reading)
    script = train_script(tmp_path)
    assert run_main(["diagnose", "--format", "json", "-o", str(tmp_path / "r.json"), str(script)]) == 130
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("advisor: interrupted")]
    assert Session.load(kept_folder(line)).steps()["step"].tolist()
    assert not (tmp_path / "r.json").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the hold is released


@pytest.mark.parametrize("command", [["summary"], ["timeline", "-o", "TMP/t.json"]])
def test_summary_and_timeline_of_a_script_keep_its_profile_when_they_fail(tmp_path, monkeypatch, capsys, command):
    script = train_script(tmp_path)
    argv = [*(c.replace("TMP", str(tmp_path)) for c in command), str(script)]
    with monkeypatch.context() as patched:
        patched.setattr(tables_module, "compute_tables", _no_memory)
        assert run_main(argv) == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("advisor: out of memory")]
    assert Session.load(kept_folder(line)).steps()["step"].tolist()


def test_save_into_a_file_is_said_so(tmp_path, make_trace):
    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    done = advisor("diagnose", str(trace), "--save", str(trace), cwd=tmp_path)
    assert done.returncode == 2 and error_line(done.stderr) == f"advisor: --save {trace}: is a file; give a new folder"


def test_a_report_that_cannot_be_written_whole_leaves_no_file(tmp_path, make_trace, monkeypatch, capsys):
    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    report = tmp_path / "report.json"
    report.write_text("the previous report")
    monkeypatch.setattr(render_module.os, "replace", _no_space)
    assert run_main(["diagnose", str(trace), "--format", "json", "-o", str(report)]) == 2
    assert report.read_text() == "the previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "trace.json"]
    assert "cannot write the report" in capsys.readouterr().err
