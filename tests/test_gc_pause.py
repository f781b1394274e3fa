"""The garbage collector paused while a command that reads profiles starts, and running
again (with what exists frozen) once its imports are done; never paused for a user's script
(advisor.gc_pause)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import synth_trace

from advisor import gc_pause


@pytest.fixture
def collector():
    """The collector as the test process had it, and no pause left behind."""
    was = gc.isenabled()
    yield
    gc_pause._paused = False
    gc.unfreeze()
    gc.enable() if was else gc.disable()


def test_pause_and_resume(collector):
    gc.enable()
    gc_pause.pause()
    assert not gc.isenabled()
    frozen = gc.get_freeze_count()
    gc_pause.resume()
    assert gc.isenabled()
    assert gc.get_freeze_count() > frozen  # what the imports made is out of the collections' way
    gc_pause.resume()  # a second resume changes nothing
    assert gc.isenabled()


def test_a_collector_the_process_turned_off_stays_off(collector):
    gc.disable()
    gc_pause.pause()
    gc_pause.resume()
    assert not gc.isenabled()


def test_the_read_ahead_resumes_in_its_own_process(tmp_path, collector):
    """The read ahead is forked while the command's imports pause the collector; its read
    runs with the collector on (here in this process, as the forked one runs it)."""
    from advisor.forked import Progress
    from advisor.importers import ahead

    trace = synth_trace(tmp_path / "train.json", 500)
    gc.enable()
    gc_pause.pause()
    seen = []
    real = gc_pause.resume

    def resume():
        real()
        seen.append(gc.isenabled())

    progress = Progress()
    try:
        import unittest.mock

        with unittest.mock.patch.object(gc_pause, "resume", resume):
            events, _fields = ahead._read(trace, progress)
    finally:
        progress.close()
    assert seen == [True] and gc.isenabled() and len(events)


def _probe(argv: list[str], cwd) -> dict:
    """`advisor argv` in a fresh process: whether the collector ran by the end, and what
    the pause froze."""
    code = textwrap.dedent(f"""\
        import gc, json, sys
        from advisor.cli import main
        code = main({argv!r})
        print(json.dumps({{"code": code, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}}))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_diagnosing_a_trace_pauses_for_the_imports_and_runs_again_after(tmp_path):
    trace = synth_trace(tmp_path / "train.json", 2000)
    seen = _probe(["diagnose", str(trace), "--no-cache", "--format", "json", "-o", str(tmp_path / "r.json")],
                  tmp_path)
    assert seen == {"code": 0, "enabled": True, "frozen": seen["frozen"]} and seen["frozen"] > 10_000


def test_a_script_runs_with_the_collector_as_python_set_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""\
        import gc, json
        with open({str(tmp_path / "seen.json")!r}, "w") as f:
            json.dump({{"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}}, f)
        """))
    seen = _probe(["diagnose", str(script), "--no-cache", "--format", "json", "-o", str(tmp_path / "r.json")],
                  tmp_path)
    assert seen["code"] == 0
    assert json.loads((tmp_path / "seen.json").read_text()) == {"enabled": True, "frozen": 0}
