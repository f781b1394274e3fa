"""Memory pages (advisor.importers.pages): numpy's documented huge-page switch for the
commands that run no user code, and freed memory given back only where a command asks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from builders import synth_trace

from advisor.importers import loader, pages

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow


def _numpy_switch_in(argv: list[str], cwd, env: dict | None = None) -> dict:
    """`advisor argv` in a fresh process: NUMPY_MADVISE_HUGEPAGE as numpy saw it at import."""
    code = ("import json, os, sys\nimport advisor.cli\ncode = advisor.cli.main(%r)\n"
            "print(json.dumps({'code': code, 'switch': os.environ.get('NUMPY_MADVISE_HUGEPAGE')}))\n" % (argv,))
    environ = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_command_that_reads_a_trace_turns_numpys_huge_pages_off(tmp_path):
    trace = synth_trace(tmp_path / "train.json", 2000)
    seen = _numpy_switch_in(["diagnose", str(trace), "--no-cache", "--format", "json", "-o", str(tmp_path / "r.json")],
                            tmp_path)
    assert seen == {"code": 0, "switch": "0"}


def test_the_users_own_setting_is_kept(tmp_path):
    trace = synth_trace(tmp_path / "train.json", 2000)
    seen = _numpy_switch_in(["diagnose", str(trace), "--no-cache", "--format", "json", "-o", str(tmp_path / "r.json")],
                            tmp_path, env={"NUMPY_MADVISE_HUGEPAGE": "1"})
    assert seen["switch"] == "1"


def test_a_script_runs_with_numpys_own_setting(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import json, os\nopen('seen.json', 'w').write(json.dumps(os.environ.get("
                      "'NUMPY_MADVISE_HUGEPAGE')))\n")
    subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--format", "json", "-o", "r.json", str(script)],
                   cwd=tmp_path, capture_output=True, timeout=300, check=False,
                   env={k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"})
    assert json.loads((tmp_path / "seen.json").read_text()) is None


def test_plain_pages_changes_nothing_once_numpy_is_imported(monkeypatch):
    import numpy  # noqa: F401  (imported: the switch would not be read again)

    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    pages.plain_pages()
    assert "NUMPY_MADVISE_HUGEPAGE" not in os.environ


def test_freed_memory_is_given_back_where_the_caller_asks(monkeypatch, tmp_path):
    """advisor.Profiler reads and summarises inside the user's job: no malloc_trim there;
    advisor's commands ask for it (load(..., give_back=True))."""
    calls = []
    monkeypatch.setattr(loader, "give_back_freed", lambda: calls.append("trim"))
    trace = synth_trace(tmp_path / "train.json", 2000)
    loader.load(trace)
    assert calls == []
    loader.load(trace, give_back=True, use_cache=False)
    assert calls == ["trim"]
