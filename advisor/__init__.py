"""advisor: a performance advisor for deep-learning jobs.

Collect a profile (run a script, or read a trace another profiler wrote), summarise it in
tables, run rules over the tables, and report ranked findings with their evidence.

In code, as with paddle.profiler or torch.profiler:

    with advisor.Profiler(scheduler=(2, 5)) as prof:
        for batch in loader:
            train(batch)
            prof.step()
    prof.summary()
    findings = prof.diagnose()

``advisor.RecordEvent(name)`` / ``advisor.region(name)`` mark the user's own ranges.

In a notebook, ``advisor.diagnose("trace.json.gz")`` returns a Diagnosis that shows its
findings and charts inline, with ``.findings``, ``.tables`` and ``.to_json()``
(advisor.api.notebook).
"""

from __future__ import annotations

from advisor._lazy import lazy_exports as _lazy_exports
from advisor._version import __version__
from advisor.profiler import (
    Profiler,
    ProfilerState,
    ProfilerTarget,
    SortedKeys,
    export_timeline,
    make_scheduler,
    save_session,
)
from advisor.profiler.events import RecordEvent, region

__all__ = [
    "Diagnosis",
    "Profiler",
    "ProfilerState",
    "ProfilerTarget",
    "RecordEvent",
    "SortedKeys",
    "__version__",
    "diagnose",
    "export_timeline",
    "make_scheduler",
    "region",
    "save_session",
]
# Lazily: `import advisor` must not load pandas for a user who only profiles.
_EXPORTS = {"diagnose": "api.notebook", "Diagnosis": "api.notebook"}
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
