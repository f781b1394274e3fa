"""Field types benchmark: a trace whose every event writes a field in another type than
PyTorch's own traces, read by advisor against the same trace as PyTorch writes it.

ROCm's profiler writes a kernel's stream as hex text (``"stream": "0x0"``), some writers
write devices and ids as text; a field of a type the typed reader does not expect must cost
that field a conversion, not send every event down the careful path. Each variant of a
synthetic trace (benchmarks/synth.py, ``--events`` events) is read in a fresh Python
process, twice: the reader alone (advisor.importers.kineto.read_events) and
``advisor diagnose TRACE --format json`` end to end (no cache). Printed: the fastest wall
time of ``--repeat`` runs and the peak RSS of the process.

    python benchmarks/field_types.py [--events 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Each variant: what it changes, and the change to the JSON text of every GPU event's args.
VARIANTS = {
    "as PyTorch writes it": None,
    "stream as hex text (ROCm)": (re.compile(r'"stream": (\d+)'), lambda m: f'"stream": "{int(m[1]):#x}"'),
    "device as text": (re.compile(r'"device": (\d+)'), lambda m: f'"device": "{m[1]}"'),
    "correlation as hex text": (re.compile(r'"correlation": (\d+)'), lambda m: f'"correlation": "{int(m[1]):#x}"'),
    "registers per thread as a list": (re.compile(r'"registers per thread": (\d+)'),
                                       lambda m: f'"registers per thread": [{m[1]}]'),
}

_READ = """
import resource, sys, time
from pathlib import Path
from advisor.importers.kineto import open_trace, read_events
path = Path(sys.argv[1])
start = time.perf_counter()
stream = open_trace(path)
frame, meta, _ = read_events(stream, path)
took = time.perf_counter() - start
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, len(frame))
"""


def measure_read(path: Path) -> tuple[float, float, int]:
    done = subprocess.run([sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, check=True)
    took, rss, rows = done.stdout.split()
    return float(took), float(rss), int(rows)


def measure_diagnose(path: Path) -> tuple[float, float]:
    script = ("import resource, subprocess, sys, time; s = time.perf_counter(); "
              "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
              "print(time.perf_counter() - s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    env = {**os.environ, "ADVISOR_NO_CACHE": "1", "ADVISOR_NO_PROGRESS": "1", "ADVISOR_PROCESSES": "1"}
    done = subprocess.run([sys.executable, "-c", script, sys.executable, "-m", "advisor", "diagnose", str(path),
                           "--format", "json"], capture_output=True, text=True, check=True, env=env)
    took, rss = done.stdout.split()
    return float(took), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-end-to-end", action="store_true", help="the reader alone")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from synth import generate

    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / "base.json"
        events = generate(base, args.events)
        text = base.read_text()
        print(f"field types: {events:,} events ({len(text) / 1e6:.1f} MB of JSON), fastest of {args.repeat}, "
              f"peak RSS of the process")
        print(f"{'variant':34}{'read s':>9}{'read MB':>9}{'rows':>9}" +
              ("" if args.no_end_to_end else f"{'diagnose s':>12}{'diagnose MB':>13}"))
        for name, change in VARIANTS.items():
            path = Path(folder) / (re.sub(r"\W+", "-", name) + ".json")
            path.write_text(text if change is None else change[0].sub(change[1], text))
            reads = [measure_read(path) for _ in range(args.repeat)]
            took, rss, rows = min(reads)
            line = f"{name:34}{took:9.2f}{max(r[1] for r in reads):9.0f}{rows:9,}"
            if not args.no_end_to_end:
                runs = [measure_diagnose(path) for _ in range(args.repeat)]
                line += f"{min(r[0] for r in runs):12.2f}{max(r[1] for r in runs):13.0f}"
            print(line, flush=True)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
