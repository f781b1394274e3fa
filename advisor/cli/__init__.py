"""The `advisor` command line.

    advisor diagnose TARGET [script args...]   run a script, or read a trace or saved session,
                                                and report ranked findings
    advisor verify SCRIPT [script args...]     diagnose, then apply each finding's fix and measure it
    advisor summary TARGET [--table NAME]      print the summary tables
    advisor rules list | show ID               the rules and their documentation
    advisor rules validate PACK | new ID       check a rule pack; start a new rule
    advisor timeline TARGET -o trace.json      the session as a Chrome / Perfetto trace, findings marked
    advisor compare BEFORE AFTER               two profiles side by side: what moved, which findings went
    advisor doctor [--gpu-checks]              can this machine collect; does the collector work on its GPU
    advisor ledger [FILE...]                   how the promised savings held where verify measured them
    advisor mcp                                advisor's analyses as MCP tools, for coding agents (stdio)

Options for advisor come before TARGET; everything after a script's path is the script's
own (as with `python train.py args`). Bad input gets one line on stderr and a non-zero
exit; the exit code of `diagnose SCRIPT` is the script's own, unless --fail-on trips.

The commands live here and only drive the stages below (the target stage, collect,
tables, rules, reports): ``parser`` holds the commands' options and the words after a
target sorted out, ``opening`` what a command opens for its target (a script run under
the collectors, a launch, a job's sources, one profile read) through the target stage,
``ahead`` a trace's read started in a forked process while the imports are made,
``views`` `advisor summary`, `timeline`, `compare` and `calibrate` (and the diagnosis they
share), ``kernel_counters`` --kernel-counters, ``rules`` holds the `advisor rules` commands and the --rules / --config /
--preview options, ``doctor`` `advisor doctor`, ``progress`` the progress bars, ``job``
`advisor diagnose` on a job of many ranks (a folder of rank traces, torchrun), ``keep``
what a run collected, kept on disk until its report is written, and --save's claim on its
folder, ``report_cache`` a trace's report kept for the next diagnose of the same trace
with the same rules and options, and ``scaffold`` `advisor rules new ID` (a pack, a case and
a test to start a rule from), ``verify`` the options of `advisor verify` and the step from
a diagnosis to its findings verified (advisor.verify runs the trials).
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import sys
from pathlib import Path

from advisor.cli.ahead import imports_while_reading, read_target_ahead, reads_only
from advisor.cli.doctor import doctor_command
from advisor.cli.kernel_counters import with_kernel_counters
from advisor.cli.ledger import ledger_command
from advisor.cli.opening import collected, judged, launch, read_from, say, session_for, target_of
from advisor.cli.parser import FAIL_ON_EXIT, SEVERITIES, build_parser, options_after_target
from advisor.cli.rules import rules_command, selection_for
from advisor.cli.verify import check_verify, verified
from advisor.cli.views import (
    analyse,
    calibrate_command,
    check_output,
    compare_command,
    summary_command,
    timeline_command,
)
from advisor.errors import AdvisorError, UsageError
from advisor.paths import special_file
from advisor.targets import is_script as _is_script


def _quiet_stdout() -> None:
    """After a closed pipe: nothing more goes to standard output, not even the flush at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _diagnose(args: argparse.Namespace, kept) -> int:
    """``kept`` (advisor.cli.keep.Kept) holds what was collected on disk until the report
    is written, so a failure after the collection loses none of it."""
    from advisor.cli.report_cache import ReportCache

    # The read starts first, so that looking for a kept report (a digest of the trace's
    # head and tail, of advisor's code and of the plugins installed) does not delay it;
    # where one is found, main stops the read.
    verifying = args.command == "verify" or getattr(args, "verify", False)
    if verifying:
        check_verify(args)
    read_target_ahead(args, imports=False)
    # The report of this trace, rules and options where an earlier run kept it: written
    # from the file, nothing read or run again.
    record = None if verifying else ReportCache.for_args(args)
    if record is not None:
        if args.output is not None:
            check_output(args.output)
        reused = record.get()
        if reused is not None:
            return _reused_report(args, reused)
    imports_while_reading(args)
    said: list[str] = []  # what is said about the rules, for a kept report to say again
    rules_failed = False
    # Rules and configuration first: a bad pack or config stops before a script runs.
    chosen, config = selection_for(args, Path(args.target) if _is_script(Path(args.target)) else None, said)
    if args.output is not None:
        check_output(args.output)
    if args.save:  # never over another profile, and said before anything runs
        from advisor.cli.keep import check_save_dir

        check_save_dir(args.save)
    launched = launch(args)
    found = target_of(args) if launched is None else None  # classified once (advisor.targets)
    sources = launched.sources if found is None else list(found.sources) if found.is_job else None
    session = None
    if found is not None and found.kind == "script":
        session, exit_code, launched = collected(args, kept, spawned_ranks=True)
        session = judged(session, args)
        if launched is not None:  # the script spawned its ranks: they are the job
            say(f"the script started {len(launched.sources)} ranks with torch.multiprocessing.spawn; "
                 "each was profiled")
            sources = launched.sources
    if launched is not None:  # the ranks' own folder, already on disk; --save keeps a copy
        if args.save and Path(launched.folder).resolve() == args.save.resolve():
            kept.saved(args.save)
        else:
            kept.launch(launched.folder)
    if sources is not None:
        from advisor.cli.job import job_report, read_job

        _job, diagnosis = read_job(args, sources, chosen, say=say, launch=launched)
        report = job_report(diagnosis)
        findings = diagnosis.findings
        exit_code = launched.exit_code if launched is not None else None
    else:
        if session is None:
            session, exit_code = session_for(args)
        if args.save:  # as recorded: the start-up step is left out on every reading, not in the file
            from advisor.cli.keep import save_whole

            try:
                save_whole(session, args.save)
            except OSError:
                if _is_script(Path(args.target)):  # the profile exists only here: keep it elsewhere
                    kept.session(session, Path(args.target).stem)
                raise
            finally:  # an interrupt raised by save_whole comes after a whole save
                if (args.save / "session.json").is_file():
                    kept.saved(args.save)
            print(f"advisor: session saved to {args.save}", file=sys.stderr)
        diagnosis = analyse(session, chosen, said, read_from=read_from(args))
        # A rule that failed may not fail next time (a bug fixed, memory freed): its report is not kept.
        rules_failed = bool(diagnosis.result.errors)
        if getattr(args, "kernel_counters", None) is not None:
            diagnosis = with_kernel_counters(args, session, diagnosis, chosen, said)
        session = diagnosis.session
        report = diagnosis.report
        findings = diagnosis.findings
        if verifying:
            findings = verified(args, diagnosis, chosen, say)
            if findings is None:  # --dry-run: the trials listed
                kept.done()
                return 0
            from advisor.diagnosis import with_verified

            report = with_verified(diagnosis, findings)
    from advisor.cli.progress import progress_bar
    from advisor.reports import render

    try:
        with progress_bar("Rendering the report", show=None if args.format == "html" else False) as update:
            render(report, args.format, args.output, progress=update)
    except BrokenPipeError:  # the reader stopped reading (`| head`): the script's exit code all the same
        kept.done()
        _quiet_stdout()
        return exit_code if exit_code is not None else 0
    kept.done()
    if args.output:
        print(f"advisor: report written to {args.output}", file=sys.stderr)
    config_fail_on = config.fail_on.value if config.fail_on else None
    if record is not None and sources is None and session is not None and not rules_failed:
        from advisor.cli.report_cache import Reused, rule_sources
        from advisor.reports import render_json

        record.put(Reused(render_json(report), said, _worst(findings), config_fail_on, config.source),
                   rule_sources(args, config))
    if _failed_on(args, _worst(findings), config_fail_on, config.source):
        return FAIL_ON_EXIT
    return exit_code if exit_code is not None else 0


