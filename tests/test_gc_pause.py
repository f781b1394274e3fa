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
    gc.unfreeze()
    yield
    gc_pause._paused = gc_pause._froze = False
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


def test_end_gives_the_process_its_collector_back(collector):
    gc.enable()
    gc_pause.pause()
    gc_pause.end()  # ended paused (a kept report, an early error): on again, nothing frozen
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc_pause.pause()
    gc_pause.resume()
    gc_pause.end()  # what resume froze is the collector's again
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_end_leaves_what_the_process_froze_itself(collector):
    gc.enable()
    gc.freeze()
    mine = gc.get_freeze_count()
    gc_pause.pause()
    gc_pause.resume()
    gc_pause.end()
    assert gc.isenabled() and gc.get_freeze_count() >= mine > 0


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
    """`advisor argv` in a fresh process: whether it paused, what resuming froze, and the
    collector as main() leaves it."""
    code = textwrap.dedent(f"""\
        import gc, json, sys
        from advisor import gc_pause
        seen = {{"paused": False, "frozen_at_resume": 0}}
        pause, resume = gc_pause.pause, gc_pause.resume
        def watched_pause():
            pause(); seen["paused"] = not gc.isenabled()
        def watched_resume():
            resume(); seen["frozen_at_resume"] = max(seen["frozen_at_resume"], gc.get_freeze_count())
        gc_pause.pause, gc_pause.resume = watched_pause, watched_resume
        import advisor.cli
        advisor.cli.pause, advisor.cli.resume = watched_pause, watched_resume
        code = advisor.cli.main({argv!r})
        print(json.dumps({{"code": code, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), **seen}}))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_diagnosing_a_trace_pauses_for_the_imports_and_runs_again_after(tmp_path):
    trace = synth_trace(tmp_path / "train.json", 2000)
    seen = _probe(["diagnose", str(trace), "--no-cache", "--format", "json", "-o", str(tmp_path / "r.json")],
                  tmp_path)
    assert seen["code"] == 0 and seen["paused"]
    assert seen["frozen_at_resume"] > 10_000  # what the imports made, out of the collections' way
    assert seen["enabled"] and seen["frozen"] == 0  # and main() gives the collector back whole


def test_a_command_that_ends_before_its_imports_leaves_the_collector_on(tmp_path, cache_dir, monkeypatch,
                                                                          collector):
    """A kept report written, or an error said, before the imports that end the pause."""
    from advisor.cli import main

    monkeypatch.chdir(tmp_path)
    trace = synth_trace(tmp_path / "train.json", 2000)
    report = ["diagnose", str(trace), "--format", "json", "-o", str(tmp_path / "r.json")]
    gc.enable()
    for argv, code in ((report, 0), (report, 0), (["timeline", str(trace)], 2)):
        assert main(argv) == code
        assert gc.isenabled() and gc.get_freeze_count() == 0, argv
    assert len(list(cache_dir.glob("*/report-*.json"))) == 1  # the second diagnose wrote the kept one


def test_a_script_runs_with_the_collector_as_python_set_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""\
        import gc, json
        with open({str(tmp_path / "seen.json")!r}, "w") as f:
            json.dump({{"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}}, f)
        """))
    seen = _probe(["diagnose", str(script), "--no-cache", "--format", "json", "-o", str(tmp_path / "r.json")],
                  tmp_path)
    assert seen["code"] == 0 and not seen["paused"]
    assert json.loads((tmp_path / "seen.json").read_text()) == {"enabled": True, "frozen": 0}
