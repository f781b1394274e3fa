"""The op-cost tables computed by a forked process while this one computes the others
(advisor.tables.compute_tables) are the tables one process computes."""

from __future__ import annotations

import multiprocessing

import pandas as pd
import pytest
from conftest import synth_trace

from advisor import tables
from advisor.importers.loader import load_kineto
from advisor.tables import ASIDE, compute_tables

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="the tables aside are computed by a forked process")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return load_kineto(synth_trace(tmp_path_factory.mktemp("aside") / "loop.json", 20_000))


@pytest.mark.parametrize("names", [None, ["operator", "model", "kernel"], ["kernel"]])
def test_tables_computed_aside_are_the_tables_computed_here(monkeypatch, session, names, processes):
    processes(1)
    here = compute_tables(session, names)
    processes(2)
    forked = []
    real = tables.Forked.start
    monkeypatch.setattr(tables.Forked, "start", lambda work: forked.append(1) or real(work))
    aside = compute_tables(session, names)
    both = names is None or (set(names) & set(ASIDE) and set(names) - set(ASIDE))
    assert forked == ([1] if both else [])  # a process only where it has tables and this one has others
    assert list(aside) == list(here)
    for name in here:
        pd.testing.assert_frame_equal(aside[name], here[name])
        assert aside[name].attrs == here[name].attrs


def test_tables_aside_whose_process_fails_are_computed_here(monkeypatch, session, processes):
    processes(1)
    here = compute_tables(session)
    processes(2)
    real = tables.Forked.start
    monkeypatch.setattr(tables.Forked, "start", lambda work: real(lambda: 1 / 0))
    again = compute_tables(session)
    assert all(len(here[name]) for name in ("operator", "kernel"))
    for name in here:
        pd.testing.assert_frame_equal(again[name], here[name])


def test_a_users_job_is_never_forked(monkeypatch, session):
    """advisor.Profiler computes tables inside the user's job (CUDA, NCCL, loader threads):
    it forks no process there, whatever ADVISOR_PROCESSES says."""
    monkeypatch.setenv("ADVISOR_PROCESSES", "4")
    forked = []
    monkeypatch.setattr(tables.Forked, "start", lambda work: forked.append(1))
    compute_tables(session)
    assert forked == []


def test_a_large_sessions_tables_give_back_what_they_freed(monkeypatch, session, processes):
    """Past _GIVE_BACK_MIN_EVENTS, the memory each table's work freed is given back before
    the next (advisor.pages.give_back_freed); the tables are the same."""
    processes(1)
    here = compute_tables(session)
    given = []
    monkeypatch.setattr(tables, "_GIVE_BACK_MIN_EVENTS", len(session.events))
    monkeypatch.setattr(tables, "give_back_freed", lambda: given.append(1))
    again = compute_tables(session)
    assert len(given) == len(here)
    for name in here:
        pd.testing.assert_frame_equal(again[name], here[name])
