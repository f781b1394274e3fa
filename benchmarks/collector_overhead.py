"""Collector overhead: the step time of one training loop with and without each collector.

The loop is a small CNN on 3x32x32 images fed by a DataLoader (pinned batches, copies
with non_blocking), trained with SGD. Each row runs it in a fresh Python process, all in
the same invocation, so the ratios compare like with like on one machine:

    plain           the loop alone
    host            advisor's host collector: run_script(gpu=False), i.e. advisor's step
                    and phase hooks plus torch.profiler with CPU activities, shapes and
                    stacks, over the whole run
    torch.profiler  torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True)
                    recording the same steps as the CUPTI row (GPU only)
    cupti           advisor's CUPTI collector: run_script(gpu=True, steps=A:B), i.e. the
                    hooks, the op recorder and CUPTI activity records (GPU only)

The loop times itself: ``time.perf_counter()`` from the end of one step to the end of
the next, so a step includes fetching its batch; on a GPU each step ends with
``torch.cuda.synchronize()``, so its time includes its kernels. It prints the times as
JSON. The table gives, per row, the median and 90th percentile over steps A to B-1 (the
steps the CUPTI collector and torch.profiler record; ``--window A:B``), the slowdown of
the median against the plain row, the process's wall time (start-up, collection and
post-processing included) and the time spent after the script ended (advisor's rows:
exporting, reading back and attributing the events).

    python benchmarks/collector_overhead.py                      # every row this machine can run
    python benchmarks/collector_overhead.py --window 3:23 --repeat 3 --json out.json

The loop is advisor.doctor.loop (``python -m advisor.doctor.loop --help``), the one
`advisor doctor --gpu-checks` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from advisor.doctor import loop

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
MARK = "collector_overhead:"  # prefix of the JSON line the collector child prints
LOOP = Path(loop.__file__)
ROWS = ("plain", "host", "torch.profiler", "cupti")
GPU_ROWS = ("torch.profiler", "cupti")


# -- the children -------------------------------------------------------------------------------

# Runs the loop under one of advisor's collectors and says which collector ran and how
# long the work after the script took.
_COLLECT_CHILD = r"""
import json, sys, time
from pathlib import Path
from advisor.collect import collect_script
from advisor.collect.steps import StepWindow
mark, script, gpu, start, stop, *args = sys.argv[1:]
began = time.perf_counter()
run = collect_script(Path(script), args, gpu=gpu == "gpu", steps=StepWindow(int(start), int(stop)))
total = time.perf_counter() - began
meta = run.session.meta
print(mark + json.dumps({"what": "collector", "collector": meta.collector.name,
                         "gpu_measured": meta.collector.gpu_measured, "notes": meta.collector.notes,
                         "events": len(run.session.events), "script_s": run.run.wall_time_s,
                         "after_s": total - run.run.wall_time_s}), flush=True)
