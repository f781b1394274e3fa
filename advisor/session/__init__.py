"""The Session: one profile as pandas frames plus metadata, and what relates its rows.

Every collector and importer produces a Session; tables, rules and reports read nothing
else. This room holds the model and the work that makes its rows mean something:

    session     the Session, its event schema and metadata, saved to and loaded from disk
    meta        what a session knows besides its events (pydantic models, no pandas)
    layout      what a saved session folder holds, and how to tell one (no pandas)
    saved       a saved session folder checked as it is read back: its layout, its
                metadata's nesting, its columns' types and values' ranges
    attribute   who launched what: GPU work to its launch call and op, ops to steps and
                phases, host-blocking calls to the user's source line
    intervals   unions, overlaps and clipping of time intervals, vectorised
    calls       what the runtime's calls are by name (launch, graph launch, blocking,
                set-up, capture), CUDA and HIP alike
    startup     a start-up first step (far slower than the rest) left out of the window
    busy        how busy the machine was while the run was recorded (the main thread's
                wait for a core): figures in ms stretch with it, shares hold
    copies      events that are copies of others, exact (read once) or a few ns apart
                (said): a profile written twice, or joined with a copy of itself

The names below are the model's (``from advisor.session import Session``).
"""

from advisor._lazy import lazy_exports

# Lazily: a command asks whether its target is a saved session (layout, no pandas) before
# it reads anything, and must not pay for the model's imports to learn that.
_EXPORTS = {
    "EVENT_COLUMNS": "session",
    "EVENTS_FILE": "layout",
    "GPU_KINDS": "session",
    "KINDS": "session",
    "META_FILE": "layout",
    "PHASES": "session",
    "RELATION_COLUMNS": "session",
    "SESSION_FORMAT": "layout",
    "CollectionGap": "meta",
    "CollectorCost": "meta",
    "CollectorInfo": "meta",
    "DeviceInfo": "meta",
    "DistributedInfo": "meta",
    "Session": "session",
    "SessionMeta": "meta",
    "TimedStep": "meta",
    "concat_events": "session",
    "conform_events": "session",
    "empty_events": "session",
    "insert_unrelated": "session",
    "is_session_dir": "layout",
    "one_of": "session",
    "select_rows": "session",
    "take_rows": "session",
    "text": "session",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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
    "CollectorCost",
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
    "one_of",
    "select_rows",
    "take_rows",
    "text",
]
