"""The fuzzer (benchmarks/fuzz.py) on every kind of input it makes, once each: no input
ends in a traceback, an internal error or a hang."""

from __future__ import annotations

import importlib.util

from conftest import REPO


def _fuzz():
    spec = importlib.util.spec_from_file_location("fuzz", REPO / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fuzzer_makes_at_least_sixty_kinds_of_input():
    assert len(_fuzz().ALL_KINDS) >= 60


def test_every_kind_of_hostile_input_is_a_report_or_one_line(capsys):
    code = _fuzz().main(["--each", "1", "--events", "1500", "--timeout", "90", "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "traceback on" not in out and "hang on" not in out
