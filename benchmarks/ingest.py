"""Ingest benchmark: trace -> Session -> tables -> rules, against plain json.load.

For each trace (the shared real traces where ../shared/traces exists, and a synthetic
trace of at least a million events written by benchmarks/synth.py) it runs, each in a
fresh Python process so peak memory is that stage's own:

    baseline   json.load of the same (gunzipped) file, the cost of merely parsing it
    advisor    advisor.importers.load + advisor.tables.compute_tables + advisor.rules.engine.run_rules

and prints wall time, events per second, peak RSS above the interpreter's own, and the
ratios advisor / baseline measured in the same run.

    python benchmarks/ingest.py [--events 1000000] [--repeat 3] [--skip-shared]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared" / "traces"

_CHILD = r"""
import gc, gzip, json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
if mode == "advisor":
    from advisor.importers import load
    from advisor.tables import compute_tables
    from advisor.rules import run_rules
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
gc.collect()
before = rss_mb()
t0 = time.perf_counter()
if mode == "baseline":
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        doc = json.load(f)
    events = len(doc["traceEvents"])
else:
    session = load(path)
    tables = compute_tables(session)
    result = run_rules(session, tables)
    events = len(session.events)
elapsed = time.perf_counter() - t0
print(json.dumps({"seconds": elapsed, "peak_mb": rss_mb() - before, "events": events}))
"""


def measure(mode: str, path: Path, repeat: int) -> dict:
    best = None
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path)], capture_output=True, text=True,
                             cwd=REPO)
        if out.returncode != 0:
            raise SystemExit(f"{mode} on {path.name} failed:\n{out.stderr[-2000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if best is None or result["seconds"] < best["seconds"]:
            best = result
    return best


def raw_event_count(path: Path) -> int:
    import gzip

    import ijson

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return sum(1 for _ in ijson.items(f, "traceEvents.item"))


def main() -> None:
    parser = argparse.ArgumentParser(description="Time ingest + tables + rules against json.load.")
    parser.add_argument("--events", type=int, default=1_000_000, help="size of the synthetic trace")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the fastest is kept")
    parser.add_argument("--skip-shared", action="store_true", help="only the synthetic trace")
    args = parser.parse_args()

    traces: list[Path] = []
    if not args.skip_shared and SHARED.is_dir():
        traces.extend(sorted(SHARED.glob("*.json.gz")))
    elif not args.skip_shared:
        print(f"(no shared traces at {SHARED}; synthetic trace only)")
    tmp = Path(tempfile.mkdtemp(prefix="advisor-bench-"))
    sys.path.insert(0, str(HERE))
    from synth import generate

    synthetic = tmp / f"synthetic_{args.events}.json.gz"
    written = generate(synthetic, args.events)
    print(f"synthetic trace: {written} events, {synthetic.stat().st_size / 1e6:.1f} MB gzipped")
    traces.append(synthetic)

    header = (f"{'trace':<44} {'raw events':>10} {'json.load s':>11} {'advisor s':>10} {'ratio':>6} "
              f"{'events/s':>10} {'json MB':>8} {'advisor MB':>10} {'mem ratio':>9}")
    print(header)
    print("-" * len(header))
    for path in traces:
        count = raw_event_count(path)
        base = measure("baseline", path, args.repeat)
        ours = measure("advisor", path, args.repeat)
        rate = count / ours["seconds"]
        print(f"{path.name[:44]:<44} {count:>10} {base['seconds']:>11.2f} {ours['seconds']:>10.2f} "
              f"{ours['seconds'] / base['seconds']:>6.2f} {rate:>10.0f} {base['peak_mb']:>8.0f} "
              f"{ours['peak_mb']:>10.0f} {ours['peak_mb'] / max(base['peak_mb'], 1):>9.2f}")
    print("ratio: advisor time / json.load time; mem ratio: advisor peak RSS / json.load peak RSS "
          "(both above the interpreter's own).")


if __name__ == "__main__":
    main()
