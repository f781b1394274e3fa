"""Jobs of many ranks: one diagnosis for every rank, summarised where each rank lives.

    inputs      which targets make a job (a folder of rank traces, several traces, a
                saved job with its job.json) and a rank number from a file name
    summarise   one rank's summary, made in a worker: its report, its figures for the
                ranks table, its collective calls (the events stay in the worker)
    run         the per-rank work in worker processes or on a Dask cluster; ranks
                numbered and ordered, sets that are not one job refused
    diagnose    the job's cross-rank tables, findings merged across ranks, the rules that
                judge the job as a whole, and the report's job section
    launcher    whether a command is a torchrun launch (asked of every target)
    launch      `advisor diagnose torchrun ...`: every rank of a launched job recorded
    rank_main   what each launched rank runs: the script under the collector, saved

The events of a rank never reach the parent process: only summaries travel.
"""

from advisor._lazy import lazy_exports

# Lazily: `advisor diagnose trace.json` asks whether its target is a job before it reads
# anything, and must not pay for the job's tables and reports to learn that it is not.
_EXPORTS = {
    "JobDiagnosis": "diagnose",
    "diagnose_job": "diagnose",
    "is_job_dir": "inputs",
    "job_sources": "inputs",
    "rank_from_name": "inputs",
    "Job": "run",
    "JobRank": "run",
    "order_ranks": "run",
    "summarise_job": "run",
    "RankSummary": "summarise",
    "RuleChoice": "summarise",
    "summarise_rank": "summarise",
}

__all__ = [
    "Job",
    "JobDiagnosis",
    "JobRank",
    "RankSummary",
    "RuleChoice",
    "diagnose_job",
    "is_job_dir",
    "job_sources",
    "order_ranks",
    "rank_from_name",
    "summarise_job",
    "summarise_rank",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
