"""Ingest benchmark: trace readers side by side, and trace -> Session -> tables -> rules,
each against a plain json.load of the same file measured in the same run.

Traces: the shared real traces where ../shared/traces exists, and synthetic traces of about
200 MB and 1 GB of JSON written by benchmarks/synth.py (``--mb``). Every measurement runs in
a fresh Python process, so its peak memory is its own.

Readers (the event array to the columns the Session uses):

    json.load           the whole document with the standard library: the baseline
    ijson               the reader advisor had before (taken from git history): ijson's C
                        backend, one event at a time
    orjson chunks       the array cut at event boundaries, each chunk parsed by orjson into
                        dicts, the fields picked out in Python
    msgspec chunks      advisor's reader (read_events) in one process: chunks decoded by
                        msgspec into typed structs that hold only the fields used
    msgspec parts       the same reader as advisor's commands run it (processes_allowed() processes):
                        a plain file of 64 MB or more in parts, each part after the first
                        read by a forked process (advisor.importers.parts)
    msgspec 2 workers   the same chunks (8 MB batches) decoded in 2 worker processes

End to end: ``advisor diagnose TRACE --format json`` (advisor's own imports included, the
report written) against json.load, read afresh; then the same command again (its report
kept, advisor.cli.report_cache), and again with the kept report removed (the Session and
its tables from the cache, advisor.importers.cache; the rules and the report run).

For each it prints wall time (the fastest of --repeat runs), events per second (events in
the file's traceEvents), MB/s of JSON, peak RSS above the interpreter's own (for the worker
candidate: the parent's plus twice the largest worker's, pages the fork shares counted
twice; for advisor, whose commands read a large plain trace in parts with forked processes:
the largest sum, sampled every 20 ms, of its RSS and those processes' unique memory, in
one run more than the timed ones: the sampling thread takes the GIL from the work it
watches, 0.07 to 0.15 s of a 1 s diagnosis) and the ratios to json.load. A candidate whose package is not installed is skipped. advisor's
modules are byte-compiled first, as an installed package's are (this benchmark's own
environment may say PYTHONDONTWRITEBYTECODE; compiling its 120 modules on every start
would add 0.1 s to each run).

    python benchmarks/ingest.py [--mb 200 1000] [--repeat 3] [--skip-shared] [--no-end-to-end]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared" / "traces"

READERS = ["json.load", "ijson", "orjson chunks", "msgspec chunks", "msgspec parts", "msgspec 2 workers"]
# The last commit with the ijson reader; its kineto.py is the "ijson" candidate.
PREVIOUS_READER = "a06edda596e66887b11386260a5a12c454b848c4"

_CHILD = r'''
import gc, gzip, io, json, os, re, resource, sys, time
from pathlib import Path
mode, path = sys.argv[1], sys.argv[2]
opener = gzip.open if path.endswith(".gz") else open
if mode == "advisor":
    import os  # advisor itself is imported inside the timing: its start-up is part of what a user waits for
elif mode in ("msgspec chunks", "msgspec parts", "msgspec 2 workers"):
    import pandas as pd
    from advisor.importers.kineto import open_trace, read_events
elif mode == "ijson":
    import importlib.util
    import ijson
    spec = importlib.util.spec_from_file_location("previous_kineto", sys.argv[3])
    previous = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(previous)
elif mode == "orjson chunks":
    import orjson

ARGS = ("correlation", "External id", "device", "stream", "bytes", "grid", "block", "registers per thread",
        "shared memory", "Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Call stack", "flops",
        "Python id", "Python parent id")


def columns_of(events, columns):
    """What a dict-based reader does per event: pick the fields the Session uses."""
    name, cat, ts, dur, pid, tid = (columns.setdefault(k, []) for k in ("name", "cat", "ts", "dur", "pid", "tid"))
    fields = [columns.setdefault(k, []) for k in ARGS]
    for event in events:
        if event.get("ph") != "X":
            continue
        name.append(event.get("name", ""))
        cat.append(event.get("cat") or "")
        ts.append(event.get("ts"))
        dur.append(event.get("dur") or 0)
        pid.append(event.get("pid", -1))
        tid.append(event.get("tid", -1))
        get = (event.get("args") or {}).get
        for key, column in zip(ARGS, fields):
            value = get(key)
            column.append(str(value) if isinstance(value, list) else value)


CUT = re.compile(rb"\}\s*,\s*\{")
END = re.compile(rb"\}\s*\]\s*(?:,\s*\"|\}\s*$)")


def batches(size):
    """Whole events of the file's event array, about ``size`` bytes at a time."""
    with opener(path, "rb") as f:
        buffer = f.read(1 << 20)
        buffer = buffer[buffer.index(b"[", buffer.index(b'"traceEvents"')) + 1:]
        while True:
            more = f.read(size)
            buffer += more
            if not more:
                end = END.search(buffer)
                yield buffer[:end.start() + 1]
                return
            brace = buffer.rfind(b"}")
            while not CUT.match(buffer, brace):
                brace = buffer.rfind(b"}", 0, brace)
            yield buffer[:brace + 1]
            buffer = buffer[CUT.match(buffer, brace).end() - 1:]


