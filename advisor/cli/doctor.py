"""`advisor doctor`: whether this machine can collect, and, with --gpu-checks, whether the
collector does its job on this machine's GPU.

    advisor doctor                         one line per check, then what can be collected
    advisor doctor --format json           the same as data
    advisor doctor --gpu-checks            also run the collector checks on the GPU
        --only attribution,kernels         some of them
        --steps A:B                        the steps the training loop records (default 2:7)
        --out DIR                          where sessions, traces and results.json go
        --bundle FILE.tar.gz               the JSON results in one archive
        --dry-run                          what the GPU checks would run, on any machine

Exit status: 0 when nothing failed (a CPU machine skips the GPU rows and says why), 1 when
a check failed, 2 when --gpu-checks cannot run on this machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

__all__ = ["add_doctor_parser", "doctor_command"]

def _window(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not match or int(match[1]) < 1 or int(match[2]) <= int(match[1]):
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B with 1 <= A < B, e.g. 2:7")
    return int(match[1]), int(match[2])


def _checks(text: str) -> list[str]:
    """--only's checks, known ones only (read here, not in the parser, which must not load
    the checks' modules to print its help)."""
    from advisor.doctor.gpu_checks import CHECKS
    from advisor.errors import UsageError

    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CHECKS]
    if unknown or not chosen:
        raise UsageError(f"--only: unknown checks {unknown or text!r}; choose from {', '.join(CHECKS)}")
    return chosen


def add_doctor_parser(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor", help="check that this machine can collect, and (--gpu-checks) that the collector works on its GPU",
        description="Check this machine: the install, torch, the host collector, the NVIDIA driver and GPUs, "
                    "cupti-python and CUPTI; with --gpu-checks, run the collector checks on the GPU.",
        epilog="The GPU checks: attribution, clock, kernels, records, nvtx, drops, compile; the docstring of "
               "advisor.doctor.gpu_checks says what each does.")
    doctor.add_argument("--format", "-f", default="text", choices=["text", "json"], help="output format")
    doctor.add_argument("--gpu-checks", action="store_true", help="run the collector checks on this machine's GPU")
    doctor.add_argument("--only", default=None, metavar="CHECK,...",
                        help="with --gpu-checks: only these checks")
    doctor.add_argument("--steps", type=_window, default=(2, 7), metavar="A:B",
                        help="with --gpu-checks: the steps the training loop records (default 2:7)")
    doctor.add_argument("--out", type=Path, default=None,
                        help="with --gpu-checks: folder for sessions, traces and results.json (default: a new "
                             "temporary folder)")
    doctor.add_argument("--timeout", type=float, default=240.0, help="with --gpu-checks: seconds allowed per program")
    doctor.add_argument("--bundle", type=Path, default=None, metavar="FILE.tar.gz",
                        help="with --gpu-checks: also pack the JSON results into one archive")
    doctor.add_argument("--dry-run", action="store_true",
                        help="with --gpu-checks: print what would run, run nothing (any machine)")


def _gpu_checks(args: argparse.Namespace, machine_json: dict) -> int:
    from advisor.doctor.gpu_checks import (
        Context,
        render,
        run_checks,
        why_not_here,
        write_bundle,
        write_results,
    )

    if not args.dry_run:
        reason = why_not_here()
        if reason is not None:
            print(f"advisor: the GPU checks cannot run here: {reason}", file=sys.stderr)
            return 2
    out = args.out or (Path(tempfile.gettempdir()) / "advisor-doctor-XXXX" if args.dry_run
                       else Path(tempfile.mkdtemp(prefix="advisor-doctor-")))
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        (out / "machine.json").write_text(json.dumps(machine_json, indent=2))
    ctx = Context(out=out.resolve(), window=args.steps, dry_run=args.dry_run, timeout_s=args.timeout)
    if not args.dry_run:
        import torch

        ctx.device_name = torch.cuda.get_device_name(0)
        print(f"advisor doctor: GPU checks on {ctx.device_name}, torch {torch.__version__} (CUDA "
              f"{torch.version.cuda}); output in {out}", file=sys.stderr)
    results = run_checks(ctx, _checks(args.only) if args.only else None)
    if args.dry_run:
        return 0
    print()
    print(render(results))
    path = write_results(ctx, results)
    print(f"advisor doctor: results in {path}", file=sys.stderr)
    if args.bundle:
        write_bundle(args.bundle, out)
        print(f"advisor doctor: bundle in {args.bundle}", file=sys.stderr)
    return 1 if any(r.status == "fail" for r in results) else 0


def doctor_command(args: argparse.Namespace) -> int:
    from advisor.doctor.machine import as_json, check_machine, render_machine

    if not args.gpu_checks and (args.only or args.out or args.bundle or args.dry_run):
        from advisor.errors import UsageError

        raise UsageError("--only, --out, --bundle and --dry-run go with --gpu-checks")
    if args.only:
        _checks(args.only)  # an unknown check is a usage error before anything runs
    rows = check_machine(start_collector=not args.dry_run)
    data = as_json(rows)
    if args.format == "json" and not args.gpu_checks:
        print(json.dumps(data, indent=2))
    else:
        print(render_machine(rows))
    failed = any(row.status == "fail" for row in rows)
    if args.gpu_checks:
        code = _gpu_checks(args, data)
        return code if code else int(failed)
    return 1 if failed else 0