sys.exit(run.exit_code)
"""


@dataclass
class Row:
    name: str
    step_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    after_s: list[float] = field(default_factory=list)
    note: str = ""
    failed: str = ""

    def window_median(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None

    def window_p90(self) -> float | None:
        if not self.step_s:
            return None
        ordered = sorted(self.step_s)
        return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def child_command(row: str, loop_args: list[str], window: tuple[int, int]) -> list[str]:
    if row == "plain":
        return [sys.executable, "-m", "advisor.doctor.loop", *loop_args]
    if row == "torch.profiler":
        return [sys.executable, "-m", "advisor.doctor.loop", *loop_args, "--torch-profiler", f"{window[0]}:{window[1]}"]
    gpu = "gpu" if row == "cupti" else "host"
    return [sys.executable, "-c", _COLLECT_CHILD, MARK, str(LOOP), gpu, str(window[0]), str(window[1]), *loop_args]


def read_marked(stdout: str) -> list[dict]:
    """The JSON lines of the loop and of the collector child."""
    out = []
    for line in stdout.splitlines():
        for mark in (MARK, loop.MARK):
            if line.startswith(mark):
                out.append(json.loads(line[len(mark):]))
    return out


def measure(row: Row, loop_args: list[str], window: tuple[int, int], timeout_s: float) -> None:
    command = child_command(row.name, loop_args, window)
    began = time.perf_counter()
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, cwd=REPO, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        row.failed = f"took longer than {timeout_s:.0f} s"
        return
    wall = time.perf_counter() - began
    reports = read_marked(done.stdout)
    steps = next((r for r in reports if r["what"] == "steps"), None)
    if done.returncode != 0 or steps is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        row.failed = f"exit {done.returncode}: {tail[0]}"
        return
    collector = next((r for r in reports if r["what"] == "collector"), None)
    if collector is not None:
        wanted = "cupti" if row.name == "cupti" else "host"
        if collector["collector"] != wanted:
            # advisor fell back to another collector: these times are not this row's.
            why = next((n for n in collector["notes"] if "GPU not measured" in n or "cupti" in n.lower()), "")
            row.failed = f"the {collector['collector']} collector ran instead" + (f" ({why})" if why else "")
            return
        row.after_s.append(collector["after_s"])
    start, stop = window
    row.step_s.extend(steps["step_s"][start:stop])
    row.wall_s.append(wall)


def ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.2f}"


def render(rows: list[Row], window: tuple[int, int], device: str) -> str:
    plain = next((r.window_median() for r in rows if r.name == "plain"), None)
    header = ("row", "median ms", "p90 ms", "x plain", "wall s", "after run s", "note")
    lines = []
    for row in rows:
        median = row.window_median()
        ratio = f"{median / plain:.2f}" if median is not None and plain else ""
        wall = f"{statistics.median(row.wall_s):.1f}" if row.wall_s else ""
        after = f"{statistics.median(row.after_s):.2f}" if row.after_s else ""
        note = row.failed or row.note
        lines.append((row.name, ms(median), ms(row.window_p90()), ratio, wall, after, note))
    widths = [max(len(str(x[i])) for x in [header, *lines]) for i in range(len(header))]
    out = [f"steps {window[0]}..{window[1] - 1} of each run, on {device}"]
    for line in [header, *lines]:
        out.append("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip())
    return "\n".join(out)


def bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="`python -m advisor.doctor.loop --help` describes the loop itself.")
    parser.add_argument("--window", type=loop.parse_window, default=(3, 23), metavar="A:B",
                        help="the steps measured (and recorded by torch.profiler and CUPTI): A to B-1 (default 3:23)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated rows to run (default: all of {', '.join(ROWS)})")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; step times are pooled")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = bench_parser()
    args = parser.parse_args(argv)
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    has_cuda = args.device.startswith("cuda") if args.device else cuda_available()
    device = args.device or ("cuda" if has_cuda else "cpu")
    stop = args.window[1]
    # Two steps past the window: the collectors close their windows there.
    loop_args = ["--steps", str(stop + 2), "--batch-size", str(args.batch_size), "--device", device]

    rows = [Row(name) for name in ROWS if name in wanted]
    for row in rows:
        if row.name in GPU_ROWS and device != "cuda":
            row.note = "needs a CUDA GPU: not run" + ("" if has_cuda else " (no CUDA device here)")
            continue
        for _ in range(args.repeat):
            print(f"collector_overhead: {row.name} ...", file=sys.stderr, flush=True)
            measure(row, loop_args, args.window, args.timeout)
            if row.failed:
                break
    print(render(rows, args.window, device))
    if args.json:
        args.json.write_text(json.dumps({
            "device": device, "window": list(args.window), "batch_size": args.batch_size,
            "rows": [{"name": r.name, "median_s": r.window_median(), "p90_s": r.window_p90(), "step_s": r.step_s,
                      "wall_s": r.wall_s, "after_s": r.after_s, "note": r.note, "failed": r.failed} for r in rows],
        }, indent=2))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
