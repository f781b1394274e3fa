"""What each profiler costs a real script: the same steps plain, under advisor, under torch.profiler.

For each script, three fresh processes in one run, timing the same steps (2 to 6 by
default, after two warm-up steps):

    plain           the script with one timestamp where each optimizer step ends
                    (advisor.verify.trial's step stamps: no profiler, no hooks)
    advisor         `advisor diagnose --save DIR SCRIPT --steps N`: the recorded steps as
                    advisor's own step clock timed them, and the steps after the window it
                    ran without recording (the job's pace as advisor sees it); the op
                    recorder it used and what it measured recording costs an op
    torch.profiler  the plain process with torch.profiler (CPU activities, CUDA where torch
                    sees a GPU, record_shapes) started where step 2 begins and stopped where
                    the last timed step ends

and prints the median ms per step of each with its ratio to plain. On a GPU the goal is
the recorded steady step within 10 % of the unrecorded one on a GPU-bound loop, and no
slower than torch.profiler's on a launch-bound one. Runs anywhere: on a CPU it measures
the host collector (torch.profiler under advisor's hooks) the same way.

    python benchmarks/step_overhead.py                          # the default scripts
    python benchmarks/step_overhead.py --scripts examples/small_batch.py --steps 12
    python benchmarks/step_overhead.py --json out.json
    python benchmarks/step_overhead.py --pace 5 --scripts examples/per_sample_loop.py

--pace R measures the job's pace as advisor reports it: the steps advisor runs after the
window without recording (its unrecorded steps, the pace every saving is sized on) against
the same steps of the script run plain, in R alternated pairs of runs, and prints the
ratio's min, median and max per script (1.00x: advisor's unrecorded steps are the job's).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SCRIPTS = ("examples/small_batch.py", "examples/host_sync.py", "examples/pageable_copies.py",
                   "examples/odd_gemm.py", "examples/per_parameter_optimizer.py", "benchmarks/transformer_loop.py")
WARMUP, TIMED = 2, 5

# The plain and torch.profiler rows: the script run by advisor.verify.trial's step stamps
# (one timestamp where each optimizer step ends), torch.profiler around the timed steps
# where asked. Prints the durations as one JSON line.
_CHILD = r"""
import json, os, runpy, sys, time
import torch
from advisor.verify.trial import StepStamps, TrialDone
mode, warmup, timed, script, *args = sys.argv[1:]
warmup, timed = int(warmup), int(timed)
profiler = None
if mode == "torch.profiler":
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities, record_shapes=True)

class Stamps(StepStamps):
    def stamp(self):
        if profiler is not None and len(self.stamps) == warmup:
            profiler.start()
        if profiler is not None and len(self.stamps) == warmup + timed:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.stamps.append(time.perf_counter_ns())  # the last timed step ends before the stop
            profiler.stop()
            raise TrialDone
        super().stamp()

stamps = Stamps(torch, "optimizer", warmup + timed + 1)
sys.argv = [script, *args]
sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
try:
    runpy.run_path(script, run_name="__main__")
except (TrialDone, SystemExit):
    pass