def _worst(findings) -> int:
    """The worst severity among ``findings`` and those they explain, as an index into
    SEVERITIES (-1 for none)."""
    return max([SEVERITIES.index(f.severity.value) for f in findings] + [_worst(f.explains) for f in findings]
               + [-1])


def _failed_on(args: argparse.Namespace, worst: int, config_fail_on: str | None, config_source: str) -> bool:
    """Whether --fail-on (or fail_on in the configuration) fails this run; says so."""
    fail_on = args.fail_on or config_fail_on
    if not fail_on or worst < SEVERITIES.index(fail_on):
        return False
    asked = "--fail-on" if args.fail_on else f"fail_on in {config_source}"
    print(f"advisor: findings at or above '{fail_on}': failing as asked by {asked}", file=sys.stderr)
    return True


def _reused_report(args: argparse.Namespace, reused) -> int:
    """Write a kept report (advisor.cli.report_cache) as ``--format`` asks: the JSON report
    as it was kept, another format rendered from it."""
    for line in reused.said:
        print(f"advisor: {line}", file=sys.stderr)
    if args.format == "json":
        from advisor.reports._render import write_text

        write_text(reused.report_json, args.output, None, what="the report")
    else:
        from advisor.reports import Report, render

        render(Report.model_validate_json(reused.report_json), args.format, args.output)
    if args.output:
        print(f"advisor: report written to {args.output}", file=sys.stderr)
    return FAIL_ON_EXIT if _failed_on(args, reused.worst, reused.config_fail_on, reused.config_source) else 0


