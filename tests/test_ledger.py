"""The ledger (advisor.verify.ledger, `advisor ledger`): every promised saving beside its
measurement, appended by verify and by benchmarks/savings.py, summarised per rule, read
back as data whatever the file holds."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from advisor.findings import Finding, Saving, Severity, Verification
from advisor.verify.ledger import LedgerEntry, append, read, summarise


def entry(rule: str, predicted: float, measured: float, *, low=None, high=None, spread=None, target="t"):
    return LedgerEntry(rule=rule, source="savings", target=target, predicted_ms=predicted, low_ms=low, high_ms=high,
                       measured_ms=measured, spread_ms=spread)


def test_records_are_appended_stamped_and_read_back(tmp_path):
    path = tmp_path / "deep" / "ledger.jsonl"
    append([entry("host-bound", 2.0, 1.8)], path)
    append([entry("host-bound", 1.0, 1.1), entry("launch-bound", 3.0, 2.0)], path)
    got = read(path)
    assert [e.rule for e in got.entries] == ["host-bound", "host-bound", "launch-bound"] and got.skipped == 0
    first = got.entries[0]
    assert first.machine and "logical cores" in first.machine and first.date.endswith("Z") and first.version


def test_each_rule_s_row_says_how_its_promises_held():
    rows = {r.rule: r for r in summarise([
        entry("a", 2.0, 1.0, low=1.5, high=2.5),         # half of the promise, outside the range
        entry("a", 2.0, 2.2, low=1.5, high=2.5),         # inside
        entry("a", 2.0, 4.0, low=1.5, high=2.5),         # twice, outside
        entry("b", 1.0, -0.5, spread=0.1, target="slower.py"),  # the step got slower
        entry("b", 1.0, -0.05, spread=0.1),              # within the noise: not a wrong sign
    ])}
    assert rows["a"].records == 3 and rows["a"].median_ratio == pytest.approx(1.1)
    assert rows["a"].inside == pytest.approx(1 / 3) and rows["a"].sign_wrong == ()
    assert rows["b"].sign_wrong == ("slower.py",) and rows["b"].inside == 0


def test_lines_that_are_not_records_are_counted_and_skipped(tmp_path):
    path = tmp_path / "ledger.jsonl"
    append([entry("host-bound", 2.0, 1.8)], path)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"rule": "x"}\n')  # fields missing
        handle.write("not json at all\n")
        handle.write('{"rule": "y", "source": "verify", "predicted_ms": 1, "measured_ms": 1, "x": "' + "a" * 70000
                     + '"}\n')
        handle.write('{"__class__": "os.system", "rule": "z"}\n')
    got = read(path)
    assert [e.rule for e in got.entries] == ["host-bound"] and got.skipped == 4


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "advisor", "ledger", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def test_the_command_prints_a_row_per_rule_in_each_format(tmp_path):
    path = tmp_path / "ledger.jsonl"
    append([entry("host-bound", 2.0, 1.8, low=1.0, high=2.0), entry("host-bound", 2.0, 2.6)], path)
    text = _cli(str(path))
    assert text.returncode == 0, text.stderr
    assert "host-bound" in text.stdout and "1.10x" in text.stdout and "50%" in text.stdout
    markdown = _cli(str(path), "--format", "markdown").stdout.splitlines()
    assert markdown[0].startswith("| rule |") and markdown[2].startswith("| host-bound | 2 | 1.10x | 50% |")
    data = json.loads(_cli(str(path), "--format", "json").stdout)
    assert data["rules"][0]["rule"] == "host-bound" and len(data["records"]) == 2


def test_a_missing_ledger_is_one_line_and_an_empty_one_says_how_to_fill_it(tmp_path):
    missing = _cli(str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0 and "no such ledger" in missing.stderr
    import os

    empty = _cli(env={**os.environ, "ADVISOR_LEDGER": str(tmp_path / "mine.jsonl")})
    assert empty.returncode == 0 and "advisor verify" in empty.stderr


def test_verify_adds_each_measured_fix_to_the_user_s_ledger(tmp_path, monkeypatch):
    from advisor.cli.verify import _to_ledger

    monkeypatch.setenv("ADVISOR_LEDGER", str(tmp_path / "ledger.jsonl"))
    measured = Finding(rule="dataloader-starvation", title="t", severity=Severity.high, confidence=0.9, message="m",
                       recommendation="r", saving=Saving(ms_per_step=10.0, share_of_step=0.5, basis="b",
                                                         low_ms_per_step=5.0, high_ms_per_step=12.0),
                       verification=Verification(applied="DataLoader num_workers=2", before_ms_per_step=20.0,
                                                 after_ms_per_step=11.0, before_spread_ms=0.3, after_spread_ms=0.4,
                                                 measured_saving_ms_per_step=9.0, inside_range=True,
                                                 clear_of_noise=True, trials=3, steps_timed=20))
    unmeasured = measured.model_copy(update={"rule": "host-bound", "verification": None})
    _to_ledger(argparse.Namespace(target="train.py", script_args=["--epochs", "1"]), [measured, unmeasured])
    (record,) = read(tmp_path / "ledger.jsonl").entries
    assert record.rule == "dataloader-starvation" and record.source == "verify"
    assert record.target == "train.py --epochs 1" and record.fix == "DataLoader num_workers=2"
    assert (record.predicted_ms, record.low_ms, record.high_ms, record.measured_ms) == (10.0, 5.0, 12.0, 9.0)
    assert record.spread_ms == pytest.approx(0.5) and record.before_ms == 20.0 and record.inside
