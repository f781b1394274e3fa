"""advisor's analysis turns off numpy's huge-page advice; a user's script that advisor runs
gets numpy's setting back while it runs (advisor.pages)."""

from __future__ import annotations

import pytest

from advisor import pages

numpy_switch = pages._setter()
pytestmark = pytest.mark.skipif(numpy_switch is None, reason="this numpy has no huge-page switch")


def _current() -> bool:
    value = numpy_switch(True)
    numpy_switch(value)
    return value


@pytest.fixture
def restore():
    before, saved = _current(), pages._before
    yield
    numpy_switch(before)
    pages._before = saved


def test_plain_pages_turns_the_advice_off_and_numpy_pages_gives_it_back(restore):
    numpy_switch(True)
    pages._before = None
    pages.plain_pages()
    assert _current() is False
    with pages.numpy_pages():
        assert _current() is True
    assert _current() is False
    pages.plain_pages()  # twice: numpy's own setting is still the one given back
    with pages.numpy_pages():
        assert _current() is True


def test_numpy_pages_leaves_the_setting_alone_before_plain_pages(restore):
    numpy_switch(False)
    pages._before = None
    with pages.numpy_pages():
        assert _current() is False


def test_a_script_advisor_runs_sees_numpys_setting(tmp_path, restore):
    from advisor.collect import run_script

    numpy_switch(True)
    pages._before = None
    pages.plain_pages()
    seen = []
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    run = run_script(script, call=lambda: seen.append(_current()), sample_interval_s=None,
                     stack_interval_s=None)
    assert seen == [True]
    assert _current() is False
    if run.work_dir is not None:
        import shutil

        shutil.rmtree(run.work_dir, ignore_errors=True)


def test_freed_memory_is_given_back_in_advisors_analysis_only(monkeypatch):
    """advisor.Profiler reads and summarises inside the user's job: no malloc_trim there;
    advisor's own commands (plain_pages) give freed memory back."""
    import ctypes
    import sys

    calls = []

    class Trim:  # a C function: argtypes set, then called
        argtypes = None

        def __call__(self, pad):
            calls.append(pad)

    monkeypatch.setattr(ctypes, "CDLL", lambda name: type("Libc", (), {"malloc_trim": Trim()})())
    monkeypatch.setattr(sys, "platform", "linux")
    pages.give_back_freed()
    assert calls == []  # a user's process
    monkeypatch.setattr(pages, "_analysis", True)
    pages.give_back_freed()
    assert calls == [0]
