"""What a development session with a GPU runs first, in one command with its own deadline.

Not a benchmark itself; it is kept here, where such a session looks for it. GPU time is
rare and short (one command of at most 10 minutes, 15 in all, starts included), so this
runs the most useful things first, each in fresh processes and each within what is left
of ``--deadline`` (default 8 minutes), and packs what it has before the deadline:

1. the native op recorder built once (advisor.collect.native), so every later process
   finds it, and the time the build took;
2. ``advisor doctor --gpu-checks``: attribution, clock, kernels against torch.profiler
   (exact names, calls and shapes; totals within 2 %; each kernel against an A/A run),
   records, NVTX, dropped records and torch.compile in both windows
   (advisor/doctor/gpu_checks.py says what each does);
3. ``benchmarks/step_overhead.py``: the same steps plain, under advisor and under
   torch.profiler (record_shapes), median ms a step, for a GPU-bound transformer loop and
   the launch-bound small_batch example first, then the other examples while time lasts;
4. ``advisor diagnose --kernel-counters 5`` on examples/odd_gemm.py: the script run once
   more under Nsight Compute for its top kernels, its wall time and the report and session
   kept (kernel_counters/), to review into a case;
5. ``python cases/draft_gpu_cases.py``: the GPU cases not recorded yet, drafted, and the
   reviewed ones recorded by an older collector, recorded again (case.yaml kept).

    python benchmarks/gpu_checks.py --dry-run                     # what would run (any machine)
    python benchmarks/gpu_checks.py --out /tmp/gc --bundle "$OUT/gpu_checks.tar.gz"
    python benchmarks/gpu_checks.py --only attribution,kernels --no-cases --no-overhead

The bundle holds summary.json (each part: status, seconds), doctor/*.json and the
reference trace, overhead.json and .txt, kernel_counters/ (report, session, output), and the cases' folders laid out as in the
repository (tar xzf it in the root to take them). Exit status: 0 when everything ran and
passed, 1 when a check failed, a case came out other than planted or a part ran out of
time, 2 when this machine cannot run them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACK_RESERVE_S = 20  # kept back from the deadline for packing the bundle
OVERHEAD_SCRIPTS = ("benchmarks/transformer_loop.py", "examples/small_batch.py", "examples/host_sync.py",
                    "examples/pageable_copies.py", "examples/per_parameter_optimizer.py")
PREBUILD = ("import sys, time, torch; from advisor.collect import native; began = time.monotonic(); "
            "lib, why = native.load(torch); print(f'native op recorder: ' + ('built or found in %.1f s' % "
            "(time.monotonic() - began) if lib is not None else f'NOT available: {why}')); sys.exit(0 if lib else 1)")


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic() - PACK_RESERVE_S


def run_part(name: str, command: list[str], deadline: Deadline, summary: dict, *, dry_run: bool,
             stdout_to: Path | None = None) -> int:
    """Run one part within what is left of the deadline; its status and time into ``summary``."""
    shown = " ".join(command)
    if dry_run:
        print(f"gpu_checks: would run ({name}): {shown}")
        summary[name] = {"status": "dry run"}
        return 0
    left = deadline.left()
    if left < 10:
        summary[name] = {"status": "not run: out of time"}
        print(f"gpu_checks: {name}: not run, out of time", file=sys.stderr, flush=True)
        return 1
    print(f"gpu_checks: {name}: {shown} (within {left:.0f} s)", file=sys.stderr, flush=True)
    began = time.monotonic()
    try:
        done = subprocess.run(command, check=False, cwd=REPO, timeout=left, text=True,
                              stdout=subprocess.PIPE if stdout_to else None)
        code, status = done.returncode, "passed" if done.returncode == 0 else f"exit {done.returncode}"
        if stdout_to is not None:
            stdout_to.write_text(done.stdout or "")
            print(done.stdout or "", end="")
    except subprocess.TimeoutExpired as exc:
        code, status = 1, f"stopped at the deadline after {left:.0f} s"
        if stdout_to is not None and exc.stdout:
            stdout_to.write_text(exc.stdout if isinstance(exc.stdout, str) else exc.stdout.decode(errors="replace"))
    summary[name] = {"status": status, "seconds": round(time.monotonic() - began, 1)}
    return code


def recorded_since(began: float) -> list[Path]:
    """The GPU case folders whose session was written after ``began`` (a time.time()): what
    the cases part recorded, even where it was stopped at the deadline."""
    return sorted(folder for folder in (REPO / "cases").glob("gpu_*")
                  if (folder / "session" / "session.json").is_file()
                  and (folder / "session" / "session.json").stat().st_mtime >= began)


def pack(bundle: Path, out: Path, cases: list[Path]) -> None:
    bundle.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle, "w:gz") as archive:
        for path in sorted([*out.glob("*.json"), *out.glob("*.txt")]):
            archive.add(path, arcname=path.name)
        doctor = out / "doctor"
        for report in sorted([*doctor.glob("*.json"), *doctor.glob("*.json.gz")]):
            if not report.name.startswith("torch_profiler_trace") or report.name == "torch_profiler_trace.json.gz":
                archive.add(report, arcname=f"doctor/{report.name}")
        counters = out / "kernel_counters"
        if counters.is_dir():
            archive.add(counters, arcname="kernel_counters")
        for folder in cases:
            archive.add(folder, arcname=f"cases/{folder.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_checks.py", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, metavar="CHECK,...", help="only these doctor checks")
    parser.add_argument("--steps", default=None, metavar="A:B", help="the steps the checks' loop records")
    parser.add_argument("--out", type=Path, default=None, help="folder for the output (default: temporary)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds allowed per program")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds for everything, packing included")
    parser.add_argument("--no-cases", action="store_true", help="record no case")
    parser.add_argument("--no-overhead", action="store_true", help="leave out the overhead table")
    parser.add_argument("--no-counters", action="store_true", help="leave out the Nsight Compute run")
    parser.add_argument("--overwrite-cases", action="store_true", help="re-record cases whose case.yaml exists")
    parser.add_argument("--bundle", type=Path, default=None, metavar="FILE.tar.gz",
                        help="pack the results and the drafted cases into one archive")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = parser.parse_args(argv)

    deadline = Deadline(args.deadline)
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_checks-"))
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    began = time.time()
    failed = 0
    try:
        failed |= run_part("native recorder", [sys.executable, "-c", PREBUILD], deadline, summary,
                           dry_run=args.dry_run) != 0
        doctor = [sys.executable, "-m", "advisor", "doctor", "--gpu-checks", "--out", str(out / "doctor"),
                  "--timeout", str(args.timeout)]
        doctor += ["--only", args.only] if args.only else []
        doctor += ["--steps", args.steps] if args.steps else []
        doctor += ["--dry-run"] if args.dry_run else []
        # In a dry run the doctor runs too, with --dry-run: it lists what it would run.
        checked = run_part("doctor", doctor, deadline, summary, dry_run=False)
        if checked == 2:
            return 2
        failed |= checked != 0
        if not args.no_overhead:
            overhead = [sys.executable, str(REPO / "benchmarks" / "step_overhead.py"), "--json",
                        str(out / "overhead.json"), "--timeout", str(min(args.timeout, 120)),
                        "--budget", f"{max(deadline.left() - 150, 60):.0f}", "--scripts", *OVERHEAD_SCRIPTS]
            failed |= run_part("overhead", overhead, deadline, summary, dry_run=args.dry_run,
                               stdout_to=out / "overhead.txt") != 0
        if not args.no_counters:
            counters = out / "kernel_counters"
            counters.mkdir(parents=True, exist_ok=True)
            ncu = [sys.executable, "-m", "advisor", "diagnose", "--kernel-counters", "5", "--no-cache",
                   "--save", str(counters / "session"), "--format", "json", "-o", str(counters / "report.json"),
                   str(REPO / "examples" / "odd_gemm.py"), "--steps", "12"]
            failed |= run_part("kernel counters", ncu, deadline, summary, dry_run=args.dry_run,
                               stdout_to=counters / "stdout.txt") != 0
        if not args.no_cases:
            cases = [sys.executable, str(REPO / "cases" / "draft_gpu_cases.py"), "--timeout", str(args.timeout)]
            cases += ["--overwrite"] if args.overwrite_cases else []
            cases += ["--dry-run"] if args.dry_run else []
            if args.dry_run:
                subprocess.run(cases, check=False, cwd=REPO)
            else:
                failed |= run_part("cases", cases, deadline, summary, dry_run=False) != 0
    finally:
        if not args.dry_run:
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            if args.bundle:
                pack(args.bundle, out, recorded_since(began))
                print(f"gpu_checks: bundle in {args.bundle} (tar xzf it in the repository root to add the cases)",
                      file=sys.stderr)
    print("gpu_checks: " + "; ".join(f"{k}: {v['status']}" for k, v in summary.items()), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
