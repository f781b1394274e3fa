"""The fuzzer (benchmarks/fuzz.py) on every kind of input it makes, once each: no input
ends in a traceback, an internal error or a hang."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

FUZZ = REPO / "benchmarks" / "fuzz.py"


def test_the_fuzzer_makes_at_least_sixty_kinds_of_input():
    spec = importlib.util.spec_from_file_location("advisor_fuzz_kinds", FUZZ)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert len(module.ALL_KINDS) >= 60


def test_every_kind_of_hostile_input_is_a_report_or_one_line():
    done = subprocess.run([sys.executable, str(FUZZ), "--each", "1", "--events", "1500", "--timeout", "90",
                           "--workers", "2"], capture_output=True, text=True, cwd=REPO, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "traceback on" not in done.stdout and "hang on" not in done.stdout
    (all_kinds,) = [line for line in done.stdout.splitlines() if line.startswith("all ")]
    assert all_kinds.split()[-2:] == ["0", "0"], all_kinds  # no traceback, no hang