def decode(batch):
    return read_events(io.BytesIO(b"[" + batch + b"]"), Path(path))[0]


def rss_mb(who=resource.RUSAGE_SELF):
    return resource.getrusage(who).ru_maxrss / 1024


gc.collect()
import psutil
import threading
before = psutil.Process().memory_info().rss / 2**20  # now, not the peak of the imports
# advisor's commands read a large plain trace in parts, in processes they fork: their peak is
# the largest sum of this process's RSS and those processes' own (unique) memory, sampled.
me, tree_peak, sampling = psutil.Process(), [0], [True]


def sample():
    while sampling[0]:
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            try:
                total += child.memory_full_info().uss
            except psutil.Error:
                pass
        tree_peak[0] = max(tree_peak[0], total)
        time.sleep(0.02)


# Sampling reads the forked processes' memory every 20 ms, in a thread of this process that
# takes the GIL from the work it measures (0.07 to 0.15 s of a 1 s diagnosis): the timed
# runs do without it, and one more run samples (measure()).
forks = mode in ("advisor", "msgspec parts") and os.environ.get("INGEST_SAMPLE") == "1"
sampler = threading.Thread(target=sample, daemon=True)
if forks:
    sampler.start()
t0 = time.perf_counter()
events = None
if mode == "json.load":
    with opener(path, "rb") as f:
        events = len(json.load(f)["traceEvents"])
elif mode == "ijson":
    stream = previous.open_trace(Path(path))
    raw, _, _ = previous.read_events(stream, Path(path))
elif mode == "orjson chunks":
    columns = {}
    for batch in batches(1 << 18):
        columns_of(orjson.loads(b"[" + batch + b"]"), columns)
elif mode in ("msgspec chunks", "msgspec parts"):
    import functools
    from advisor.importers.forked import processes_allowed
    from advisor.importers.parts import read_in_parts
    stream = open_trace(Path(path))
    raw, _, _ = read_events(stream, Path(path), in_parts=functools.partial(read_in_parts, processes=processes_allowed())
                              if mode == "msgspec parts" else None)
elif mode == "msgspec 2 workers":
    from multiprocessing import get_context
    from pandas.api.types import union_categoricals
    with get_context("fork").Pool(2) as pool:
        frames = list(pool.imap(decode, batches(8 << 20)))
    raw = {c: union_categoricals([f[c] for f in frames]) if isinstance(frames[0][c].dtype, pd.CategoricalDtype)
           else pd.concat([f[c] for f in frames], ignore_index=True) for c in frames[0].columns}
else:
    from advisor.cli import main
    code = main(["diagnose", path, "--format", "json", "-o", os.devnull])
    if code:
        sys.exit(code)
