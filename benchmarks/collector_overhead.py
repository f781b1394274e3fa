"""Collector overhead: what profiling costs, and whether advisor's figures survive it.

Two parts, each run in fresh processes in one invocation, so ratios compare like with
like on one machine.

Scripts (``--part scripts``): example scripts, the ones written as users write them
included (a Dataset that tokenizes in Python, an in-memory loop, a per-sample
augmentation), each run three ways:

    plain           the script alone; it times its own steps (ms/step after two warm-up
                    steps, and the share spent waiting for its data)
    advisor         advisor diagnose SCRIPT --format json: the step time advisor reports
                    (the unrecorded steps' mean), the recorded steps' time, the overhead,
                    the loader share it reports (or host-bound's share for a loop with no
                    loader), the process's peak RSS and wall time
    torch.profiler  the script inside torch.profiler.profile() with its default settings
                    (every step, CPU activities), and the trace exported: its own step
                    time under the profiler, peak RSS, wall time

Loop (``--part loop``): the CNN training loop of advisor.doctor.loop with and without
each collector, step times over the same window of steps:

    plain           the loop alone
    host            advisor's host collector: collect_script(gpu=False, steps=A:B), i.e.
                    the hooks, the stack sampler and torch.profiler recording steps A..B-1
    torch.profiler  torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True)
                    recording the same steps as the CUPTI row (GPU only)
    cupti           advisor's CUPTI collector: collect_script(gpu=True, steps=A:B), i.e.
                    the hooks, the op recorder and CUPTI activity records (GPU only)

The loop times itself: ``time.perf_counter()`` from the end of one step to the end of
the next, so a step includes fetching its batch; on a GPU each step ends with
``torch.cuda.synchronize()``, so its time includes its kernels. It prints the times as
JSON. The table gives, per row, the median and 90th percentile over steps A to B-1 (the
steps the CUPTI collector and torch.profiler record; ``--window A:B``), the slowdown of
the median against the plain row, the process's wall time (start-up, collection and
post-processing included) and the time spent after the script ended (advisor's rows:
exporting, reading back and attributing the events).

    python benchmarks/collector_overhead.py                      # both parts, every row this machine can run
    python benchmarks/collector_overhead.py --part scripts --repeat 3
    python benchmarks/collector_overhead.py --part loop --window 3:23 --repeat 3 --json out.json

Ops (``--part ops``): what recording costs one op, in one process, rounds interleaved so
noise hits every row alike: a loop of small ops (an in-place add on a small tensor, a
matmul of two 8x8 matrices, a view) run plain, under advisor's native op recorder (the one
the CUPTI collector uses: torch's RecordFunction callbacks in C++), under its Python
fallback (a dispatch mode), and under torch.profiler with CPU activities and
record_shapes. The table gives the median ns per op and the cost added over plain; the
goal is advisor's added cost per op at most torch.profiler's. No GPU is needed.

    python benchmarks/collector_overhead.py --part ops --rounds 9

The loop is advisor.doctor.loop (``python -m advisor.doctor.loop --help``), the one
`advisor doctor --gpu-checks` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
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


# -- the scripts part ----------------------------------------------------------------------------

EXAMPLES = REPO / "examples"
SCRIPTS = (
    ("starved_loader", ["starved_loader.py", "--steps", "20"]),
    ("clean_train", ["clean_train.py", "--steps", "60"]),
    ("tokenize_dataset", ["tokenize_dataset.py", "--steps", "20"]),
    ("in_memory_loop", ["in_memory_loop.py", "--steps", "300"]),
    ("augment_loop", ["augment_loop.py", "--steps", "40"]),
    ("json_records", ["json_records.py", "--steps", "40"]),
    ("random_augment", ["random_augment.py", "--steps", "40"]),
)
# Runs a command and prints, as its last line, the peak RSS of the processes it waited
# for (the command and its children: DataLoader workers), in KiB.
_RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print('\\npeak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)\n"
    "sys.exit(done.returncode)\n"
)
# The script inside torch.profiler with its defaults, the trace exported at the end.
_TORCH_PROFILER = (
    "import runpy, sys, tempfile, torch\n"
    "script = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "prof = torch.profiler.profile()\n"
    "prof.start()\n"
    "try:\n"
    "    runpy.run_path(script, run_name='__main__')\n"
    "finally:\n"
    "    prof.stop()\n"
    "    prof.export_chrome_trace(tempfile.mkdtemp() + '/trace.json')\n"
)
_OWN_TIMES = re.compile(r"(?P<ms>\d+\.\d+) ms/step, (?:loader wait|augmentation) (?P<share>\d+\.\d+)%")


@dataclass
class ScriptRow:
    name: str
    plain_ms: list[float] = field(default_factory=list)
    plain_share: list[float] = field(default_factory=list)
    plain_rss: list[float] = field(default_factory=list)
    plain_wall: list[float] = field(default_factory=list)
    reported_ms: list[float] = field(default_factory=list)
    recorded_ms: list[float] = field(default_factory=list)
    reported_share: list[float] = field(default_factory=list)
    advisor_rss: list[float] = field(default_factory=list)
    advisor_wall: list[float] = field(default_factory=list)
    torch_ms: list[float] = field(default_factory=list)
    torch_rss: list[float] = field(default_factory=list)
    torch_wall: list[float] = field(default_factory=list)
    top: str = ""
    failed: str = ""


def _timed(command: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``command`` under the RSS wrapper: (the run, wall seconds, peak RSS MiB)."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RSS_WRAPPER, *command], check=False, capture_output=True,
                          text=True, cwd=REPO, timeout=timeout_s, env={**os.environ, "ADVISOR_NO_PROGRESS": "1"})
    wall = time.perf_counter() - began
    match = re.search(r"peak_rss_kib (\d+)", done.stdout)
    return done, wall, int(match[1]) / 1024 if match else float("nan")


def _own_times(stdout: str) -> tuple[float, float] | None:
    match = _OWN_TIMES.search(stdout)
    return (float(match["ms"]), float(match["share"]) / 100) if match else None


def measure_script(row: ScriptRow, argv: list[str], timeout_s: float) -> None:
    script = [str(EXAMPLES / argv[0]), *argv[1:]]
    done, wall, rss = _timed([sys.executable, *script], timeout_s)
    own = _own_times(done.stdout)
    if done.returncode != 0 or own is None:
        row.failed = f"plain run: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-200:]}"
        return
    row.plain_ms.append(own[0])
    row.plain_share.append(own[1])
    row.plain_rss.append(rss)
    row.plain_wall.append(wall)

    with tempfile.TemporaryDirectory() as folder:
        report_path = Path(folder) / "report.json"
        done, wall, rss = _timed([sys.executable, "-m", "advisor", "diagnose", "--format", "json", "-o",
                                  str(report_path), *script], timeout_s)
        if done.returncode != 0 or not report_path.is_file():
            row.failed = f"advisor: exit {done.returncode}: {done.stderr.strip()[-200:]}"
            return
        report = json.loads(report_path.read_text())
    steps = report["session"]["steps"]
    row.reported_ms.append((steps.get("unrecorded_mean_step_ns") or steps["mean_step_ns"]) / 1e6)
    row.recorded_ms.append(steps["mean_step_ns"] / 1e6)
    timing = {r["key"]: r for r in report["tables"]["step_timing"]["rows"]}
    findings = report["findings"]
    host = next((f for f in findings if f["rule"] == "host-bound"), None)
    if argv[0] == "augment_loop.py" and host is not None:
        row.reported_share.append(host["saving"]["share_of_step"])
    else:
        row.reported_share.append(timing.get("Dataloader", {}).get("best_ratio") or 0.0)
    row.top = f"{findings[0]['rule']} ({findings[0]['severity']})" if findings else "no findings"
    row.advisor_rss.append(rss)
    row.advisor_wall.append(wall)

    done, wall, rss = _timed([sys.executable, "-c", _TORCH_PROFILER, *script], timeout_s)
    own = _own_times(done.stdout)
    if done.returncode == 0 and own is not None:
        row.torch_ms.append(own[0])
        row.torch_rss.append(rss)
        row.torch_wall.append(wall)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render_scripts(rows: list[ScriptRow]) -> str:
    header = ("script", "plain ms/step", "advisor reports", "recorded", "share plain/advisor", "torch.profiler",
              "peak RSS MiB plain/advisor/torch", "wall s plain/advisor/torch", "top finding")
    lines = []
    for row in rows:
        if row.failed:
            lines.append((row.name, "", "", "", "", "", "", "", row.failed))
            continue
        plain = _median(row.plain_ms)
        reported, recorded, torch_ms = _median(row.reported_ms), _median(row.recorded_ms), _median(row.torch_ms)
        lines.append((
            row.name, f"{plain:.2f}", f"{reported:.2f} ({reported / plain:.2f}x)",
            f"{recorded:.2f} ({recorded / plain:.2f}x)",
            f"{_median(row.plain_share):.0%} / {_median(row.reported_share):.0%}",
            f"{torch_ms:.2f} ({torch_ms / plain:.2f}x)" if row.torch_ms else "failed",
            f"{_median(row.plain_rss):.0f} / {_median(row.advisor_rss):.0f} / {_median(row.torch_rss):.0f}",
            f"{_median(row.plain_wall):.1f} / {_median(row.advisor_wall):.1f} / {_median(row.torch_wall):.1f}",
            row.top,
        ))
    widths = [max(len(str(x[i])) for x in [header, *lines]) for i in range(len(header))]
    out = ["step times are each run's mean after two warm-up steps; 'advisor reports' is the step time in "
           "advisor's report (the steps it did not record), 'recorded' the steps it recorded; share is the "
           "loader's share of the step (augment_loop: the augmentation's)"]
    for line in [header, *lines]:
        out.append("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip())
    return "\n".join(out)


def run_scripts(args: argparse.Namespace) -> tuple[str, list[dict], bool]:
    rows = [ScriptRow(name) for name, _ in SCRIPTS if not args.scripts or name in args.scripts]
    argvs = dict(SCRIPTS)
    for _ in range(args.repeat):
        for row in rows:
            if row.failed:
                continue
            print(f"collector_overhead: {row.name} ...", file=sys.stderr, flush=True)
            try:
                measure_script(row, argvs[row.name], args.timeout)
            except subprocess.TimeoutExpired:
                row.failed = f"took longer than {args.timeout:.0f} s"
    data = [{key: value for key, value in vars(row).items()} for row in rows]
    return render_scripts(rows), data, any(row.failed for row in rows)


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
    parser.add_argument("--part", choices=["scripts", "loop", "ops", "all"], default="all",
                        help="the example scripts, the CNN loop under each collector, the per-op cost of each "
                             "recorder, or all (default)")
    parser.add_argument("--rounds", type=int, default=7, help="--part ops: rounds, interleaved")
    parser.add_argument("--op-iterations", type=int, default=2000, help="--part ops: iterations a round")
    parser.add_argument("--scripts", type=lambda text: [s for s in text.split(",") if s], default=None,
                        metavar="NAME,...", help=f"only these scripts (of {', '.join(n for n, _ in SCRIPTS)})")
    return parser


OP_ROWS = ("plain", "advisor native", "advisor python", "torch.profiler")


def run_ops(args: argparse.Namespace) -> tuple[str, dict, bool]:
    """Per-op cost of each recorder (see the module docstring)."""
    import torch

    from advisor.collect import op_recorder
    from advisor.collect.hooks.recorder import quiet_kineto

    torch.set_num_threads(1)
    a, b, t = torch.ones(8, 8), torch.ones(8, 8), torch.zeros(64)
    ops_per_iteration = 3

    def work(n: int) -> int:
        began = time.perf_counter_ns()
        for _ in range(n):
            t.add_(1)
            torch.mm(a, b)
            t.view(8, 8)
        return time.perf_counter_ns() - began

    native, why = op_recorder.make_op_recorder(torch)
    python_recorder = op_recorder.PythonOpRecorder(torch)

    def under(row: str, n: int) -> int:
        if row == "plain":
            return work(n)
        if row == "torch.profiler":  # its start and stop are outside the timed loop, as the recorders'
            with quiet_kineto(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                        record_shapes=True):
                return work(n)
        recorder = native if row == "advisor native" else python_recorder
        recorder.start()
        try:
            return work(n)
        finally:
            recorder.stop()
            recorder.discard()

    rows = [r for r in OP_ROWS if not (r == "advisor native" and isinstance(native, op_recorder.PythonOpRecorder))]
    per_op: dict[str, list[float]] = {r: [] for r in rows}
    work(200)  # warm every path once
    for _ in range(args.rounds):
        for row in rows:
            per_op[row].append(under(row, args.op_iterations) / (args.op_iterations * ops_per_iteration))
    plain = statistics.median(per_op["plain"])
    lines = [f"Per-op cost of recording: {args.op_iterations} iterations of 3 small ops (add_, mm 8x8, view), "
             f"{args.rounds} rounds interleaved, median ns per op; one process, one thread"]
    lines.append(f"{'row':<16} {'ns/op':>9} {'added':>9} {'x plain':>8}")
    data = {"rounds": args.rounds, "iterations": args.op_iterations, "rows": {}}
    for row in rows:
        median = statistics.median(per_op[row])
        lines.append(f"{row:<16} {median:9.0f} {median - plain:9.0f} {median / plain:8.2f}")
        data["rows"][row] = {"median_ns_per_op": median, "added_ns_per_op": median - plain, "samples": per_op[row]}
    if "advisor native" not in rows:
        lines.append(f"advisor native: not run ({why})")
    else:
        native_added = data["rows"]["advisor native"]["added_ns_per_op"]
        profiler_added = data["rows"]["torch.profiler"]["added_ns_per_op"]
        lines.append(f"advisor's native recorder adds {native_added / max(profiler_added, 1e-9):.2f}x what "
                     "torch.profiler (record_shapes) adds an op (goal: at most 1x)")
    return "\n".join(lines), data, False


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run_loop(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, dict, bool]:
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; choose from {', '.join(ROWS)}")
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
    data = {"device": device, "window": list(args.window), "batch_size": args.batch_size,
            "rows": [{"name": r.name, "median_s": r.window_median(), "p90_s": r.window_p90(), "step_s": r.step_s,
                      "wall_s": r.wall_s, "after_s": r.after_s, "note": r.note, "failed": r.failed} for r in rows]}
    return render(rows, args.window, device), data, any(r.failed for r in rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = bench_parser()
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    out: dict = {}
    failed = False
    if args.part in ("scripts", "all"):
        text, out["scripts"], bad = run_scripts(args)
        print(text)
        failed |= bad
    if args.part in ("loop", "all"):
        text, out["loop"], bad = run_loop(args, parser)
        if args.part == "all":
            print()
        print(text)
        failed |= bad
    if args.part in ("ops", "all"):
        text, out["ops"], bad = run_ops(args)
        if args.part == "all":
            print()
        print(text)
        failed |= bad
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
