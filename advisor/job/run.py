"""Run the per-rank work of a job where the ranks' data is, and put the ranks in order.

Each rank is summarised by :func:`advisor.job.summarise.summarise_rank`: in a worker
process of its own where ``workers`` asks for them; by default in this process while the
ranks are small (a worker's start-up, a fresh interpreter importing advisor, would cost
more than the rank), the rest in a pool of one worker per core (at most one per rank) once
the ranks read so far say it pays; or on an existing Dask distributed cluster
(``dask_address``), whose workers open the trace files themselves. Only
:class:`RankSummary` objects come back or are kept, so the parent's memory grows with ranks
times summary size, never with events (a rank read here lets its events go before the
next).

``order_ranks`` decides each summary's rank (the trace's distributedInfo, else the file
name, else the order given) and refuses what cannot be one job: ranks of different world
sizes, or the same rank twice.
"""

from __future__ import annotations

import os
import time
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


# What a worker process costs before it reads a byte: a fresh interpreter importing advisor
# (pandas, the rules), about a second on a laptop core. Ranks that take less than that are
# read faster here, one after another (benchmarks/ranks.py).
WORKER_START_S = 1.0
# A rank this large on disk takes longer than that to read (benchmarks/ranks.py: 200 k events,
# 1.3 MiB gzipped, 2.6 s): with such a first rank the pool takes every rank from the start,
# rather than after the first is timed here.
LARGE_RANK_BYTES = 1 << 20


def default_workers(n_ranks: int) -> int:
    return max(1, min(os.cpu_count() or 1, n_ranks))


def summarise_job(sources: list[Path], *, choice: RuleChoice | None = None, workers: int | None = None,
                  dask_address: str | None = None, save_dir: Path | None = None, gpu: str | None = None,
                  say: Callable[[str], None] | None = None, always_pool: bool = False,
                  use_cache: bool = True) -> list[RankSummary]:
    """Each source's RankSummary, in the order given: in this process where one worker is
    asked for (unless ``always_pool``), in a pool of ``workers`` worker processes where
    more are; by default, in this process while the pool would not pay (``_pool_pays``),
    and the ranks left in a pool of one per core once it would. ``use_cache``: each rank's
    trace is read through the session cache (advisor.importers.cache)."""
    say = say or (lambda _line: None)
    texts = [str(s) for s in sources]
    saves: list[str | None] = [str(save_dir / f"rank-source-{i}") if save_dir else None for i in range(len(texts))]
    if dask_address:
        return _on_dask(dask_address, texts, saves, choice, gpu, say, use_cache)
    n = workers or default_workers(len(texts))
    results: list[RankSummary | None] = [None] * len(texts)
    here = 0  # the ranks summarised in this process, the first ones
    if always_pool:
        alone = adaptive = False
    else:
        alone = n <= 1 or len(texts) == 1
        adaptive = not workers and _bytes_on_disk(Path(texts[0])) < LARGE_RANK_BYTES
    if alone or adaptive:
        started = time.perf_counter()
        while here < len(texts):
            if not alone and here and _pool_pays((time.perf_counter() - started) / here, len(texts) - here, n):
                break
            try:
                results[here] = summarise_rank(texts[here], choice=choice, save_to=saves[here], gpu=gpu,
                                               use_cache=use_cache)
            except Exception as exc:  # noqa: BLE001  (as a worker's failure: the rank is lost, not the job)
                results[here] = _lost(texts[here], "its summary failed", exc)
            here += 1
            say(f"read {here} of {len(texts)}: {Path(texts[here - 1]).name}")
    if here == len(texts):
        return [r for r in results if r is not None]
    # spawn, not fork: a forked child would inherit the parent's threads' locks (pyarrow's,
    # the progress bar's) in whatever state they were.
    with ProcessPoolExecutor(max_workers=min(n, len(texts) - here), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(summarise_rank, texts[i], choice=choice, save_to=saves[i], gpu=gpu,
                               use_cache=use_cache): i
                   for i in range(here, len(texts))}
        for done, future in enumerate(as_completed(futures), here + 1):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as exc:  # noqa: BLE001  (a worker that died: the rank is lost, not the job)
                results[i] = _lost(texts[i], "the worker failed", exc)
            say(f"read {done} of {len(texts)}: {Path(texts[i]).name}")
    return [r for r in results if r is not None]


def _lost(source: str, how: str, exc: Exception) -> RankSummary:
    """The summary of a rank whose work failed: the rank is lost, with why, not the job."""
    return RankSummary(source=source, error=f"{source}: {how}: {type(exc).__name__}: {exc}")


def _bytes_on_disk(path: Path) -> int:
    """A trace file's size, or a saved session folder's own files' together (a session's
    files are at its top: no link is followed, no folder walked); 0 where unknown."""
    try:
        if not path.is_dir():
            return path.stat().st_size
        with os.scandir(path) as entries:
            return sum(e.stat(follow_symlinks=False).st_size for e in entries if e.is_file(follow_symlinks=False))
    except OSError:
        return 0


def _pool_pays(per_rank_s: float, left: int, workers: int) -> bool:
    """Whether ``left`` ranks, each taking ``per_rank_s`` here (as the ones read so far
    did), end sooner in a pool of up to ``workers`` processes, each first starting
    (WORKER_START_S), than here one after another."""
    parallel = min(workers, left)
    return parallel > 1 and left * per_rank_s > WORKER_START_S + left * per_rank_s / parallel


def _on_dask(address: str, sources: list[str], saves: list[str | None], choice, gpu, say,
             use_cache: bool) -> list[RankSummary]:
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
        submitted = [client.submit(summarise_rank, source, choice=choice, save_to=save, gpu=gpu,
                                   use_cache=use_cache, pure=False)
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