elapsed = time.perf_counter() - t0
if forks:
    sampling[0] = False
    sampler.join()
peak = max(rss_mb(), tree_peak[0] / 2**20) - before
if mode == "msgspec 2 workers":
    peak += 2 * rss_mb(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": elapsed, "peak_mb": peak, "events": events}))
'''


def measure(mode: str, path: Path, repeat: int, *extra: str, cache: Path | None = None) -> dict | None:
    """The fastest of ``repeat`` runs, or None where the candidate's package is missing.
    advisor runs read the trace afresh, unless ``cache`` names a session cache to use. For
    the candidates that fork, the peak memory is that of one more run, which samples the
    forked processes' memory (the timed runs do not: the sampling slows them)."""
    best = None
    env = {**os.environ, "ADVISOR_NO_CACHE": "1"}
    if cache is not None:
        env.pop("ADVISOR_NO_CACHE")
        env["ADVISOR_CACHE_DIR"] = str(cache)
    sampled = mode in ("advisor", "msgspec parts") and cache is None
    for run in range(repeat + sampled):
        sample = sampled and run == repeat
        out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path), *extra], capture_output=True,
                             text=True, cwd=REPO, check=False, env={**env, "INGEST_SAMPLE": "1" if sample else "0"})
        if out.returncode != 0:
            if "ModuleNotFoundError" in out.stderr:
                return None
            raise SystemExit(f"{mode} on {path.name} failed:\n{out.stderr[-2000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if sample:
            best["peak_mb"] = result["peak_mb"]
        elif best is None or result["seconds"] < best["seconds"]:
            best = result
    return best


def json_size(path: Path) -> int:
    if path.suffix != ".gz":
        return path.stat().st_size
    size = 0
    with gzip.open(path, "rb") as f:
        while block := f.read(1 << 24):
            size += len(block)
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description="Trace readers and ingest + tables + rules against json.load.")
    parser.add_argument("--mb", type=float, nargs="*", default=[200, 1000],
                        help="sizes of the synthetic traces, in MB of JSON")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the fastest is kept "
                                                              "(one for traces over 500 MB)")
    parser.add_argument("--skip-shared", action="store_true", help="only the synthetic traces")
    parser.add_argument("--shared", nargs="*", default=None, help="names of the shared traces to use (default all)")
    parser.add_argument("--readers", nargs="*", default=READERS, choices=READERS, help="reader candidates to run")
    parser.add_argument("--no-end-to-end", action="store_true", help="readers only")
    args = parser.parse_args()

    traces: list[Path] = []
    if not args.skip_shared and SHARED.is_dir():
        traces.extend(p for p in sorted(SHARED.glob("*.json.gz")) if args.shared is None or p.name in args.shared)
    elif not args.skip_shared:
        print(f"(no shared traces at {SHARED}; synthetic traces only)")
    tmp = Path(tempfile.mkdtemp(prefix="advisor-bench-"))
    try:
        run(args, traces, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the synthetic traces are large


def run(args: argparse.Namespace, traces: list[Path], tmp: Path) -> None:
    sys.path.insert(0, str(HERE))
    from synth import generate

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "advisor")], check=False,
                   stdout=subprocess.DEVNULL)

    for mb in args.mb:
        synthetic = tmp / f"synthetic_{mb:g}MB.json"
        written = generate(synthetic, target_bytes=int(mb * 1e6))
        print(f"synthetic trace: {written} events, {synthetic.stat().st_size / 1e6:.0f} MB")
        traces.append(synthetic)

    previous = tmp / "previous_kineto.py"
    shown = subprocess.run(["git", "show", f"{PREVIOUS_READER}:advisor/importers/kineto.py"], capture_output=True,
                           text=True, cwd=REPO, check=False)
    if shown.returncode == 0:
        previous.write_text(shown.stdout)

    rows = []
    header = (f"{'trace':<38} {'reader':<18} {'seconds':>8} {'events/s':>10} {'MB/s':>6} {'peak MB':>8} "
              f"{'x time':>7} {'x mem':>6}")
    print("\nReaders: each against json.load of the same file (x time, x mem: reader / json.load)")
    print(header)
    print("-" * len(header))
    baselines = {}
    for path in traces:
        size_mb = json_size(path) / 1e6
        repeat = 1 if size_mb > 500 else args.repeat
        base = measure("json.load", path, repeat)
        baselines[path] = base
        for reader in args.readers:
            if reader == "ijson" and not previous.exists():
                print(f"{path.name[:38]:<38} {reader:<18} (the previous reader is not in this checkout's history)")
                continue
            result = base if reader == "json.load" else measure(reader, path, repeat, str(previous))
            if result is None:
                print(f"{path.name[:38]:<38} {reader:<18} (not installed)")
                continue
            rate = base["events"] / result["seconds"]
            line = (f"{path.name[:38]:<38} {reader:<18} {result['seconds']:>8.2f} {rate:>10.0f} "
                    f"{size_mb / result['seconds']:>6.0f} {result['peak_mb']:>8.0f} "
                    f"{result['seconds'] / base['seconds']:>7.2f} {result['peak_mb'] / max(base['peak_mb'], 1):>6.2f}")
            print(line, flush=True)
            rows.append(line)

    if args.no_end_to_end:
        return
    header = (f"{'trace':<38} {'json.load s':>11} {'advisor s':>10} {'ratio':>6} {'events/s':>10} "
              f"{'json MB':>8} {'advisor MB':>10} {'mem ratio':>9} {'cached s':>9} {'x first':>8} "
              f"{'tables s':>9} {'x first':>8}")
    print("\nEnd to end: advisor diagnose TRACE --format json, imports included; then the same again "
          "(its report kept), and with only the Session and its tables cached")
    print(header)
    print("-" * len(header))
    for path in traces:
        base = baselines[path]
        repeat = 1 if json_size(path) > 500e6 else args.repeat
        ours = measure("advisor", path, repeat)
        cache = tmp / f"cache-{path.name}"
        measure("advisor", path, 1, cache=cache)  # fills the cache
        # The cached runs take seconds at most: the fastest of --repeat even on 1 GB (the first
        # read of a freshly written cache entry varies from one to two seconds there).
        again = measure("advisor", path, args.repeat, cache=cache)
        tables = None
        for _ in range(args.repeat):  # the report's record removed each time: Session and tables from the cache
            for record in cache.glob("*/report-*.json"):
                record.unlink()
            one = measure("advisor", path, 1, cache=cache)
            tables = one if tables is None or one["seconds"] < tables["seconds"] else tables
        shutil.rmtree(cache, ignore_errors=True)
        rate = base["events"] / ours["seconds"]
        print(f"{path.name[:38]:<38} {base['seconds']:>11.2f} {ours['seconds']:>10.2f} "
              f"{ours['seconds'] / base['seconds']:>6.2f} {rate:>10.0f} {base['peak_mb']:>8.0f} "
              f"{ours['peak_mb']:>10.0f} {ours['peak_mb'] / max(base['peak_mb'], 1):>9.2f} "
              f"{again['seconds']:>9.2f} {again['seconds'] / ours['seconds']:>8.2f} "
              f"{tables['seconds']:>9.2f} {tables['seconds'] / ours['seconds']:>8.2f}", flush=True)
    print("ratio: advisor time / json.load time; mem ratio: advisor peak memory (its RSS and its forked "
          "readers' own memory) / json.load peak RSS (both above the interpreter's own); cached: the same command again, its report kept "
          "(advisor.cli.report_cache); tables cached: the same with the kept report removed, so the "
          "Session and its tables come from the cache and the rules and report run (x first: / first).")


if __name__ == "__main__":
    main()
