"""The `advisor` command line's parser: its commands and options, argparse's errors said in
one line, and the words a user types after a target sorted out (a trace's target takes
advisor's own options after it; a script's are its own, and those of advisor's that went
to it are named in the hint).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from advisor._version import __version__
from advisor.cli.doctor import add_doctor_parser
from advisor.cli.job import add_job_options
from advisor.cli.ledger import add_ledger_parser
from advisor.cli.rules import add_rule_options, add_rules_parser
from advisor.cli.verify import VERIFY_HELP, add_verify_options

__all__ = ["FAIL_ON_EXIT", "SEVERITIES", "build_parser", "options_after_target", "options_hint"]


SEVERITIES = ("info", "low", "medium", "high", "critical")


FAIL_ON_EXIT = 3


def _add_collection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", metavar="A:B", default=None,
                        help="for a script: record steps A to B-1 (A:, :B, N or all); default 2:7, after a "
                             "warm-up of two steps; the other steps are timed, not recorded")
    parser.add_argument("--event-budget", type=int, default=None, metavar="N",
                        help="for a script with --steps all: stop recording once N events are recorded "
                             "(default 3,000,000)")
    parser.add_argument("--run-to-end", action="store_true",
                        help="for a script: run it whole (by default advisor stops it once the recorded window and "
                             "300 steps after it, or a minute of them, are timed)")
    parser.add_argument("--with-stack", action="store_true",
                        help="for a script: also record Python stacks with torch.profiler (slow: every Python "
                             "call is an event); without it a sampler finds where Python time goes")
    parser.add_argument("--gpu", metavar="NAME",
                        help="judge the profile against this GPU from the knowledge base (e.g. A100, h100-sxm); "
                             "for a CPU run: which matrix shapes would miss its tensor cores in fp16")
    parser.add_argument("--collector", choices=["auto", "host"], default="auto",
                        help="for a script: 'auto' records the GPU with CUPTI where it can, 'host' "
                             "records the host side only (torch.profiler, CPU activities)")
    parser.add_argument("--kernel-counters", nargs="?", const="5", default=None, metavar="N|REGEX",
                        help="for a script on a GPU: run it once more under Nsight Compute for the top N kernels "
                             "by GPU time (default 5), or those matching REGEX, and say why each is slow")
    parser.add_argument("--ncu", action="append", type=Path, default=None, metavar="REPORT",
                        help="Nsight Compute counters for the profile's kernels: an export (ncu --import R --csv "
                             "--page raw|details > FILE.csv, either or both) or an .ncu-rep (read with ncu); repeatable")


def _add_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="read traces afresh and keep nothing in the session cache (see docs/traces.md: The cache)")


def _add_target(parser: argparse.ArgumentParser, with_script_args: bool, *, jobs: bool = True) -> None:
    what = "a training script (.py), a PyTorch profiler trace (.json / .json.gz), "
    what += ("a saved session folder, or a job: a folder of rank traces, several traces, or a saved job folder"
             if jobs else "or a saved session folder (of a job: one rank's)")
    parser.add_argument("target", help=what)
    if with_script_args:
        parser.add_argument("script_args", nargs=argparse.REMAINDER,
                            help="arguments passed to the script, as python would")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error said in one line like every other bad input."""

    def error(self, message: str):  # type: ignore[override]
        # The script's own arguments are optional however argparse words it.
        message = message.replace("target, script_args", "target")
        self.exit(2, f"advisor: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="advisor",
        description="Profile a deep-learning job and get ranked, evidence-backed recommendations.",
    )
    parser.add_argument("--version", action="version", version=f"advisor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    diagnose = sub.add_parser("diagnose", help="run or read a profile and report ranked findings",
                              description="Diagnose a training script, a trace or a saved session.")
    diagnose.add_argument("--format", "-f", default="terminal", choices=["terminal", "json", "markdown", "html"],
                          help="report format (default: terminal); html is one self-contained page with charts")
    diagnose.add_argument("-o", "--output", type=Path, help="write the report to this file instead of stdout")
    diagnose.add_argument("--save", type=Path, metavar="DIR",
                          help="save the session to DIR so `advisor diagnose DIR` renders it again")
    diagnose.add_argument("--fail-on", choices=SEVERITIES, metavar="SEVERITY",
                          help=f"exit {FAIL_ON_EXIT} if a finding is at or above SEVERITY ({', '.join(SEVERITIES)})")
    add_rule_options(diagnose)
    _add_collection(diagnose)
    add_job_options(diagnose)
    _add_cache(diagnose)
    add_verify_options(diagnose, flag=True)
    _add_target(diagnose, with_script_args=True)

    verify = sub.add_parser("verify", help="diagnose a script, then apply each finding's fix and measure it",
                            description="Diagnose a training script, then, for each finding whose fix advisor can "
                                        "apply from outside the script, run the script again with the fix and "
                                        "without it, alternately, and report the measured saving beside the "
                                        "predicted one. " + VERIFY_HELP)
    verify.add_argument("--format", "-f", default="terminal", choices=["terminal", "json", "markdown", "html"],
                        help="report format (default: terminal)")
    verify.add_argument("-o", "--output", type=Path, help="write the report to this file instead of stdout")
    verify.add_argument("--fail-on", choices=SEVERITIES, metavar="SEVERITY",
                        help=f"exit {FAIL_ON_EXIT} if a finding is at or above SEVERITY")
    verify.add_argument("--save", type=Path, metavar="DIR",
                        help="save the diagnosed session to DIR so `advisor diagnose DIR` renders it again")
    add_rule_options(verify)
    _add_collection(verify)
    add_job_options(verify)
    _add_cache(verify)
    add_verify_options(verify, flag=False)
    verify.add_argument("target", help="a training script (.py): verify runs it, as python would")
    verify.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script, as python "
                                                                      "would")

    sub.add_parser("mcp", help="serve advisor's analyses to coding agents over the Model Context Protocol (stdio)",
                   description="A Model Context Protocol server on stdin/stdout with the tools diagnose, summary, "
                               "compare, explain and verify (which runs the user's script). Needs "
                               "pip install 'advisor[mcp]'. Register it with an agent client as the command "
                               "`advisor mcp`.")

    summary = sub.add_parser("summary", help="print the summary tables of a profile")
    summary.add_argument("--table", "-t", action="append", metavar="NAME",
                         help="only this table (repeatable); default: all")
    summary.add_argument("--sort", metavar="COLUMN", help="sort rows by this column, largest first")
    summary.add_argument("--limit", type=int, default=20, help="rows per table (default: 20; 0 for all)")
    summary.add_argument("--format", "-f", default="terminal", choices=["terminal", "csv", "json"],
                         help="output format (default: terminal)")
    _add_collection(summary)
    _add_cache(summary)
    _add_target(summary, with_script_args=True)

    calibrate = sub.add_parser("calibrate", help="measure this machine's peak matmul FLOP/s and memory bandwidth",
                               description="Measure and store this machine's peaks, so CPU runs get a real roofline.")
    calibrate.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or all (default: cpu)")
    calibrate.add_argument("--seconds", type=float, default=8.0, help="time budget per device (default: 8)")

    timeline = sub.add_parser("timeline", help="write the profile as a Chrome / Perfetto trace with the findings marked",
                              description="Write the session as Chrome-trace JSON (Perfetto, chrome://tracing), "
                                          "each finding marked on the events it cites.")
    # Not required=True: after a trace target the options are parsed a second time (see
    # _options_after_target), so the check is _timeline's.
    timeline.add_argument("-o", "--output", type=Path,
                          help="the trace file to write (.json, or .json.gz to gzip it); required")
    add_rule_options(timeline)
    _add_collection(timeline)
    _add_cache(timeline)
    _add_target(timeline, with_script_args=True, jobs=False)

    compare = sub.add_parser("compare", help="compare two profiles: step time, phases, moved rows, findings",
                             description="Set two traces or saved sessions side by side (before and after a change).")
    compare.add_argument("before", help="the profile before: a trace (.json / .json.gz) or a saved session folder")
    compare.add_argument("after", help="the profile after, likewise")
    compare.add_argument("--format", "-f", default="terminal", choices=["terminal", "json", "markdown"],
                         help="output format (default: terminal)")
    compare.add_argument("-o", "--output", type=Path, help="write the comparison to this file instead of stdout")
    compare.add_argument("--top", type=int, default=10, help="moved rows shown per table (default: 10)")
    compare.add_argument("--gpu", metavar="NAME", help="judge both profiles against this GPU from the knowledge base")
    _add_cache(compare)
    add_rule_options(compare)

    add_rules_parser(sub)
    add_doctor_parser(sub)
    add_ledger_parser(sub)
    return parser


