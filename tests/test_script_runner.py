"""run_script runs a script as `python script.py args` would, and keeps what it collected
whatever way the script ended (after pyinstrument's test_cmdline)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from advisor.collect import ScriptRun, run_script
from advisor.errors import ScriptError

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("torch")

PROBE = """
import json, os, sys
print(json.dumps({
    "name": __name__,
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "file": __file__,
}))
"""


def write_script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def run_native(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def trace_events(run: ScriptRun) -> list[dict]:
    assert run.trace_path is not None and run.trace_path.is_file()
    return json.loads(run.trace_path.read_text())["traceEvents"]


@pytest.mark.parametrize("script_arg", ["scripts/probe.py", "./scripts/probe.py", "ABSOLUTE"])
def test_runs_like_python(tmp_path, monkeypatch, capsys, script_arg):
    script = write_script(tmp_path / "scripts", "probe.py", PROBE)
    if script_arg == "ABSOLUTE":
        script_arg = str(script)
    args = ["first", "--flag", "value with spaces"]
    native = run_native(script_arg, args, cwd=tmp_path)
    assert native.returncode == 0, native.stderr
    expected = json.loads(native.stdout)

    monkeypatch.chdir(tmp_path)
    argv_before, path_before = list(sys.argv), list(sys.path)
    run = run_script(script_arg, args, save_trace_to=tmp_path / "out" / "trace.json", with_stack=False)
    got = json.loads(capsys.readouterr().out)

    # run_path hands __file__ over as given; Python makes a relative one absolute
    assert os.path.abspath(got.pop("file")) == os.path.abspath(expected.pop("file"))
    assert got == expected
    assert got["name"] == "__main__"
    assert run.exit_code == 0 and run.ending == "normal" and run.error is None
    assert run.command == [script_arg, *args]
    assert sys.argv == argv_before and sys.path == path_before
    assert os.getcwd() == str(tmp_path)
    assert run.trace_path == tmp_path / "out" / "trace.json"
    assert run.wall_time_s >= 0


def test_symlinked_script_puts_the_real_folder_on_sys_path(tmp_path, monkeypatch, capsys):
    script = write_script(tmp_path / "real", "probe.py", PROBE)
    (tmp_path / "link.py").symlink_to(script)
    native = run_native("link.py", [], cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    run_script("link.py", [], save_trace_to=tmp_path / "t.json", with_stack=False)
    got, expected = json.loads(capsys.readouterr().out), json.loads(native.stdout)
    assert os.path.abspath(got.pop("file")) == os.path.abspath(expected.pop("file"))
    assert got == expected


def test_script_can_import_modules_beside_it(tmp_path, capsys):
    write_script(tmp_path / "proj", "helper_for_advisor_test.py", "VALUE = 41\n")
    script = write_script(
        tmp_path / "proj", "main.py", "import helper_for_advisor_test as h\nprint(h.VALUE + 1)\n"
    )
    try:
        run = run_script(script, [], save_trace_to=tmp_path / "t.json", with_stack=False)
    finally:
        sys.modules.pop("helper_for_advisor_test", None)
    assert run.exit_code == 0
    assert capsys.readouterr().out.strip() == "42"


WORK = "import torch\ntorch.ones(8).sum()\n"

ENDINGS = [
    # body, exit code, ending, error, what stderr shows
    ('raise ValueError("boom\\nsecond line")', 1, "exception", "ValueError: boom second line", "ValueError: boom"),
    ("import sys\nsys.exit(3)", 3, "exit", "SystemExit: 3", None),
    ('import sys\nsys.exit("bad input file")', 1, "exit", "SystemExit: bad input file", "bad input file"),
    ("import sys\nsys.exit()", 0, "exit", "SystemExit", None),
    ("import sys\nsys.exit(0)", 0, "exit", "SystemExit: 0", None),
    ("raise KeyboardInterrupt", 130, "interrupt", "KeyboardInterrupt", "KeyboardInterrupt"),
]


@pytest.mark.parametrize(("body", "code", "ending", "error", "stderr_shows"), ENDINGS)
def test_every_ending_keeps_exit_code_and_trace(tmp_path, capsys, body, code, ending, error, stderr_shows):
    script = write_script(tmp_path, "ends.py", WORK + body + "\n")
    argv_before, path_before = list(sys.argv), list(sys.path)

    run = run_script(script, ["--x"], save_trace_to=tmp_path / "trace.json", with_stack=False, steps=None)
    stderr = capsys.readouterr().err

    assert (run.exit_code, run.ending, run.error) == (code, ending, error)
    assert run.script_error == (None if code == 0 else error)
    assert sys.argv == argv_before and sys.path == path_before
    # what was collected before the end is in the exported trace
    names = {e.get("name") for e in trace_events(run)}
    assert "aten::sum" in names
    if stderr_shows is None:
        assert stderr.strip() == ""
    else:
        assert stderr_shows in stderr
    if ending in ("exception", "interrupt"):
        # the user's traceback, from the script's own frame, as Python prints it
        assert stderr.startswith("Traceback (most recent call last):")
        assert f'File "{script}", line' in stderr
        assert "runpy" not in stderr and "advisor" not in stderr.replace(str(tmp_path), "")
    if ending != "interrupt":  # Python itself dies of SIGINT there: -2, not a code
        # the same ending without torch, which costs seconds to import in a subprocess
        plain = write_script(tmp_path, "ends_plain.py", body + "\n")
        native = run_native(str(plain), ["--x"], cwd=tmp_path)
        assert native.returncode == code
        if ending == "exception":
            assert native.stderr.strip().splitlines()[-1] == stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "body",
    [
        "torch.ones(2).sum().backward()  # nothing requires grad",
        "class Bad(torch.utils.data.Dataset):\n"
        "    def __len__(self): return 2\n"
        "    def __getitem__(self, i): raise IndexError('no item')\n"
        "for batch in torch.utils.data.DataLoader(Bad()): pass",
    ],
)
def test_traceback_through_advisors_hooks_shows_only_user_and_torch_frames(tmp_path, capsys, body):
    script = write_script(tmp_path, "hooked.py", "import torch\n" + body + "\n")
    run = run_script(script, [], save_trace_to=tmp_path / "t.json", with_stack=False)
    stderr = capsys.readouterr().err
    assert run.exit_code == 1
    assert f'File "{script}", line' in stderr
    assert "advisor/collect" not in stderr and "advisor" not in stderr.replace(str(tmp_path), "")
    assert "site-packages/torch" in stderr or "/torch/" in stderr


def test_an_error_advisor_raised_and_handled_is_not_shown_as_the_context_of_the_script_s(capsys):
    # CI once printed a hook's own caught ValueError (advisor/collect/cores.py) "during
    # handling" of which the script's error came; the script never saw it
    from advisor.collect import script as runner
    from advisor.errors import UsageError
    from advisor.tables import compute_tables

    try:
        compute_tables(None, ["no such table"])
    except UsageError as caught:
        # raised and caught in advisor's code: its traceback from advisor's frame on
        inside = caught.with_traceback(caught.__traceback__.tb_next)
    try:
        raise ValueError("bad batch")
    except ValueError as error:
        users = error
    users.__context__ = inside
    runner._show_like_python(users, __file__)
    shown = capsys.readouterr().err
    assert shown.startswith("Traceback (most recent call last):") and shown.strip().endswith("ValueError: bad batch")
    assert "During handling" not in shown and "no such table" not in shown
    assert users.__suppress_context__ is False  # the exception is left as it was
    # an error the script caught itself (a frame of its own) is its context, as Python shows
    try:
        compute_tables(None, ["no such table"])
    except UsageError as caught:
        users.__context__ = caught
    runner._show_like_python(users, __file__)
    assert "During handling of the above exception" in capsys.readouterr().err


def test_syntax_error_is_the_users_error(tmp_path, capsys):
    script = write_script(tmp_path, "broken.py", "def f(:\n    pass\n")
    run = run_script(script, [], save_trace_to=tmp_path / "t.json", with_stack=False)
    stderr = capsys.readouterr().err
    assert run.exit_code == 1 and run.ending == "exception"
    assert run.error.startswith("SyntaxError")
    assert "SyntaxError" in stderr and "runpy" not in stderr


def test_traceback_can_be_left_to_the_caller(tmp_path, capsys):
    script = write_script(tmp_path, "fails.py", "raise RuntimeError('x')\n")
    run = run_script(script, [], save_trace_to=tmp_path / "t.json", with_stack=False, show_traceback=False)
    assert run.exit_code == 1
    assert capsys.readouterr().err == ""


def test_trace_goes_to_a_temporary_folder_by_default(tmp_path):
    script = write_script(tmp_path, "ok.py", WORK)
    run = run_script(script, [], with_stack=False, steps=None)
    try:
        assert run.trace_path.name == "trace.json" and run.trace_path.is_file()
        assert run.trace_path.parent == run.work_dir != tmp_path
    finally:
        shutil.rmtree(run.work_dir)


def test_gzipped_trace(tmp_path):
    import gzip

    script = write_script(tmp_path, "ok.py", WORK)
    run = run_script(script, [], save_trace_to=tmp_path / "t.json.gz", with_stack=False, steps=None)
    events = json.loads(gzip.decompress(run.trace_path.read_bytes()))["traceEvents"]
    assert any(e.get("name") == "aten::sum" for e in events)


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_script_that_cannot_start_is_a_script_error(tmp_path, kind):
    target = tmp_path / "nope.py"
    if kind == "folder":
        target.mkdir()
    with pytest.raises(ScriptError) as info:
        run_script(target, [])
    message = str(info.value)
    assert "\n" not in message and str(target) in message


def test_without_torch_the_script_still_runs(tmp_path):
    script = write_script(tmp_path, "plain.py", "import sys\nprint('ran', sys.argv[1:])\nsys.exit(4)\n")
    driver = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["torch"] = None  # as if torch were not installed
        from advisor.collect import run_script
        run = run_script({str(script)!r}, ["a"])
        print(json.dumps({{"code": run.exit_code, "trace": run.trace_path, "notes": run.notes,
                           "profiled": run.profiled}}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", driver], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip().splitlines()
    assert out[0] == "ran ['a']"
    result = json.loads(out[-1])
    assert result["code"] == 4 and result["trace"] is None and result["profiled"] is False
    assert len(result["notes"]) == 1 and "torch is not importable" in result["notes"][0]
