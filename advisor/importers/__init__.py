"""Importers: read what other profilers (and advisor itself) wrote into a Session.

    loader            ``load(path)``: a saved session folder or a trace file, decided by
                      what the path is, not by its name
    kineto            the PyTorch profiler / Kineto Chrome trace, plain or gzipped, streamed
    advisor_metadata  what advisor's host collector writes into the traces it exports
    cache             a trace's Session kept (Parquet) for the next command on the same file

A new trace format is a module here that turns the file into events and metadata, and
a branch in ``load``; attribution (who launched what) is the Session's, shared by all.
"""

from advisor.importers.loader import load, load_kineto

__all__ = ["load", "load_kineto"]
