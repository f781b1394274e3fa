"""What a development session with a GPU runs first: the collector checks and the GPU cases.

Not a benchmark itself; it is kept here, where such a session looks for it, and runs two
things in fresh processes:

1. ``advisor doctor --gpu-checks``: can this machine collect, and does the CUPTI
   collector attribute every kernel, keep CUPTI's clock in line with the host's, agree
   with torch.profiler on kernel times, read every record field, NVTX, dropped records
   and torch.compile (advisor/doctor/gpu_checks.py says what each check does);
2. ``python cases/draft_gpu_cases.py``: record the GPU cases that are not recorded yet and
   draft their case.yaml, to review by hand before committing.

    python benchmarks/gpu_checks.py                               # both
    python benchmarks/gpu_checks.py --only attribution,kernels    # some checks, then the cases
    python benchmarks/gpu_checks.py --no-cases                    # the checks only
    python benchmarks/gpu_checks.py --dry-run                     # what would run (any machine)
    python benchmarks/gpu_checks.py --out /tmp/gc --bundle "$OUT/gpu_checks.tar.gz"
                                     # results.json, the reports and the drafted cases in one archive

Exit status: 0 when both passed, 1 when a check failed or a case came out other than
planted, 2 when this machine cannot run them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_checks.py", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, metavar="CHECK,...", help="only these doctor checks")
    parser.add_argument("--steps", default=None, metavar="A:B", help="the steps the checks' loop records")
    parser.add_argument("--out", type=Path, default=None, help="folder for the doctor's output (default: temporary)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds allowed per program")
    parser.add_argument("--no-cases", action="store_true", help="run the checks only, record no case")
    parser.add_argument("--overwrite-cases", action="store_true", help="re-record cases whose case.yaml exists")
    parser.add_argument("--bundle", type=Path, default=None, metavar="FILE.tar.gz",
                        help="pack the doctor's JSON results and the drafted cases into one archive")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = parser.parse_args(argv)

    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_checks-"))
    doctor = [sys.executable, "-m", "advisor", "doctor", "--gpu-checks", "--out", str(out / "doctor"),
              "--timeout", str(args.timeout)]
    doctor += ["--only", args.only] if args.only else []
    doctor += ["--steps", args.steps] if args.steps else []
    doctor += ["--dry-run"] if args.dry_run else []
    cases = [sys.executable, str(REPO / "cases" / "draft_gpu_cases.py"), "--timeout", str(args.timeout)]
    cases += ["--overwrite"] if args.overwrite_cases else []
    cases += ["--dry-run"] if args.dry_run else []
    cases_bundle = out / "cases.tar.gz"
    if args.bundle and not args.dry_run:
        cases += ["--bundle", str(cases_bundle)]

    print(f"gpu_checks: {' '.join(doctor)}", file=sys.stderr, flush=True)
    checked = subprocess.run(doctor, check=False, cwd=REPO).returncode
    if checked == 2:
        return 2
    drafted = 0
    if not args.no_cases:
        print(f"gpu_checks: {' '.join(cases)}", file=sys.stderr, flush=True)
        drafted = subprocess.run(cases, check=False, cwd=REPO).returncode
    if args.bundle and not args.dry_run:
        args.bundle.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.bundle, "w:gz") as archive:
            for report in sorted((out / "doctor").glob("*.json")):
                if report.name != "torch_profiler_trace.json":
                    archive.add(report, arcname=f"doctor/{report.name}")
            if cases_bundle.is_file():
                with tarfile.open(cases_bundle) as inner:
                    for member in inner.getmembers():
                        archive.addfile(member, inner.extractfile(member) if member.isfile() else None)
        print(f"gpu_checks: bundle in {args.bundle} (tar xzf it in the repository root to add the cases)",
              file=sys.stderr)
    return max(checked, 1 if drafted else 0)


if __name__ == "__main__":
    sys.exit(main())
