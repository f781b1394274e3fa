"""The in-code API: profile a training loop from inside the program, as with paddle.profiler
or torch.profiler, into the same Session, tables, rules and reports as ``advisor diagnose``.

    profiler    advisor.Profiler: schedulers, spans handed to ``on_trace_ready``,
                ``summary()``, ``diagnose()``, ``export()``
    timer       step timing for ``step_info()``, ``timer_only`` and the Perf summary
    events      the user's own ranges: RecordEvent and region

Like the command line, this is a front door: it drives the collectors, then the tables,
rules and reports, and nothing below it imports it.
"""

from __future__ import annotations

from advisor.profiler.events import RecordEvent, region
from advisor.profiler.profiler import (
    Profiler,
    ProfilerState,
    ProfilerTarget,
    SortedKeys,
    export_timeline,
    make_scheduler,
    save_session,
)

__all__ = [
    "Profiler",
    "ProfilerState",
    "ProfilerTarget",
    "RecordEvent",
    "SortedKeys",
    "export_timeline",
    "make_scheduler",
    "region",
    "save_session",
]