# advisor's own options that a training script is unlikely to take (not --steps, --gpu,
# --config or --workers): after the script they are the script's, and its argparse refuses
# them with exit code 2.
_ADVISOR_OPTIONS = ("--format", "-f", "-o", "--output", "--save", "--rules", "--fail-on", "--no-cache", "--preview",
                    "--collector", "--with-stack", "--event-budget", "--dask", "--ncu", "--kernel-counters", "--table",
                    "--run-to-end")


_ADVISOR_FLAGS = ("--no-cache", "--preview", "--with-stack", "--run-to-end")  # options that take no value


def options_hint(script: Path, exit_code: int, script_args: list[str], command: str) -> str:
    """Where a script refused arguments that are advisor's own options (an argparse exit,
    code 2), the same command with them before the script."""
    if exit_code != 2:
        return ""
    ours: list[str] = []
    rest: list[str] = []
    words = iter(script_args)
    for word in words:
        name = word.split("=", 1)[0]
        if name in _ADVISOR_OPTIONS:
            ours.append(word)
            if "=" not in word and name not in _ADVISOR_FLAGS:
                value = next(words, None)
                if value is not None:
                    ours.append(value)
        else:
            rest.append(word)
    if not ours:
        return ""
    return (f". {' '.join(o for o in ours if o.startswith('-'))} went to the script: advisor's options go before "
            f"it: advisor {command} {' '.join(ours)} {script}{''.join(' ' + w for w in rest)}")


def options_after_target(parser: argparse.ArgumentParser, argv: list[str],
                          args: argparse.Namespace) -> argparse.Namespace:
    """For a trace or session target, words after it are advisor's own options
    (`advisor diagnose trace.json --format json`); only a script takes arguments."""
    if getattr(args, "target", None) is None:
        return args
    from advisor.job.launcher import is_launcher

    if is_launcher(args.target, args.script_args or []):
        return args
    if Path(args.target).suffix == ".py":  # advisor.targets.is_script, without its imports
        # argparse drops a "--" that follows the script; python would pass it on.
        p = len(argv) - len(args.script_args) - 1
        if 1 <= p < len(argv) and argv[p] == "--" and argv[p - 1] == args.target:
            args.script_args = ["--", *args.script_args]
        return args
    if not args.script_args:
        return args
    position = len(argv) - len(args.script_args) - 1
    if position < 0 or argv[position] != args.target:
        return args
    reordered = argv[:position] + argv[position + 1:] + ["--", args.target]
    again = parser.parse_args(reordered)
    if again.target != args.target:  # a bare word after it took its place: not an option, so an error
        return args
    if again.script_args:  # argparse keeps the "--" separator in a REMAINDER
        again.script_args = [a for a in again.script_args if a != "--"]
    return again
