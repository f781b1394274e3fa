"""A job of many ranks: time and the parent's memory as ranks are added.

Writes N synthetic rank traces (benchmarks/synth.py, named rank-0.json.gz ...), then runs
`advisor diagnose DIR --format json` on them in a fresh process and reads that process's
own peak RSS (getrusage(RUSAGE_SELF): the workers' memory is theirs, not the parent's)
and its wall time. The baseline, measured in the same run: the same command on one rank's
trace alone, whose events are all in the one process.

What it shows: with worker processes the parent's peak grows with ranks times the size of
a rank's summary, not with events; and the wall time with --workers 2 against --workers 1
on this machine's cores.

    python benchmarks/jobs.py                        # 2, 4 and 8 ranks of 200k events each
    python benchmarks/jobs.py --ranks 2 4 --events 100000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth import generate  # noqa: E402

# Runs advisor's CLI in this process and prints its own peak RSS (KiB on Linux) afterwards.
_MEASURE = """
import resource, sys
from advisor.cli import main
code = main(sys.argv[1:])
print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def run(args: list[str]) -> tuple[float, float]:
    """(seconds, the advisor process's own peak RSS in MiB)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURE, *args], check=False, capture_output=True, text=True,
                          env={"ADVISOR_NO_PROGRESS": "1", **__import__("os").environ})
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"jobs: advisor {' '.join(args)} exited {done.returncode}: {done.stderr[-400:]}")
    peak = next(int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("PEAK_KIB"))
    return elapsed, peak / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--events", type=int, default=200_000, help="events per rank trace")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        largest = max(args.ranks)
        ranks_dir = root / "all"
        ranks_dir.mkdir()
        events = generate(ranks_dir / "rank-0.json.gz", args.events)
        data = (ranks_dir / "rank-0.json.gz").read_bytes()
        for r in range(1, largest):  # the same trace per rank: one rank's cost times N
            (ranks_dir / f"rank-{r}.json.gz").write_bytes(data)
        out = root / "report.json"
        base_s, base_mib = run(["diagnose", str(ranks_dir / "rank-0.json.gz"), "--format", "json", "-o", str(out)])
        rows = [("1 rank, one process (baseline)", 1, base_s, base_mib)]
        for n in args.ranks:
            job = root / f"job{n}"
            job.mkdir()
            for r in range(n):
                (job / f"rank-{r}.json.gz").symlink_to(ranks_dir / f"rank-{r}.json.gz")
            for workers in (1, 2):
                seconds, mib = run(["diagnose", str(job), "--format", "json", "-o", str(out),
                                    "--workers", str(workers)])
                rows.append((f"{n} ranks, --workers {workers}", n, seconds, mib))
            report = json.loads(out.read_text())
            assert len(report["job"]["ranks"]) == n
    print(f"jobs: {events:,} events per rank ({len(data) / 2**20:.1f} MiB gzipped), on {__import__('os').cpu_count()} "
          "cores; the parent's own peak RSS, workers' not included")
    print(f"{'run':34} {'seconds':>8} {'s/rank':>7} {'parent peak MiB':>16} {'x baseline':>11}")
    for name, n, seconds, mib in rows:
        print(f"{name:34} {seconds:8.2f} {seconds / n:7.2f} {mib:16.0f} {mib / base_mib:10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
