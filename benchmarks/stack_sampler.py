"""What sampling Python stacks costs, and whether the samples land where the time goes.

Three workloads, each timed plainly and under each sampler, interleaved over rounds so
that the machine's noise falls on all alike (medians reported):

    python   a tokenizer-like loop in pure Python: a regex split and a greedy dictionary
             match per word, about 80% of the time in ``hot()`` and 20% in ``cold()``
    mixed    a Dataset's __getitem__: the same Python work, then one small tensor made of
             it (``make_tensor()``, where torch gives the GIL up); nearly all the time is
             in ``hot()``
    torch    small tensor ops from Python (a per-sample augmentation): most time inside
             torch, which gives the GIL up on every op

Samplers: advisor's, by signal (SIGPROF on the process's CPU time) and by thread
(``sys._current_frames()`` from a background thread), at 5 ms and 1 ms; and pyinstrument,
where it is installed (``pip install pyinstrument``), at its default interval. For each:
the slowdown against the plain run, samples per second, and the share of the samples
that fall in ``hot()`` (python: about 80%; mixed: nearly all). A thread sampler needs the
GIL to read a stack, so in the mixed workload it reads it where torch hands the GIL over,
in ``make_tensor()``, rather than where the time goes.

    python benchmarks/stack_sampler.py              # 5 rounds
    python benchmarks/stack_sampler.py --rounds 9
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable

from advisor.collect.stacks import StackSampler

WORD = re.compile(r"[a-z]+")
VOCAB = {f"{a}{b}{c}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwxyz"}
TEXT = " ".join(f"{a}{b}{c}{d}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwxyz" for d in "ab")


def hot() -> int:
    pieces = 0
    for word in WORD.findall(TEXT):
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                if word[start:end] in VOCAB or end == start + 1:
                    pieces += 1
                    start = end
                    break
    return pieces


def cold() -> int:
    return sum(len(str(i)) for i in range(2300))


def python_unit() -> None:
    hot()
    cold()


def torch_unit() -> None:
    import torch

    out = []
    for image in IMAGES:
        padded = torch.nn.functional.pad(image, (4, 4, 4, 4))
        out.append(padded[:, 2:34, 3:35].flip(-1))
    torch.stack(out)


def make_tensor(values: list[int]):
    import torch

    return torch.tensor(values)


def mixed_unit() -> None:
    """A Dataset's __getitem__: Python work, then one tensor made of it (the GIL given up)."""
    for _ in range(4):
        hot()
        make_tensor(list(range(256)))


IMAGES: list = []


def _shares(names: list[str]) -> float:
    """The share of the samples in hot() or cold() (make_tensor() in the mixed workload)
    that are in hot()."""
    counted = [n for n in names if n in ("hot", "cold", "make_tensor")]
    return sum(1 for n in counted if n == "hot") / len(counted) if counted else float("nan")


def run_advisor(work: Callable[[], None], how: str, interval: float) -> tuple[float, int, float]:
    sampler = StackSampler(interval_s=interval, how=how).start()
    began = time.perf_counter()
    work()
    elapsed = time.perf_counter() - began
    samples = sampler.stop()
    names = []
    for stack_id in samples.stack_id:
        frames = samples.stacks[stack_id].split(";")
        names.append(next((f.split(": ")[-1] for f in frames if f.split(": ")[-1] in ("hot", "cold", "make_tensor")),
                          ""))
    return elapsed, len(samples), _shares(names)


def run_pyinstrument(work: Callable[[], None]) -> tuple[float, int, float] | None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    profiler = Profiler()
    profiler.start()
    began = time.perf_counter()
    work()
    elapsed = time.perf_counter() - began
    session = profiler.stop()
    frame = session.root_frame()
    totals = {"hot": 0.0, "cold": 0.0}

    def walk(node) -> None:
        if node.function in totals:
            totals[node.function] += node.time
            return
        for child in node.children:
            walk(child)

    if frame is not None:
        walk(frame)
    total = sum(totals.values())
    return elapsed, session.sample_count, totals["hot"] / total if total else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed run")
    args = parser.parse_args(argv)
    import torch

    IMAGES.extend(torch.rand(64, 3, 32, 32))
    # Each workload is a fixed number of units, about --seconds long, so that a slowdown
    # shows as a longer run.
    fixed: dict[str, Callable[[], None]] = {}
    for name, unit in (("python", python_unit), ("mixed", mixed_unit), ("torch", torch_unit)):
        calls = 0
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            unit()
            calls += 1
        fixed[name] = (lambda u, n: (lambda: [u() for _ in range(n)]))(unit, max(calls, 1))
    samplers = [("plain", None), ("advisor signal 5 ms", ("signal", 0.005)), ("advisor thread 5 ms", ("thread", 0.005)),
                ("advisor signal 1 ms", ("signal", 0.001)), ("advisor thread 1 ms", ("thread", 0.001)),
                ("pyinstrument", "pyinstrument")]
    results: dict[tuple[str, str], list[tuple[float, int, float]]] = {}
    for _ in range(args.rounds):
        for workload, work in fixed.items():
            for label, how in samplers:
                if how is None:
                    began = time.perf_counter()
                    work()
                    got = (time.perf_counter() - began, 0, float("nan"))
                elif how == "pyinstrument":
                    got = run_pyinstrument(work)
                    if got is None:
                        continue
                else:
                    got = run_advisor(work, *how)
                results.setdefault((workload, label), []).append(got)
    print(f"{'workload':8}  {'sampler':22}  {'median s':>9}  {'x plain':>8}  {'samples/s':>9}  {'in hot()':>8}")
    for workload in fixed:
        plain = statistics.median(r[0] for r in results[(workload, "plain")])
        for label, _ in samplers:
            runs = results.get((workload, label))
            if not runs:
                print(f"{workload:8}  {label:22}  not installed")
                continue
            elapsed = statistics.median(r[0] for r in runs)
            rate = statistics.median(r[1] / r[0] for r in runs)
            hot_share = statistics.median(r[2] for r in runs)
            share = "" if label == "plain" or workload == "torch" else f"{hot_share:8.0%}"
            print(f"{workload:8}  {label:22}  {elapsed:9.3f}  {elapsed / plain:8.3f}  {rate:9.0f}  {share:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
