"""`advisor diagnose` on a job: a folder of rank traces, several traces, or a saved job.

The ranks are summarised in worker processes (--workers) or on a Dask cluster (--dask);
--save keeps one session per rank (rank-N/) and a job.json manifest, so `advisor diagnose
DIR` renders the job again.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from advisor.errors import UsageError


def add_job_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="for a job of many ranks: summarise ranks in N worker processes (default: small ranks "
                             "in advisor's own process, the others in one worker per core, at most one per rank)")
    parser.add_argument("--dask", metavar="ADDRESS", default=None,
                        help="for a job of many ranks: summarise each rank on this Dask distributed scheduler "
                             "(tcp://host:8786); its workers open the trace files, so the paths must be theirs too")


def read_job(args: argparse.Namespace, sources: list[Path], chosen, *, say, launch=None):
    """The diagnosed job for ``sources`` (one per rank), saved where --save asks. After a
    launch (advisor.job.launch) the ranks saved themselves and ``launch`` says how each
    ended; a saved job's manifest says the same."""
    from advisor.cli.keep import check_save_dir
    from advisor.job import RuleChoice, diagnose_job, order_ranks, summarise_job
    from advisor.job.inputs import is_job_dir, read_manifest, write_manifest

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    target = Path(args.target)
    if launch is None and is_job_dir(target):
        from advisor.job.launch import Launch

        launch = Launch.from_manifest(target, read_manifest(target))
    save = getattr(args, "save", None)
    copy_to = save if save and (launch is None or Path(launch.folder).resolve() != save.resolve()) else None
    if copy_to:
        check_save_dir(copy_to)
        copy_to.mkdir(parents=True, exist_ok=True)
    gpu = None
    if args.gpu:
        from advisor.knowledge.hardware import gpu_profile

        gpu = gpu_profile(args.gpu).id
    choice = RuleChoice.of(chosen)
    summaries = summarise_job(sources, choice=choice, workers=args.workers, dask_address=args.dask,
                              save_dir=copy_to, gpu=gpu, say=say, use_cache=args.use_cache)
    job = order_ranks(summaries, source=" ".join(launch.command) if launch is not None and launch.command
                      else str(target), launcher_ranks=launch.ranks if launch is not None and launch.ranks else None)
    if launch is not None:
        launch.annotate(job)
    if save:
        entries = []
        for entry in job.ranks:
            saved = Path(entry.summary.saved_to or entry.summary.source)
            final = save / f"rank-{entry.rank}"
            if saved.resolve() != final.resolve():
                shutil.move(str(saved), final)
            if launch is not None:  # a launch's ranks were saved aside: point at the copies kept
                entry.summary.source = str(final)
            entries.append({"rank": entry.rank, "rank_from": entry.rank_from, "session": final.name,
                            "source": entry.summary.source, "exit_code": entry.exit_code, "ending": entry.ending})
        write_manifest(save, entries, command=job.command,
                       exit_code=launch.exit_code if launch is not None else None, world_size=job.world_size)
        print(f"advisor: job of {len(entries)} ranks saved to {save}", file=sys.stderr)
    kept = save is not None or launch is None or is_job_dir(target)
    return job, diagnose_job(job, choice, sources_kept=kept)


def job_report(diagnosis):
    """The job's report, its rules' errors said on stderr."""
    from advisor.units import shown_safely

    for error in diagnosis.errors:
        print(f"advisor: {shown_safely(str(error))}", file=sys.stderr)
    return diagnosis.report()
