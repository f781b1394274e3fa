"""A job of many ranks: wall time and memory, in worker processes, on Dask, in one process.

Synthesises R rank traces of E events each (benchmarks/synth.py; one trace written, the
others linked to it, so each rank costs what one does), then summarises and diagnoses the
job as `advisor diagnose DIR` does, each way in a fresh process:

    default        as `advisor diagnose DIR` chooses (advisor.job.run): ranks read in the
                   parent while a pool would not pay, the rest in a pool of one per core
    one process    every rank read in the parent, one after another (no pool)
    1 worker       a pool of one worker process
    2 workers      a pool of two
    Dask           a distributed.LocalCluster of two worker processes (--dask)

For each it prints the wall time, the parent's own peak RSS (getrusage of the parent: its
workers' memory is theirs) and each worker's peak RSS as the worker measured it after its
last rank. The parent holds only summaries, so its peak must not grow with events per
rank; run two sizes and compare.

    python benchmarks/ranks.py                              # 64 ranks x 200 k events, then 8 ranks x 2 M
    python benchmarks/ranks.py --config 8x200000 --config 8x2000000
    python benchmarks/ranks.py --config 16x100000 --no-dask
    python benchmarks/ranks.py --config 1000x20000 --modes one,dask     # no pool runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The advisor package of this checkout, wherever (or whether) it is installed: the Dask
# scheduler (in this process) unpickles the task graph, and the cluster's worker processes
# and the driver import advisor too; none of them runs with the checkout as its working path.
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
from synth import generate

# Runs in a fresh process: summarise and diagnose the job, then say the peaks.
_DRIVER = """
import json, os, resource, sys
from pathlib import Path
from advisor.job import job_sources, order_ranks, summarise_job
from advisor.job.diagnose import diagnose_job
folder, workers, dask, pool = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None, sys.argv[4] == "pool"
summaries = summarise_job(job_sources([folder]), workers=workers, dask_address=dask, always_pool=pool)
job = order_ranks(summaries, source=str(folder))
diagnosis = diagnose_job(job)
peaks = {}
for s in summaries:
    peaks[s.worker_pid] = max(peaks.get(s.worker_pid, 0), s.worker_peak_rss_bytes)
print(json.dumps({"ranks": len(job.ranks), "findings": [f.rule for f in diagnosis.findings], "parent_pid": os.getpid(),
                  "parent_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "workers": peaks}))
"""


def run(folder: Path, workers: int, dask: str | None = None, *, pool: bool = True) -> dict:
    started = time.perf_counter()
    # Every rank read afresh: the ranks are links to one trace, which the session cache
    # would otherwise serve after the first read.
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(folder), str(workers), dask or "",
                           "pool" if pool else "in-process"], check=False, capture_output=True, text=True,
                          env={**os.environ, "ADVISOR_NO_CACHE": "1"}, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ranks: the driver exited {done.returncode}: {done.stderr[-600:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["seconds"] = seconds
    return out


MODES = ("default", "one", "pool1", "pool2", "dask")


def measure(ranks: int, events: int, root: Path, dask: bool, modes: tuple[str, ...] = MODES) -> list[tuple[str, dict]]:
    folder = root / f"job-{ranks}x{events}"
    folder.mkdir()
    written = generate(folder / "rank-0.json.gz", events)
    for r in range(1, ranks):
        (folder / f"rank-{r}.json.gz").symlink_to(folder / "rank-0.json.gz")
    rows = []
    if "default" in modes:
        rows.append(("default", run(folder, 0, pool=False)))
    if "one" in modes:
        rows.append(("one process", run(folder, 1, pool=False)))
    if "pool1" in modes:
        rows.append(("1 worker", run(folder, 1)))
    if "pool2" in modes:
        rows.append(("2 workers", run(folder, 2)))
    if dask and "dask" in modes:
        from distributed import LocalCluster

        os.environ["ADVISOR_NO_CACHE"] = "1"  # the cluster's workers read afresh too
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
            rows.append(("Dask, 2 workers", run(folder, 1, cluster.scheduler_address)))
    size = (folder / "rank-0.json.gz").stat().st_size
    print(f"\n{ranks} ranks x {written:,} events ({size / 2**20:.1f} MiB gzipped per rank), {os.cpu_count()} cores")
    print(f"{'how':18} {'seconds':>8} {'s/rank':>7} {'parent peak MiB':>16} {'worker peaks MiB':>28} {'ranks':>6} "
          f"{'findings':>8}")
    for name, out in rows:
        workers = sorted(v / 2**20 for pid, v in out["workers"].items() if int(pid) != out["parent_pid"])
        shown = ", ".join(f"{w:.0f}" for w in workers) or "-"
        print(f"{name:18} {out['seconds']:8.1f} {out['seconds'] / ranks:7.2f} {out['parent_kib'] / 1024:16.0f} "
              f"{shown:>28} {out['ranks']:6} {len(out['findings']):8}  {', '.join(out['findings'])}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", metavar="RANKSxEVENTS",
                        help="ranks x events per rank (repeatable; default 64x200000 and 8x2000000)")
    parser.add_argument("--no-dask", action="store_true", help="leave out the LocalCluster run")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"which runs, comma-separated, of {', '.join(MODES)} (default: all)")
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)} (choose from {', '.join(MODES)})")
    configs = [tuple(int(x) for x in c.lower().split("x")) for c in (args.config or ["64x200000", "8x2000000"])]
    with tempfile.TemporaryDirectory() as folder:
        for ranks, events in configs:
            measure(ranks, events, Path(folder), dask=not args.no_dask, modes=modes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
