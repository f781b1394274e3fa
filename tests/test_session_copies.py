"""A saved session with every row twice, with near-copies, or with a time far from the
rest: the copies read once and said, the near-copies said, the far time refused in one
line; a trace with near-copies said as well."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from advisor.errors import SessionError
from advisor.importers import load
from advisor.rules import run_rules
from advisor.session import Session
from advisor.session.copies import near_copies, without_copies
from advisor.tables import compute_tables

CASE = Path(__file__).resolve().parents[1] / "cases" / "cpu_loss_loop" / "session"


def _edited(tmp_path: Path, edit) -> Path:
    folder = tmp_path / "session"
    shutil.copytree(CASE, folder)
    events = pd.read_parquet(folder / "events.parquet")
    edit(events).to_parquet(folder / "events.parquet", index=False)
    return folder


def _rules(session: Session) -> list[tuple[str, float]]:
    return [(f.rule, round(f.saving.ms_per_step, 3) if f.saving else 0.0)
            for f in run_rules(session, compute_tables(session)).findings]


def test_every_row_twice_is_read_once_and_said(tmp_path):
    original = Session.load(CASE)
    doubled = Session.load(_edited(tmp_path, lambda ev: pd.concat([ev, ev], ignore_index=True)))
    assert len(doubled.events) == len(original.events)
    assert any("copies of another" in note for note in doubled.meta.collector.notes)
    assert _rules(doubled) == _rules(original)


def test_copies_keep_their_links(tmp_path):
    events = pd.DataFrame({"id": [0, 1, 2, 3], "start_ns": [0, 5, 0, 5], "end_ns": [10, 6, 10, 6],
                           "name": ["a", "b", "a", "b"], "parent_op": [-1, 0, -1, 0]})
    kept, dropped = without_copies(events, ("parent_op",))
    assert dropped == 2 and list(kept["parent_op"]) == [-1, 0] and list(kept["id"]) == [0, 1]
    # a copy whose child points at it: the child is kept once, pointing at the original
    events = pd.DataFrame({"id": [0, 1, 2], "start_ns": [0, 0, 5], "end_ns": [10, 10, 6],
                           "name": ["a", "a", "b"], "parent_op": [-1, -1, 1]})
    kept, dropped = without_copies(events, ("parent_op",))
    assert dropped == 1 and list(kept["parent_op"]) == [-1, 0]


def test_near_copies_are_said(tmp_path):
    def shifted(ev: pd.DataFrame) -> pd.DataFrame:
        later = ev.copy()
        later["start_ns"] += 1
        later["end_ns"] += 1
        return pd.concat([ev, later], ignore_index=True)

    session = Session.load(_edited(tmp_path, shifted))
    assert any("within 10 ns" in note for note in session.meta.collector.notes)
    assert not any("within" in note for note in Session.load(CASE).meta.collector.notes)


def test_a_time_far_from_the_rest_is_refused(tmp_path):
    def far(ev: pd.DataFrame) -> pd.DataFrame:
        ev.loc[ev.index[3], "end_ns"] = 2 ** 62
        return ev

    with pytest.raises(SessionError, match="more than 30 days from the rest"):
        Session.load(_edited(tmp_path, far))


def test_near_copies_counted_only_on_one_thread_name_and_duration():
    start = np.array([0, 1, 100, 100, 205])
    end = start + np.array([10, 10, 10, 10, 10])
    names = np.array([1, 1, 2, 2, 2])
    threads = np.array([1, 1, 1, 2, 1])
    assert near_copies(start, end, names, threads) == 1  # 0 and 1; 100 twice on two threads is not


def test_a_trace_joined_with_a_shifted_copy_is_said(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 5}", "pid": 1, "tid": 1, "ts": i * 10.0,
               "dur": 5.0} for i in range(100)]
    shifted = [{**e, "ts": e["ts"] + 0.001} for e in events]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events + shifted}))
    notes = load(path).meta.collector.notes
    assert any("100 events are near-copies of another" in note for note in notes)
