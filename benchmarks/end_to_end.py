"""What a user waits for: `advisor diagnose TRACE` against a plain read of the trace and
against `import pandas`, each a whole fresh process, in one run.

Baselines, measured in the same rounds as advisor so a machine's load falls on all alike:

    import pandas      ``python -c "import pandas"``: what any pandas tool waits for
                       before it reads a byte (the start-up baseline)
    json.load TRACE    ``python -c`` reading the whole trace with the standard library
                       (gzip.open and json.load): the end-to-end baseline

and for each trace ``advisor diagnose TRACE --format json -o FILE`` (ADVISOR_NO_CACHE=1:
nothing kept from an earlier run is used), from this checkout and, with ``--source DIR``,
from another one (a ``git worktree`` of an earlier commit) in the same rounds, so a change
is measured against its baseline in one run. The rounds alternate the order of the
commands; the median and the fastest wall time of each are printed, with its median CPU
time (user + system, the process and its children) and the ratios: advisor / json.load of
the same trace, advisor / import pandas.

Both checkouts' modules are byte-compiled first, as an installed package's are (a machine
with PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module on every start).

    python benchmarks/end_to_end.py [--rounds 7] [--traces T ...] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared" / "traces"
DEFAULT_TRACES = ("resnet50_v100_num_workers_0.pt.trace.json.gz", "bert_small_infer_h100.json.gz")

_JSON_LOAD = ("import gzip, json, sys\n"
              "path = sys.argv[1]\n"
              "with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:\n"
              "    json.load(f)\n")


def timed(command: list[str], *, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, children included) of one run of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description="advisor diagnose against json.load and import pandas, in one run.")
    parser.add_argument("--rounds", type=int, default=7, help="runs of each command (median and fastest kept)")
    parser.add_argument("--traces", nargs="*", type=Path, default=None,
                        help=f"traces to diagnose (default: {', '.join(DEFAULT_TRACES)} from {SHARED})")
    parser.add_argument("--source", type=Path, default=None,
                        help="another checkout of advisor to measure in the same rounds (a git worktree)")
    args = parser.parse_args()

    # Absolute: every command runs in a folder of its own.
    traces = [t.resolve() for t in (args.traces if args.traces is not None else [SHARED / n for n in DEFAULT_TRACES])]
    missing = [str(t) for t in traces if not t.is_file()]
    if missing:
        raise SystemExit(f"no such trace: {', '.join(missing)} (the shared traces are at {SHARED})")
    checkouts = {"advisor": REPO}
    if args.source is not None:
        if not (args.source / "advisor" / "__init__.py").is_file():
            raise SystemExit(f"--source {args.source}: not a checkout of advisor")
        checkouts[f"advisor@{args.source.name}"] = args.source.resolve()
    for folder in checkouts.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder / "advisor")], check=False,
                       stdout=subprocess.DEVNULL)

    work = Path(tempfile.mkdtemp(prefix="advisor-e2e-"))  # no advisor.toml, no pyproject.toml here
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"ADVISOR_NO_CACHE": "1"}
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "import pandas": ([sys.executable, "-c", "import pandas"], base_env)}
    for trace in traces:
        commands[f"json.load {trace.name}"] = ([sys.executable, "-c", _JSON_LOAD, str(trace)], base_env)
        for label, folder in checkouts.items():
            # The checkout first on the path: its package, not the installed one.
            env = base_env | {"PYTHONPATH": str(folder)}
            commands[f"{label} {trace.name}"] = (
                [sys.executable, "-m", "advisor", "diagnose", str(trace), "--format", "json", "-o",
                 str(work / "report.json")], env)

    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for round_ in range(args.rounds):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            command, env = commands[name]
            wall, cpu = timed(command, env=env, cwd=work)
            walls[name].append(wall)
            cpus[name].append(cpu)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    median = {name: statistics.median(values) for name, values in walls.items()}
    pandas = median["import pandas"]
    print(f"\n{args.rounds} rounds, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'command':<58} {'median s':>8} {'fastest':>8} {'CPU s':>6} {'x json.load':>11} {'x pandas':>8}")
    for name in names:
        trace = next((t for t in traces if name.endswith(" " + t.name)), None)
        x_json = ""
        if trace is not None and not name.startswith("json.load"):
            x_json = f"{median[name] / median[f'json.load {trace.name}']:.2f}"
        print(f"{name[:58]:<58} {median[name]:>8.2f} {min(walls[name]):>8.2f} {statistics.median(cpus[name]):>6.2f} "
              f"{x_json:>11} {median[name] / pandas:>8.2f}")


if __name__ == "__main__":
    main()
