"""Run the per-rank work of a job where the ranks' data is, and put the ranks in order.

Each rank is summarised by :func:`advisor.job.summarise.summarise_rank` in a worker
process of its own (``workers``; one per core by default, at most one per rank), or on an
existing Dask distributed cluster (``dask_address``), whose workers open the trace files
themselves. Only :class:`RankSummary` objects come back, so the parent's memory grows with
ranks times summary size, never with events.

``order_ranks`` decides each summary's rank (the trace's distributedInfo, else the file
name, else the order given) and refuses what cannot be one job: ranks of different world
sizes, or the same rank twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from advisor.errors import UsageError
from advisor.job.inputs import MAX_RANKS, rank_from_name
from advisor.job.summarise import RankSummary, RuleChoice, summarise_rank

__all__ = ["Job", "JobRank", "order_ranks", "summarise_job"]


@dataclass
class JobRank:
    """One rank of the job: its number, how that number was found, and its summary."""

    rank: int
    rank_from: str  # "distributedInfo", "file name", "launcher" or "order given"
    summary: RankSummary
    exit_code: int | None = None
    ending: str | None = None


@dataclass
class Job:
    """The job's ranks in rank order, and what the reader must know about the set."""

    source: str
    ranks: list[JobRank]
    world_size: int
    missing: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # sources that could not be read, with why
    notes: list[str] = field(default_factory=list)
    command: list[str] | None = None


def default_workers(n_ranks: int) -> int:
    return max(1, min(os.cpu_count() or 1, n_ranks))


def summarise_job(sources: list[Path], *, choice: RuleChoice | None = None, workers: int | None = None,
                  dask_address: str | None = None, save_dir: Path | None = None, gpu: str | None = None,
                  say: Callable[[str], None] | None = None, always_pool: bool = False) -> list[RankSummary]:
    """Each source's RankSummary, in the order given: in this process where one worker is
    asked for (unless ``always_pool``), else in a pool of worker processes."""
    say = say or (lambda _line: None)
    texts = [str(s) for s in sources]
    saves: list[str | None] = [str(save_dir / f"rank-source-{i}") if save_dir else None for i in range(len(texts))]
    if dask_address:
        return _on_dask(dask_address, texts, saves, choice, gpu, say)
    n = workers or default_workers(len(texts))
    if (n <= 1 or len(texts) == 1) and not always_pool:
        out = []
        for i, (source, save) in enumerate(zip(texts, saves)):
            out.append(summarise_rank(source, choice=choice, save_to=save, gpu=gpu))
            say(f"read {i + 1} of {len(texts)}: {Path(source).name}")
        return out
    results: list[RankSummary | None] = [None] * len(texts)
    # spawn, not fork: a forked child would inherit the parent's threads' locks (pyarrow's,
    # the progress bar's) in whatever state they were.
    with ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(summarise_rank, source, choice=choice, save_to=save, gpu=gpu): i
                   for i, (source, save) in enumerate(zip(texts, saves))}
        for done, future in enumerate(as_completed(futures), 1):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as exc:  # noqa: BLE001  (a worker that died: the rank is lost, not the job)
                results[i] = RankSummary(source=texts[i], error=f"{texts[i]}: the worker failed: "
                                                                f"{type(exc).__name__}: {exc}")
            say(f"read {done} of {len(texts)}: {Path(texts[i]).name}")
    return [r for r in results if r is not None]


def _on_dask(address: str, sources: list[str], saves: list[str | None], choice, gpu, say) -> list[RankSummary]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise UsageError("--dask needs Dask distributed: pip install 'advisor[dask]'") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise UsageError(f"--dask {address}: cannot reach the scheduler ({exc})") from None
    try:
        say(f"sending {len(sources)} ranks to the Dask cluster at {address}")
        submitted = [client.submit(summarise_rank, source, choice=choice, save_to=save, gpu=gpu, pure=False)
                     for source, save in zip(sources, saves)]
        where = {future.key: i for i, future in enumerate(submitted)}
        results: list[RankSummary | None] = [None] * len(submitted)
        # Each summary taken as it arrives and its future let go (no list holds them), so the
        # cluster keeps only the ranks not yet collected, not every result until the last.
        arriving = as_completed(submitted, with_results=True)
        del submitted
        for done, (future, summary) in enumerate(arriving, 1):
            results[where[future.key]] = summary
            if done % 100 == 0 or done == len(results):
                say(f"read {done} of {len(results)} ranks")
        return [r for r in results if r is not None]
    finally:
        client.close()


def order_ranks(summaries: list[RankSummary], *, source: str, launcher_ranks: list[int] | None = None) -> Job:
    """The job from its summaries: ranks numbered and ordered, bad sets refused."""
    readable = [s for s in summaries if s.error is None]
    failed = [s.error or s.source for s in summaries if s.error is not None]
    if not readable:
        raise UsageError("no rank of the job could be read: " + "; ".join(failed))
    sizes = {s.world_size for s in readable if s.world_size}
    too_large = [s for s in readable if (s.world_size or 0) > MAX_RANKS or (s.rank or 0) >= MAX_RANKS]
    if too_large:
        raise UsageError(f"{Path(too_large[0].source).name} says it is rank {too_large[0].rank} of "
                         f"{too_large[0].world_size}: past the {MAX_RANKS:,} ranks advisor reads (damaged "
                         "distributedInfo?)")
    if len(sizes) > 1:
        by_size = ", ".join(f"world size {s.world_size} in {Path(s.source).name}" for s in readable if s.world_size)
        raise UsageError(f"these traces are ranks of different jobs ({by_size})")
    ranks: list[JobRank] = []
    for i, summary in enumerate(summaries):
        if summary.error is not None:
            continue
        if launcher_ranks is not None:
            ranks.append(JobRank(launcher_ranks[i], "launcher", summary))
        elif summary.rank is not None and summary.world_size:
            ranks.append(JobRank(summary.rank, "distributedInfo", summary))
        elif (named := rank_from_name(summary.source)) is not None:
            ranks.append(JobRank(named, "file name", summary))
        else:
            ranks.append(JobRank(i, "order given", summary))
    seen: dict[int, str] = {}
    for entry in ranks:
        if entry.rank in seen:
            raise UsageError(f"rank {entry.rank} appears twice ({Path(seen[entry.rank]).name} and "
                             f"{Path(entry.summary.source).name}, by {entry.rank_from}): give each rank once")
        seen[entry.rank] = entry.summary.source
    ranks.sort(key=lambda r: r.rank)
    world = sizes.pop() if sizes else max(len(summaries), max(seen) + 1)
    missing = sorted(set(range(world)) - set(seen))
    notes = []
    how = sorted({r.rank_from for r in ranks})
    notes.append(f"Ranks numbered by {' and '.join(how)}.")
    if missing:
        notes.append(f"Not in the job's profile: rank{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(map(str, missing))} of {world}; the cross-rank tables cover the ranks read.")
    for why in failed:
        notes.append(f"A rank could not be read and is left out: {why}")
    return Job(source=source, ranks=ranks, world_size=world, missing=missing, failed=failed, notes=notes)
