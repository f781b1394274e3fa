"""Importers: read what other profilers (and advisor itself) wrote into a Session.

    loader            ``load(path)``: a saved session folder or a trace file, decided by
                      what the path is, not by its name
    kineto            the PyTorch profiler / Kineto Chrome trace, plain or gzipped, streamed
    merged            one trace holding several ranks (a merged multi-rank Kineto file),
                      split into a job of ranks
    ncu               Nsight Compute's counters (raw or details CSV page, or a .ncu-rep
                      read through ``ncu --import``), attached to a session
    parts             a large plain trace read in parts, each by a process of its own
    advisor_metadata  what advisor's host collector writes into the traces it exports
    cache             a trace's Session kept (Parquet) for the next command on the same file:
                      the user's own, checksummed, data only
    frames            summary tables as JSON data with their dtypes, for the cache
    ahead             a trace read by a forked process while the command starts up
    forked            work in a forked process, its result sent back through a pipe; how
                      many processes a command may use (its CPUs, ADVISOR_PROCESSES)
    pages             plain pages for advisor's arrays and freed memory given back, where
                      the command asks

A new trace format is a module here that turns the file into events and metadata, and
a branch in ``load``; attribution (who launched what) is the Session's, shared by all.
"""

from advisor._lazy import lazy_exports

# Lazily: the cache's keys (advisor.importers.cache) are worked out before a command knows
# whether it must read anything.
_EXPORTS = {"load": "loader", "load_kineto": "loader"}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["load", "load_kineto"]
