"""What a saved session folder holds, and how to tell one: names only, no pandas.

Commands ask whether a path is a saved session (or key a cache by the session format)
before they read anything; answering must not import the model and its dependencies.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["EVENTS_FILE", "META_FILE", "SESSION_FORMAT", "is_session_dir"]

SESSION_FORMAT = "advisor-session/1"
# A profile covers a run of hours, days at most: an event's times lie within this of the
# profile's middle start, or they are damage (a trace's reader skips such events, a saved
# session with one is refused).
DAY_NS = 86_400 * 10**9
MAX_SPREAD_NS = 30 * DAY_NS
META_FILE = "session.json"
EVENTS_FILE = "events.parquet"


def is_session_dir(path: str | Path) -> bool:
    return (Path(path) / META_FILE).is_file()
