"""Progress bars for long work (reading a large trace, analysing it, rendering a report).

They go to standard error, and only when it is a terminal: a report piped to a file or
read by CI gets no bar codes in it. ``ADVISOR_NO_PROGRESS=1`` turns them off everywhere.

    with progress_bar("Reading trace.json.gz", unit="bytes") as update:
        session = load(path, progress=update)     # update(done, total), or None when off
    with spinner("Computing tables and rules"):
        ...
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["enabled", "progress_bar", "spinner"]

Update = Callable[[int, int], None]


def enabled() -> bool:
    """Whether bars are shown: standard error is a terminal and ADVISOR_NO_PROGRESS is unset."""
    if os.environ.get("ADVISOR_NO_PROGRESS"):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _console():
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def progress_bar(description: str, *, unit: str = "items", show: bool | None = None) -> Iterator[Update | None]:
    """A bar for work of known size; yields ``update(done, total)``, or None when bars are
    off (so callers pass it on as an optional ``progress`` argument). ``unit="bytes"``
    shows sizes, anything else counts."""
    if not (enabled() if show is None else show):
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    amount = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), amount,
                  TextColumn("{task.fields[events]}"), TimeElapsedColumn(), console=_console(),
                  transient=True) as bar:
        task = bar.add_task(description, total=None, events="")

        def update(done: int, total: int, *, events: int | None = None) -> None:
            """``events``: how many events were parsed so far, where the reader says."""
            fields = {} if events is None else {"events": f"{events:,} events"}
            bar.update(task, completed=done, total=total, **fields)

        yield update


@contextmanager
def spinner(description: str, *, show: bool | None = None) -> Iterator[None]:
    """A spinner for work of unknown length."""
    if not (enabled() if show is None else show):
        yield
        return
    with _console().status(description):
        yield
