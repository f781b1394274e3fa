"""The commands that show a profile rather than diagnose it: `advisor summary` (the tables),
`advisor timeline` (a Chrome / Perfetto trace with the findings marked), `advisor compare`
(two profiles side by side) and `advisor calibrate` (this machine's peaks); and the
diagnosis they and `diagnose` share (``analyse``: the facade's, rule errors said) and the
check that a report's file can be written before anything runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from advisor.cli.ahead import read_ahead, read_target_ahead
from advisor.cli.opening import job_sources, read_from, say, session_for
from advisor.cli.rules import selection_for
from advisor.errors import UsageError
from advisor.targets import is_script as _is_script


def check_output(path: Path) -> None:
    """A report path that cannot be written is said before a script runs or a trace is
    read, not after: its folder (made if missing) must be writable."""
    if path.is_dir():
        raise UsageError(f"-o {path}: is a folder; give a file name")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or (
            path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"-o {path}: cannot write there ({folder} is not a writable folder)")


def analyse(session, chosen, said: list[str] | None = None, *, read_from: Path | None = None):
    """The diagnosis of ``session`` with the chosen rules (advisor.diagnosis: step model,
    tables, rules, report); rule errors to stderr (and to ``said`` where given). Its tables
    are kept in the session cache entry of the trace file ``read_from`` where one is given
    (``opening.read_from``)."""
    from advisor.cli.progress import spinner
    from advisor.diagnosis import cached_tables, diagnose

    with spinner("Computing the tables and running the rules"):
        diagnosis = diagnose(session, specs=chosen.specs, disabled=chosen.disabled, enabled=chosen.enabled,
                             preview=chosen.preview, tables=cached_tables(read_from))
    from advisor.units import shown_safely

    for error in diagnosis.result.errors:
        print(f"advisor: {shown_safely(str(error))}", file=sys.stderr)
        if said is not None:
            said.append(str(error))
    return diagnosis


def timeline_command(args: argparse.Namespace, kept) -> int:
    from advisor.cli.progress import progress_bar
    from advisor.reports.perfetto import write_timeline

    if args.output is None:
        raise UsageError("timeline needs -o PATH: the trace file to write (.json, or .json.gz to gzip it)")
    check_output(args.output)
    if not _is_script(Path(args.target)):
        from advisor.job import job_sources

        ranks = job_sources([Path(args.target), *(Path(a) for a in args.script_args)])
        if ranks is not None:
            raise UsageError(f"a timeline draws one profile, and {args.target} is a job of {len(ranks)} ranks: pass "
                             f"one of them ({ranks[0]}), or `advisor diagnose {args.target}` for the whole job")
        read_target_ahead(args)
    chosen, _ = selection_for(args, Path(args.target) if _is_script(Path(args.target)) else None)
    session, exit_code = session_for(args, kept=kept)
    diagnosis = analyse(session, chosen, read_from=read_from(args))
    with progress_bar("Writing the timeline", unit="events") as update:
        path = write_timeline(diagnosis.session, diagnosis.findings, args.output, progress=update)
    kept.done()
    print(f"advisor: timeline written to {path}; open it in ui.perfetto.dev or chrome://tracing", file=sys.stderr)
    return exit_code if exit_code is not None else 0


def compare_command(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise UsageError("--top must be at least 1")
    if args.output is not None:
        check_output(args.output)
    for target in (args.before, args.after):
        if _is_script(Path(target)):
            raise UsageError(f"compare reads traces and saved sessions, and {target} is a script: "
                             f"run `advisor diagnose --save DIR {target}` first and compare DIR")
    both = [args.before] if args.after == args.before else [args.before, args.after]
    aheads = dict(zip(both, read_ahead(args, *both)))
    from advisor.reports.compare_report import render_comparison
    from advisor.tables.comparison import compare

    chosen, _ = selection_for(args)
    sides = []
    for target in (args.before, args.after):
        one = argparse.Namespace(**{**vars(args), "target": target, "script_args": [], "steps": None,
                                    "event_budget": None, "with_stack": False, "workers": None, "dask": None,
                                    "save": None, "ahead": aheads.pop(target, None)})
        job = job_sources(one)
        if job is not None:
            sides.append(_job_side(one, job, chosen))
            continue
        session, _ = session_for(one)
        diagnosis = analyse(session, chosen, read_from=read_from(one))
        sides.append((diagnosis.model, diagnosis.tables, diagnosis.findings))
    render_comparison(compare(sides[0], sides[1], top=args.top), args.format, args.output)
    if args.output:
        print(f"advisor: comparison written to {args.output}", file=sys.stderr)
    return 0


def _job_side(args: argparse.Namespace, sources: list[Path], chosen):
    """One side of `compare` that is a job: the lowest rank's session and tables with the
    job's cross-rank tables, and the job's findings (merged across ranks)."""
    from advisor.cli.job import read_job
    from advisor.diagnosis import cached_tables
    from advisor.importers import load
    from advisor.step import build_step_model

    job, diagnosis = read_job(args, sources, chosen, say=say)
    from advisor.units import shown_safely

    for error in diagnosis.errors:
        print(f"advisor: {shown_safely(str(error))}", file=sys.stderr)
    first = Path(job.ranks[0].summary.source)
    model = build_step_model(load(first, use_cache=args.use_cache))
    tables = cached_tables(first if args.use_cache else None)(model, None)
    return model, {**tables, **diagnosis.tables}, diagnosis.findings


def summary_command(args: argparse.Namespace, kept) -> int:
    if not _is_script(Path(args.target)):
        job = job_sources(argparse.Namespace(**{**vars(args), "workers": None, "dask": None}))
        if job is not None:  # a job: its cross-rank tables (one rank's own: `advisor summary DIR/rank-N`)
            from advisor.cli.job import read_job
            from advisor.reports.summary import render_tables
            from advisor.tables import JOB_TABLE_DOCS

            chosen, _ = selection_for(args)
            _, diagnosis = read_job(argparse.Namespace(**{**vars(args), "workers": None, "dask": None,
                                                          "save": None}), job, chosen, say=say)
            text = render_tables(diagnosis.tables, table_docs=JOB_TABLE_DOCS, sort=args.sort, limit=args.limit,
                                 fmt=args.format)
            if text is not None:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
            return 0

        read_target_ahead(args)
    from advisor.diagnosis import cached_tables
    from advisor.reports.summary import render_tables
    from advisor.step import build_step_model
    from advisor.tables import TABLE_DOCS

    session, exit_code = session_for(args, kept=kept)
    tables = cached_tables(read_from(args))(build_step_model(session), args.table)
    text = render_tables(tables, table_docs=TABLE_DOCS, sort=args.sort, limit=args.limit, fmt=args.format)
    if text is not None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()  # a failed write (a full disk) is this command's error, said as one
    kept.done()
    return exit_code if exit_code is not None else 0


def calibrate_command(args: argparse.Namespace) -> int:
    from advisor.knowledge.calibrate import (
        calibrate,
        format_calibration,
        save_calibration,
    )

    result = calibrate(args.device, seconds=args.seconds)
    path = save_calibration(result)
    print(format_calibration(result, path))
    return 0
