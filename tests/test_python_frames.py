"""A trace's Python frames (python_function, torch.profiler's with_stack=True) are kept as
far as the tables and the call stacks need them (advisor.session.attribute): the frames on
the thread that runs the steps that overlap the steps; the others give the call stacks of
blocking calls on their threads, and are then let go. Every table is what it is with all
the frames kept."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from builders import synth_trace

from advisor.importers.loader import load_kineto
from advisor.session import attribute as attribution
from advisor.step import build_step_model
from advisor.tables import compute_tables

MAIN, OTHER = 4242, 4243  # the synthetic loop's step thread, and its second (backward) thread


def steady_of(session):
    """The session as its step model judges it."""
    return build_step_model(session).session


def _frame(name: str, ts: float, dur: float, tid: int = MAIN) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 4242, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Python id": 1, "Python parent id": None}}


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """The synthetic loop with Python frames: one around the whole loop (from before the
    first step), one per step, one per op and in the gaps after them; frames before the
    steps; frames on the other thread, one holding a blocking call."""
    path = synth_trace(tmp_path_factory.mktemp("frames") / "loop.json", 5000)
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    first, last = steps[0]["ts"], max(s["ts"] + s["dur"] for s in steps)
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["tid"] == MAIN]
    frames = [_frame("train.py(50): main", first - 500, last - first + 1000)]
    frames += [_frame("train.py(60): train_step", s["ts"] + 0.5, s["dur"] - 1) for s in steps]
    for op in ops[::2]:
        frames.append(_frame("torch/nn/modules/module.py(1736): _call_impl", op["ts"] - 0.25, op["dur"] + 0.5))
        frames.append(_frame("model.py(20): helper", op["ts"] + op["dur"] + 0.5, 1.0))
    frames += [_frame("setup.py(3): build", first - 400 + i * 3, 2.0) for i in range(100)]
    frames += [_frame("threading.py(1002): run", first + i * 40, 30.0, tid=OTHER) for i in range(100)]
    # A blocking call on the other thread, inside one of its frames (at first + 400).
    frames.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 4242, "tid": OTHER,
                   "ts": first + 405, "dur": 10.0, "args": {"correlation": 999_999}})
    document["traceEvents"] = events + frames
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(scope="module")
def sessions(trace):
    """The session as read, and as read with every Python frame kept."""
    kept = pytest.MonkeyPatch()
    kept.setattr(attribution, "_python_the_tables_read", lambda ev, main: ev)
    try:
        whole = load_kineto(trace)
    finally:
        kept.undo()
    return load_kineto(trace), whole


def test_frames_nothing_reads_are_let_go(sessions):
    session, whole = sessions
    ev, all_ev = session.events, whole.events
    python = ev[ev["kind"] == "python"]
    assert set(python["tid"]) == {MAIN}
    assert not python["name"].isin(["setup.py(3): build"]).any()
    assert python["name"].isin(["train.py(50): main"]).any()  # it begins before the steps, and holds them
    dropped = len(all_ev) - len(ev)
    assert dropped == 200
    # The blocking call on the other thread got its stack from the frames let go.
    sync = ev[(ev["name"] == "cudaStreamSynchronize") & (ev["tid"] == OTHER)]
    assert list(sync["call_stack"].astype(str)) == ["threading.py(1002): run"]


def test_ids_and_relations_are_renumbered(sessions):
    session, whole = sessions
    ev = session.events
    assert (ev["id"].to_numpy() == np.arange(len(ev))).all()
    kinds = ev["kind"].astype(str).to_numpy()
    for column, pointing_at in (("parent_op", {"op"}), ("top_op", {"op"}), ("launch", {"runtime", "driver"})):
        ids = ev[column].to_numpy()
        assert set(kinds[ids[ids >= 0]]) <= pointing_at, column
        # The same rows are linked as with every frame kept (a frame's own link goes with it):
        # compare by (name, start).
        def pairs(frame):
            values = frame[column].to_numpy()
            has = (values >= 0) & (frame["kind"] != "python").to_numpy()
            names, starts = frame["name"].astype(str).to_numpy(), frame["start_ns"].to_numpy()
            return sorted(zip(names[has], starts[has], names[values[has]], starts[values[has]]))
        assert pairs(ev) == pairs(whole.events), column


@pytest.mark.parametrize("steady", [False, True])
def test_every_table_is_the_same_as_with_every_frame(sessions, steady, monkeypatch):
    monkeypatch.setenv("ADVISOR_PROCESSES", "1")
    session, whole = sessions
    if steady:
        session, whole = steady_of(session), steady_of(whole)
    tables, all_tables = compute_tables(session), compute_tables(whole)
    assert len(tables["gpu_idle_host"]) > 2 and (tables["gpu_idle_host"]["source"] == "python").any()
    for name, frame in tables.items():
        other = all_tables[name]
        if name == "host_sync":  # its example rows are named by id, which the frames let go renumber
            frame, other = frame.drop(columns="example_event_ids"), other.drop(columns="example_event_ids")
        pd.testing.assert_frame_equal(frame, other, obj=name)