durations = [b - a for a, b in zip(stamps.stamps, stamps.stamps[1:])][warmup:warmup + timed]
print("step_overhead:" + json.dumps({"durations_ns": durations}), flush=True)
os._exit(0)
"""


@dataclass
class Row:
    script: str
    plain_ms: float | None = None
    profiler_ms: float | None = None
    recorded_ms: float | None = None
    unrecorded_ms: float | None = None
    recorder: str = ""
    per_op_ns: float | None = None
    problems: list[str] = field(default_factory=list)


def _durations(stdout: str) -> list[int]:
    for line in stdout.splitlines():
        if line.startswith("step_overhead:"):
            return json.loads(line[len("step_overhead:"):])["durations_ns"]
    return []


def _median_ms(durations: list[int]) -> float | None:
    return statistics.median(durations) / 1e6 if durations else None


def measure(script: str, args: list[str], steps: int, timeout_s: float, deadline: float) -> Row:
    row = Row(script)

    def left() -> float:
        return max(1.0, min(timeout_s, deadline - time.monotonic()))

    for mode in ("plain", "torch.profiler"):
        try:
            done = subprocess.run([sys.executable, "-c", _CHILD, mode, str(WARMUP), str(TIMED), script, *args],
                                  capture_output=True, text=True, cwd=REPO, timeout=left(), check=False)
        except subprocess.TimeoutExpired:
            row.problems.append(f"{mode}: timed out")
            continue
        value = _median_ms(_durations(done.stdout))
        if value is None:
            tail = (done.stderr or done.stdout).strip().splitlines()
            row.problems.append(f"{mode}: no steps timed ({tail[-1][:200] if tail else done.returncode})")
        setattr(row, "plain_ms" if mode == "plain" else "profiler_ms", value)
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "advisor", "diagnose", "--save", folder + "/s", "--format", "json",
                   "-o", folder + "/r.json", script, *args]
        try:
            done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=left(), check=False)
            meta = json.loads((Path(folder) / "s" / "session.json").read_text())
        except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
            row.problems.append(f"advisor: {type(exc).__name__}")
            return row
    timed = [t for t in meta.get("timed_steps", []) if not t.get("partial")]
    recorded = [t["duration_ns"] - t.get("own_ns", 0) for t in timed if t["recorded"]]
    last = max((t["step"] for t in timed if t["recorded"]), default=None)
    after = [t["duration_ns"] - t.get("own_ns", 0) for t in timed
             if not t["recorded"] and last is not None and t["step"] > last + 1]
    row.recorded_ms, row.unrecorded_ms = _median_ms(recorded), _median_ms(after)
    cost = (meta.get("collector") or {}).get("cost") or {}
    row.recorder = f"{meta['collector']['name']}" + (f"/{cost['op_recorder']}" if cost.get("op_recorder") else "")
    row.per_op_ns = cost.get("per_op_ns")
    if done.returncode != 0:
        row.problems.append(f"advisor exited {done.returncode}")
    return row


def pace(script: str, args: list[str], steps: int, repeat: int, timeout_s: float) -> list[tuple[float, float]]:
    """(plain ms, advisor unrecorded ms) per pair of runs, alternated: the plain run times
    the steps advisor runs unrecorded (after the default window 2:7 and the step that
    closes it)."""
    first, last = 8, steps - 1  # the steps after the window's closing step, the last (cut short) left out
    pairs = []
    for k in range(repeat):
        got: dict[str, float | None] = {}
        for mode in (("plain", "advisor") if k % 2 == 0 else ("advisor", "plain")):
            if mode == "plain":
                done = subprocess.run([sys.executable, "-c", _CHILD, "plain", str(first), str(last - first), script,
                                       *args], capture_output=True, text=True, cwd=REPO, timeout=timeout_s,
                                      check=False)
                got["plain"] = _median_ms(_durations(done.stdout))
            else:
                got["advisor"] = measure(script, args, steps, timeout_s, time.monotonic() + timeout_s).unrecorded_ms
        if got.get("plain") and got.get("advisor"):
            pairs.append((got["plain"], got["advisor"]))
    return pairs


def _ms(value: float | None, base: float | None = None) -> str:
    if value is None:
        return "-"
    ratio = f" ({value / base:.2f}x)" if base else ""
    return f"{value:.2f}{ratio}"


def render(rows: list[Row], device: str) -> str:
    lines = [f"Median ms per step of steps {WARMUP}-{WARMUP + TIMED - 1}, one run, {device} (ratio to plain)",
             f"{'script':<34} {'plain':>8} {'advisor recorded':>18} {'advisor unrecorded':>19} "
             f"{'torch.profiler':>16}  recorder, ns/op"]
    for r in rows:
        lines.append(f"{Path(r.script).name:<34} {_ms(r.plain_ms):>8} {_ms(r.recorded_ms, r.plain_ms):>18} "
                     f"{_ms(r.unrecorded_ms, r.plain_ms):>19} {_ms(r.profiler_ms, r.plain_ms):>16}  "
                     f"{r.recorder}{f', {r.per_op_ns:.0f}' if r.per_op_ns is not None else ''}")
        lines.extend(f"    {p}" for p in r.problems)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", nargs="+", default=list(DEFAULT_SCRIPTS),
                        help="scripts, each with its arguments in one quoted word ('examples/x.py --flag')")
    parser.add_argument("--steps", type=int, default=12, help="steps each script runs (--steps N is passed on)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds allowed per process")
    parser.add_argument("--budget", type=float, default=1e9, help="seconds for the whole table; scripts left out after")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--pace", type=int, default=0, metavar="R",
                        help="instead: advisor's unrecorded steps against the same steps plain, R alternated pairs")
    args = parser.parse_args(argv)
    if args.pace:
        steps = max(args.steps, 20)
        print(f"advisor's unrecorded steps against the same steps plain ({steps} steps a run, {args.pace} alternated "
              "pairs): ratio min / median / max, and the median ms of each")
        for entry in args.scripts:
            script, *extra = shlex.split(entry)
            print(f"step_overhead: {entry} ...", file=sys.stderr, flush=True)
            pairs = pace(script, [*extra, "--steps", str(steps)], steps, args.pace, args.timeout)
            if not pairs:
                print(f"{Path(script).name:<34} no pair timed")
                continue
            ratios = sorted(a / p for p, a in pairs)
            print(f"{Path(script).name:<34} {ratios[0]:.2f}x / {statistics.median(ratios):.2f}x / {ratios[-1]:.2f}x"
                  f"   plain {statistics.median(p for p, _ in pairs):.2f} ms, advisor "
                  f"{statistics.median(a for _, a in pairs):.2f} ms")
        return 0
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    deadline = time.monotonic() + args.budget
    rows = []
    for entry in args.scripts:
        script, *extra = shlex.split(entry)
        if time.monotonic() >= deadline:
            rows.append(Row(script, problems=["not run: the budget was spent"]))
            continue
        print(f"step_overhead: {entry} ...", file=sys.stderr, flush=True)
        rows.append(measure(script, [*extra, "--steps", str(args.steps)], args.steps, args.timeout, deadline))
    print(render(rows, device))
    if args.json:
        args.json.write_text(json.dumps({"device": device, "rows": [r.__dict__ for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