def _mcp() -> int:
    """`advisor mcp`: the Model Context Protocol server, until the client closes it."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UsageError("advisor mcp needs the MCP SDK: pip install 'advisor[mcp]'") from None
    from advisor.api.mcp_server import serve

    serve()
    return 0


def _rules(args: argparse.Namespace) -> int:
    return rules_command(args)


def main(argv: list[str] | None = None) -> int:
    """The `advisor` command's exit code for ``argv`` (the process's arguments by default)."""
    return _main(argv)[0]


def console_main() -> None:
    """The `advisor` program: ``main``, then the process ends. Where it read profiles and
    ran none of the user's code, it ends without the interpreter's teardown, which frees
    every object one by one (0.2 s of a 1.5 s diagnosis of a 35 MB trace): the output is
    written and flushed, the exit handlers run, no thread or child process is left, so
    nothing is lost. A script run here keeps the whole teardown: its own open files and
    finalizers may need it."""
    _whole_stdout()
    _stop_on_signals()
    try:
        code, quick = _main(None)
    except SystemExit as exc:  # argparse's own ends: --help, --version, a usage error
        code, quick = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1), False
    code = _written_out(code)
    if quick:
        _leave(code)
    sys.exit(code)


def _written_out(code: int) -> int:
    """``code`` once standard output is flushed, here rather than at the interpreter's exit,
    where a failure (a full disk, /dev/full) is printed as a traceback. A flush that fails
    is said in one line (where the command had not failed already and said why) and the
    exit code is 1; nothing more is written there."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped reading: as they wished
        _quiet_stdout()
    except (OSError, ValueError) as exc:
        _quiet_stdout()
        if code == 0:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"advisor: the output could not be written: {reason}", file=sys.stderr)
        return code or 1
    return code


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP (a batch scheduler ending the job, a terminal closed) raised as
    advisor.errors.Stopped, a KeyboardInterrupt: the script's profile is kept and reported
    as after Ctrl-C, where Python would end at once and lose it. A signal already ignored
    (nohup) stays ignored."""
    import signal

    from advisor.errors import Stopped

    def stop(signum: int, _frame) -> None:
        raise Stopped(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, stop)


class _WholeWrites(io.RawIOBase):
    """A file descriptor whose every write is whole or raises. Python's own stdout takes a
    short write (a disk that fills midway) as written and drops the rest: a report piped
    to a file on a full disk would end 16 KB in, exit 0."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            written = os.write(self._fd, view)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
        return total  # closing this object leaves the descriptor, the process's, open


def _whole_stdout() -> None:
    """Standard output through _WholeWrites, as it was otherwise (its encoding, its line
    buffering on a terminal). Left as it is where it has no descriptor (a caller's capture)."""
    try:
        fd = sys.stdout.fileno()
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return
    old = sys.stdout
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_WholeWrites(fd)), encoding=getattr(old, "encoding", None),
                                  errors=getattr(old, "errors", None),
                                  line_buffering=bool(getattr(old, "line_buffering", False)))


