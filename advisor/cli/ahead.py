"""A trace read ahead while the command imports what it needs after the read: for each
target that is one trace file, its read starts in a forked process (advisor.importers.ahead)
and the command's own imports are made meanwhile; a command that only reads does not
wait for the rest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from advisor.paths import special_file
from advisor.targets import is_script as _is_script

# What a command needs once its Session is read, by command: imported while the trace is
# read ahead (their imports take longer than reading a trace of tens of MB).
_AFTER_THE_READ = {
    "diagnose": ("advisor.importers.loader", "advisor.step", "advisor.tables", "advisor.rules.engine",
                 "advisor.reports.build", "advisor.diagnosis", "advisor.reports._render"),
    "summary": ("advisor.importers.loader", "advisor.step", "advisor.tables", "advisor.reports.summary"),
    "timeline": ("advisor.importers.loader", "advisor.step", "advisor.tables", "advisor.rules.engine",
                 "advisor.diagnosis", "advisor.reports.perfetto"),
    "compare": ("advisor.importers.loader", "advisor.step", "advisor.tables", "advisor.rules.engine",
                "advisor.diagnosis", "advisor.tables.comparison", "advisor.reports.compare_report"),
}


# What reading a trace needs, where nothing reads it ahead (a large plain trace, read in
# parts; a gzipped one past ahead.MAX_BYTES; one the session cache holds; a saved session;
# a job's folder; one process allowed): the rest waits until it is read.
_FOR_THE_READ = ("advisor.importers.loader",)


def read_ahead(args: argparse.Namespace, *targets: str, imports: bool = True) -> list:
    """For each target that is one trace file, start reading it in a forked process now
    and import, meanwhile, what the command needs once it is read (advisor.importers.ahead);
    ``load`` takes the Session from that process (``ahead`` on the namespace it is given).
    Called before those imports (``imports``: whether to make them now, else
    imports_while_reading does). The reads, None where none was started; they are also
    kept in ``args.reads_ahead`` for ``main`` to stop any whose Session was not taken."""
    from advisor.importers.ahead import start
    from advisor.importers.forked import processes_allowed

    started = []
    for target in targets:
        path = Path(target)
        # A file that is not one of data (/proc/kmsg blocks its reader) is left to load, which says so.
        if _is_script(path) or not path.is_file() or special_file(path) is not None:
            started.append(None)
            continue
        started.append(start(path, processes=processes_allowed(), use_cache=args.use_cache))
    args.reads_ahead = [*getattr(args, "reads_ahead", []), *(s for s in started if s is not None)]
    if imports:
        imports_while_reading(args)
    return started


def imports_while_reading(args: argparse.Namespace) -> None:
    """What the command needs once its trace is read, imported while it is read ahead
    (where nothing is, and no script runs, what reading needs: pandas above all)."""
    import importlib

    if getattr(args, "reads_ahead", None):
        for module in _AFTER_THE_READ.get(args.command, ()):
            importlib.import_module(module)
    elif reads_only(args):
        for module in _FOR_THE_READ:
            importlib.import_module(module)


def read_target_ahead(args: argparse.Namespace, *, imports: bool = True) -> None:
    """TARGET read ahead where it is one trace file (several are a job, read by ranks)."""
    args.ahead = None if args.script_args else read_ahead(args, args.target, imports=imports)[0]


def reads_only(args: argparse.Namespace) -> bool:
    """Whether the command read profiles and ran no code of the user's in this process."""
    if args.command == "compare":
        return not any(_is_script(Path(t)) for t in (args.before, args.after))
    if args.command not in ("diagnose", "summary", "timeline"):
        return False
    from advisor.job.launcher import is_launcher

    return not _is_script(Path(args.target)) and not is_launcher(args.target, args.script_args or [])
