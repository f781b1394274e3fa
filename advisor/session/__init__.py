"""The Session: one profile as pandas frames plus metadata, and what relates its rows.

Every collector and importer produces a Session; tables, rules and reports read nothing
else. This room holds the model and the work that makes its rows mean something:

    model       the Session, its event schema and metadata, saved to and loaded from disk
    attribute   who launched what: GPU work to its launch call and op, ops to steps and
                phases, host-blocking calls to the user's source line
    intervals   unions, overlaps and clipping of time intervals, vectorised
    startup     a start-up first step (far slower than the rest) left out of the window

The names below are the model's (``from advisor.session import Session``).
"""

from advisor.session.model import (
    EVENT_COLUMNS,
    EVENTS_FILE,
    GPU_KINDS,
    KINDS,
    META_FILE,
    PHASES,
    RELATION_COLUMNS,
    SESSION_FORMAT,
    CollectionGap,
    CollectorInfo,
    DeviceInfo,
    DistributedInfo,
    Session,
    SessionMeta,
    TimedStep,
    concat_events,
    conform_events,
    empty_events,
    insert_unrelated,
    is_session_dir,
    text,
)

__all__ = [
    "EVENTS_FILE",
    "EVENT_COLUMNS",
    "GPU_KINDS",
    "KINDS",
    "META_FILE",
    "PHASES",
    "RELATION_COLUMNS",
    "SESSION_FORMAT",
    "CollectionGap",
    "CollectorInfo",
    "DeviceInfo",
    "DistributedInfo",
    "Session",
    "SessionMeta",
    "TimedStep",
    "concat_events",
    "conform_events",
    "empty_events",
    "insert_unrelated",
    "is_session_dir",
    "text",
]
