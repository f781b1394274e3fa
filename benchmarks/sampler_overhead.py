"""Host sampler overhead: what the sampler thread costs the script's own thread.

Two measurements, both in this one process, sampler off and on in alternating blocks
(off first in even blocks, on first in odd ones) so that a machine whose load drifts
affects both sides alike:

steps   the median step time of a CPU loop with and without the sampler:

    python   a pure-Python step (integer arithmetic): the worst case, since the sampler
             thread must take the GIL from the step at every read
    torch    a float32 matmul step (torch releases the GIL inside the op); skipped where
             torch is not importable

        The slowdown is the median over block pairs of (median step on / median step
        off) - 1. On a shared machine this figure is noisy: a thread's start can move the
        script's thread to a busier core, and step times drift by several percent from
        second to second, so repeat it before trusting a difference of a few percent.

stalls  a spin loop reading ``time.perf_counter_ns()`` counts every gap longer than
        20 us: the time its thread did not run (the GIL taken by the sampler, the core
        taken by anything). The sampler's cost is the stalled time on minus off, per
        second and per read; other tenants' stalls fall on both sides.

It also prints the sampler's reads per second, its own CPU time as a share of one core,
and what read the counters (``proc``: Linux /proc through kept descriptors; ``psutil``).

    python benchmarks/sampler_overhead.py
    python benchmarks/sampler_overhead.py --interval 0.01 --blocks 40 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.collect.sampler import DEFAULT_INTERVAL_S, HostSampler  # noqa: E402

GAP_NS = 20_000


def python_step(n: int = 200_000) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def torch_step_factory():
    try:
        import torch
    except Exception:
        return None
    torch.set_num_threads(1)
    a = torch.randn(384, 384)
    b = torch.randn(384, 384)

    def step() -> None:
        for _ in range(8):
            a @ b

    return step


def time_steps(step, seconds: float) -> list[float]:
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def stalled_ns(seconds: float) -> int:
    """Spin for ``seconds``; the summed length of the gaps over GAP_NS between reads."""
    clock = time.perf_counter_ns
    end = clock() + int(seconds * 1e9)
    last = clock()
    stalled = 0
    while last < end:
        now = clock()
        if now - last > GAP_NS:
            stalled += now - last
        last = now
    return stalled


class Sampled:
    """Totals over the blocks the sampler ran in."""

    def __init__(self):
        self.reads = 0
        self.cpu_ns = 0
        self.seconds = 0.0
        self.counters = ""

    def run(self, work, interval_s: float):
        sampler = HostSampler(interval_s=interval_s).start()
        began = time.perf_counter()
        result = work()
        samples = sampler.stop()
        self.seconds += time.perf_counter() - began
        self.reads += len(samples.time_ns)
        self.cpu_ns += samples.sampler_cpu_ns
        self.counters = samples.counters
        return result

    def summary(self) -> dict:
        return {
            "reads_per_s": self.reads / self.seconds if self.seconds else 0.0,
            "sampler_cpu_share": self.cpu_ns / 1e9 / self.seconds if self.seconds else 0.0,
            "counters": self.counters,
        }


def paired(blocks: int, off, on) -> list[tuple]:
    """``blocks`` pairs of (off(), on()), the order swapped every other pair."""
    pairs = []
    for block in range(blocks):
        if block % 2 == 0:
            a = off()
            b = on()
        else:
            b = on()
            a = off()
        pairs.append((a, b))
    return pairs


def measure_steps(step, *, blocks: int, block_s: float, interval_s: float) -> dict:
    step()  # warm up
    sampled = Sampled()
    pairs = paired(blocks, lambda: time_steps(step, block_s),
                   lambda: sampled.run(lambda: time_steps(step, block_s), interval_s))
    off = [t for a, _ in pairs for t in a]
    on = [t for _, b in pairs for t in b]
    ratios = [statistics.median(b) / statistics.median(a) for a, b in pairs]
    return {
        "steps_off": len(off),
        "steps_on": len(on),
        "median_off_ms": statistics.median(off) * 1e3,
        "median_on_ms": statistics.median(on) * 1e3,
        "slowdown": statistics.median(ratios) - 1.0,
        **sampled.summary(),
    }


def measure_stalls(*, blocks: int, block_s: float, interval_s: float) -> dict:
    sampled = Sampled()
    pairs = paired(blocks, lambda: stalled_ns(block_s), lambda: sampled.run(lambda: stalled_ns(block_s), interval_s))
    off = statistics.median(a for a, _ in pairs) / block_s  # ns stalled per second
    on = statistics.median(b for _, b in pairs) / block_s
    summary = sampled.summary()
    per_read = (on - off) / summary["reads_per_s"] if summary["reads_per_s"] else float("nan")
    return {"stalled_off_ms_per_s": off / 1e6, "stalled_on_ms_per_s": on / 1e6,
            "sampler_cost_share": (on - off) / 1e9, "cost_per_read_us": per_read / 1e3, **summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="sampling interval, s")
    parser.add_argument("--blocks", type=int, default=24, help="off/on block pairs per measurement")
    parser.add_argument("--block-seconds", type=float, default=0.4)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    loops = {"python": python_step}
    torch_step = torch_step_factory()
    if torch_step is not None:
        loops["torch"] = torch_step
    steps = {name: measure_steps(step, blocks=args.blocks, block_s=args.block_seconds, interval_s=args.interval)
             for name, step in loops.items()}
    stalls = measure_stalls(blocks=args.blocks, block_s=args.block_seconds, interval_s=args.interval)

    print(f"host sampler overhead, interval {args.interval * 1e3:g} ms, {args.blocks} off/on block pairs "
          f"of {args.block_seconds:g} s")
    print(f"{'loop':<8} {'steps off/on':>13} {'median off':>11} {'median on':>10} {'slowdown':>9} "
          f"{'reads/s':>8} {'sampler CPU':>12} {'counters':>9}")
    for name, r in steps.items():
        print(f"{name:<8} {r['steps_off']:>6}/{r['steps_on']:<6} {r['median_off_ms']:>8.3f} ms "
              f"{r['median_on_ms']:>7.3f} ms {r['slowdown'] * 100:>8.2f}% {r['reads_per_s']:>8.1f} "
              f"{r['sampler_cpu_share'] * 100:>11.3f}% {r['counters']:>9}")
    print(f"stalls   spin loop stalled {stalls['stalled_off_ms_per_s']:.2f} ms/s off, "
          f"{stalls['stalled_on_ms_per_s']:.2f} ms/s on: the sampler costs {stalls['sampler_cost_share'] * 100:.2f}% "
          f"of the thread, {stalls['cost_per_read_us']:.0f} us a read at {stalls['reads_per_s']:.1f} reads/s")
    if args.json:
        args.json.write_text(json.dumps({"interval_s": args.interval, "steps": steps, "stalls": stalls}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