def _main(argv: list[str] | None) -> tuple[int, bool]:
    """(exit code, whether the process may end without the interpreter's teardown)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = options_after_target(parser, argv, parser.parse_args(argv))
    if args.command is None:
        parser.print_help()
        return 2, False
    from advisor.importers.cache import wanted

    # Read once here (the flag, or ADVISOR_NO_CACHE), and passed down as use_cache.
    args.use_cache = not getattr(args, "no_cache", False) and wanted()
    if reads_only(args):  # no user code runs here: advisor's own arrays on plain pages
        from advisor.importers.pages import plain_pages

        plain_pages()
    from advisor.cli.keep import Kept

    kept = Kept()
    try:
        return _command(parser, args, kept), reads_only(args)
    finally:
        for ahead in getattr(args, "reads_ahead", []):  # a Session not taken (the command stopped first)
            ahead.stop()


def _leave(code: int) -> None:
    """End the process now with ``code``, where nothing else runs in it: its exit handlers
    run and its output is flushed, the interpreter's teardown is skipped."""
    import atexit
    import threading

    if threading.active_count() > 1:  # a thread still running is joined by the normal exit
        return
    atexit._run_exitfuncs()  # logging, multiprocessing (children joined), temporary folders
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # a reader gone (what it read is what it wanted), a stream closed
        pass
    except OSError as exc:  # a full disk, a file size limit: the output is not whole, and that is said
        if code == 0:  # (a command that failed has said why already)
            try:
                os.write(2, f"advisor: the output could not be written: {exc.strerror or exc}\n".encode())
            except OSError:
                pass
        os._exit(code or 1)
    os._exit(code)


def _refuse_special_targets(args: argparse.Namespace) -> None:
    """A target that is not a file or folder of data (a FIFO, a device, /proc/kmsg, which
    blocks its reader until the kernel logs something) refused before anything reads it:
    the read ahead, the report cache's key and the merged-ranks check all look at its
    first bytes before the loader would."""
    from advisor.errors import TraceError

    for target in (getattr(args, name, None) for name in ("target", "before", "after")):
        if not isinstance(target, str) or not target:
            continue
        special = special_file(target)
        if special is not None:
            raise TraceError(f"{target} is {special}, not a trace file or a session folder")


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace, kept) -> int:
    """Run the command; each failure as one line and its exit code."""
    try:
        _refuse_special_targets(args)
        if args.command in ("diagnose", "verify"):
            return _diagnose(args, kept)
        if args.command == "summary":
            return summary_command(args, kept)
        if args.command == "rules":
            return _rules(args)
        if args.command == "calibrate":
            return calibrate_command(args)
        if args.command == "timeline":
            return timeline_command(args, kept)
        if args.command == "compare":
            return compare_command(args)
        if args.command == "doctor":
            return doctor_command(args)
        if args.command == "ledger":
            return ledger_command(args)
        if args.command == "mcp":
            return _mcp()
    # Each failure is one line; where a run had collected a profile, the line says where it is.
    except AdvisorError as exc:
        from advisor.units import shown_safely

        print(f"advisor: {shown_safely(str(exc))}{kept.note()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (advisor.errors.Stopped)
        if os.environ.get("ADVISOR_DEBUG"):
            import traceback

            traceback.print_exc()
        stopped = getattr(exc, "name", None)
        print(f"advisor: {'stopped by ' + stopped if stopped else 'interrupted'}{kept.note()}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except MemoryError:
        print("advisor: out of memory; a trace this large needs more (a job's ranks: --workers 1 holds one rank "
              f"at a time){kept.note()}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk, a folder that cannot be written: the OS's words, in one line
        if isinstance(exc, BrokenPipeError):  # the reader stopped reading (`| head`): as they wished
            kept.done()
            _quiet_stdout()
            return 0
        where = f": {exc.filename}" if exc.filename else ""
        from advisor.units import shown_safely

        print(f"advisor: {shown_safely(f'{exc.strerror or exc}{where}')}{kept.note()}", file=sys.stderr)
        return 1
    except Exception as exc:  # advisor's own bug: still one line, and what was collected is kept
        if os.environ.get("ADVISOR_DEBUG"):
            raise
        message = " ".join(str(exc).split())[:300] or "no message"
        print(f"advisor: internal error ({type(exc).__name__}: {message}); ADVISOR_DEBUG=1 shows where"
              f"{kept.note()}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    console_main()
