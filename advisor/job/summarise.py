"""One rank of a job, summarised where its data is.

``summarise_rank`` is what a worker process (or a Dask worker) runs for each rank: it reads
the rank's trace or saved session, computes its tables, runs the rules and returns a
:class:`RankSummary`: the rank's report (tables and findings), the figures the job's
`ranks` table needs, and the rank's collective calls in step order for the `collectives`
table. The events never leave the worker; the summary is what travels.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from advisor.errors import AdvisorError

__all__ = ["RankSummary", "RuleChoice", "summarise_rank"]

@dataclass(frozen=True)
class RuleChoice:
    """The rules chosen on the command line, as a worker needs them (picklable)."""

    specs: list[Any] | None = None
    disabled: frozenset[str] = frozenset()
    enabled: frozenset[str] = frozenset()
    preview: bool = False

    @classmethod
    def of(cls, selection: Any) -> RuleChoice:
        """The choice a rule pack selection (advisor.rules.packs) made."""
        return cls(specs=list(selection.specs), disabled=frozenset(selection.disabled),
                   enabled=frozenset(selection.enabled), preview=bool(selection.preview))


@dataclass
class RankSummary:
    """What one rank's worker sends back: small, whatever the size of the trace."""

    source: str
    rank: int | None = None  # from the trace's distributedInfo, where it has one
    world_size: int | None = None
    backend: str = ""
    report: Any = None  # the rank's Report (advisor.reports.report.Report)
    figures: dict[str, float | None] = field(default_factory=dict)
    calls: pd.DataFrame | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    error: str | None = None  # why the rank could not be read at all
    saved_to: str | None = None
    worker_pid: int = 0  # the process that summarised it, and that process's peak RSS then
    worker_peak_rss_bytes: int = 0


def summarise_rank(source: str, *, choice: RuleChoice | None = None, save_to: str | None = None,
                   gpu: str | None = None, use_cache: bool = True) -> RankSummary:
    """Read one rank (a trace file or saved session folder), compute its tables, run the
    rules, and return its summary; a rank that cannot be read comes back with ``error``
    set instead of raising, so one bad rank does not take the job's report down. With
    ``use_cache``, a trace is read through the session cache and its tables kept there."""
    from advisor.diagnosis import cached_tables, diagnose
    from advisor.importers import load
    from advisor.tables.job import collective_calls, rank_figures

    choice = choice or RuleChoice()
    _register_plugin_checks(choice)
    try:
        session = load(Path(source), give_back=True, use_cache=use_cache)  # a command's own process or worker
    except AdvisorError as exc:
        return RankSummary(source=source, error=str(exc))
    except (OSError, ValueError, MemoryError) as exc:
        return RankSummary(source=source, error=f"{source}: {type(exc).__name__}: {exc}")
    read_from = Path(source) if use_cache else None  # (a session folder has no cache entry: computed)
    saved = None
    if save_to:
        session.save(save_to)
        saved = save_to
    if gpu:
        session.meta = session.meta.model_copy(update={"target_gpu": gpu})
    diagnosis = diagnose(session, specs=choice.specs, disabled=choice.disabled, enabled=choice.enabled,
                         preview=choice.preview, tables=cached_tables(read_from))
    session, tables, result, report = diagnosis.session, diagnosis.tables, diagnosis.result, diagnosis.report
    facts = diagnosis.model.facts
    info = session.meta.distributed
    return RankSummary(
        source=source,
        rank=info.rank if info is not None else None,
        world_size=info.world_size if info is not None else None,
        backend=info.backend if info is not None else "",
        report=report,
        figures=rank_figures(session, tables, facts),
        calls=collective_calls(session, facts),
        skipped=dict(result.skipped),
        errors=list(result.errors),
        saved_to=saved,
        worker_pid=os.getpid(),
        worker_peak_rss_bytes=_peak_rss_bytes(),
    )


def _register_plugin_checks(choice: RuleChoice) -> None:
    """In a worker process, the Python checks of installed rule plugins are registered
    only once their packages are imported; do so where a chosen rule needs one."""
    if not choice.specs:
        return
    from advisor.rules.engine import checks
    from advisor.rules.packs.catalog import plugin_packs

    registered = checks()
    if any(not spec.is_data_rule and spec.id not in registered for spec in choice.specs):
        plugin_packs()


def _peak_rss_bytes() -> int:
    """This process's peak RSS so far (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux
