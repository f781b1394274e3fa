"""Python's cyclic garbage collector, paused while an advisor command starts.

A collection of the oldest generation walks every object the process holds. A command
imports pandas, pydantic, networkx and its own models (hundreds of thousands of objects)
before its work begins, and the collector's thresholds set off such walks over and over
meanwhile, each longer than the last: 50 ms of a 0.75 s diagnosis of a 35 MB trace on
two CPUs, in which nothing was freed (a module's objects live as long as the process).

So a command that reads profiles and runs none of the user's code pauses the collector
from its start (``pause``) until its imports are done (``resume``). Resuming first moves
every object made so far into the permanent generation (``gc.freeze``): later collections
walk only what the work itself makes (re-enabling without it cost more than the pause
saved), and a process forked afterwards does not copy the pages of those objects by
collecting them. A read ahead (advisor.importers.ahead), forked while the collector is
paused, resumes it in its own process once its imports are done; processes that work on
for long (a job's ranks' workers) start after the resume.

The user's code never runs paused: `advisor diagnose train.py` runs the script in
advisor's own process and does not pause, nor does advisor.Profiler inside a job. When the
command is done (``end``), the collector is as the process had it before.
"""

from __future__ import annotations

import gc

__all__ = ["end", "pause", "resume"]

_paused = False  # whether pause() turned the collector off (and resume() has not yet)
_froze = False  # whether resume() froze objects that end() should give back to the collector
_frozen_before = 0  # what the process had frozen itself when pause() was called


def pause() -> None:
    """Turn the collector off until ``resume``; nothing where it is off already (the
    process's own choice, left to it)."""
    global _paused, _frozen_before
    if gc.isenabled():
        _frozen_before = gc.get_freeze_count()
        gc.disable()
        _paused = True


def resume() -> None:
    """Freeze what exists and turn the collector back on, where ``pause`` turned it off;
    otherwise nothing, so it may be called wherever the pause may have to end."""
    global _paused, _froze
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False
        _froze = True


def end() -> None:
    """The collector as the process had it before ``pause``, once the command is done: on
    again where a command ended paused (a kept report written, an error said before its
    imports), and what ``resume`` froze given back to it, unless the process had frozen
    objects of its own. For a process that goes on after the command (a test, a notebook,
    a program calling advisor.cli.main): the `advisor` program itself ends right after."""
    global _paused, _froze
    if _paused:
        gc.enable()
        _paused = False
    if _froze:
        if not _frozen_before:
            gc.unfreeze()
        _froze = False
