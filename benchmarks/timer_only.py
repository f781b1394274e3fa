"""The per-step cost of ``advisor.Profiler(timer_only=True)``, against the plain loop.

Two loops, each timed plain and under the Profiler in the same process and run, rounds
interleaved (plain, timed, plain, timed...) so that drift and noise hit both alike:

    empty       ``for i in range(N): pass`` versus ``prof.step()`` in it: the bare cost
                of a step (two clock reads and a few integer appends)
    tiny model  a DataLoader over a TensorDataset feeding a Linear(16, 16) with SGD,
                batch 8: the reader hook's cost is in it too (each __next__ is timed)

Also a row for the full Profiler whose scheduler never records (the state machine on
top of the timer, what a job pays outside its recorded spans).

For each row: the median per-step time over the rounds, the overhead per step (timed
minus plain) and the ratio timed / plain. The Profiler's own Perf summary at stop() is
not part of the loop and is kept out of the timing (its output is swallowed).

    python benchmarks/timer_only.py                   # default sizes
    python benchmarks/timer_only.py --steps 20000 --rounds 9
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import advisor


def never(step: int) -> advisor.ProfilerState:
    return advisor.ProfilerState.CLOSED


def empty_loop(steps: int, prof: advisor.Profiler | None) -> int:
    """Time ``steps`` empty iterations (with ``prof.step()`` where profiled), in ns."""
    if prof is None:
        start = time.perf_counter_ns()
        for _ in range(steps):
            pass
        return time.perf_counter_ns() - start
    with contextlib.redirect_stdout(io.StringIO()):
        prof.start()
        start = time.perf_counter_ns()
        for _ in range(steps):
            prof.step()
        elapsed = time.perf_counter_ns() - start
        prof.stop()
    return elapsed


def model_loop_factory(batch: int = 8) -> Callable[[int, advisor.Profiler | None], int]:
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def run(steps: int, prof: advisor.Profiler | None) -> int:
        data = TensorDataset(torch.randn(steps * batch, 16), torch.randn(steps * batch, 16))
        loader = DataLoader(data, batch_size=batch)

        def loop() -> int:
            start = time.perf_counter_ns()
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if prof is not None:
                    prof.step(num_samples=batch)
            return time.perf_counter_ns() - start

        if prof is None:
            return loop()
        with contextlib.redirect_stdout(io.StringIO()):
            prof.start()
            elapsed = loop()
            prof.stop()
        return elapsed

    return run


def measure(loop: Callable[[int, advisor.Profiler | None], int], make: Callable[[], advisor.Profiler],
            steps: int, rounds: int) -> tuple[float, float]:
    """Median per-step ns of the plain loop and of the profiled one, rounds interleaved."""
    loop(min(steps, 200), None)  # warm-up: first calls allocate and import lazily
    loop(min(steps, 200), make())
    plain, timed = [], []
    for _ in range(rounds):
        plain.append(loop(steps, None) / steps)
        timed.append(loop(steps, make()) / steps)
    return statistics.median(plain), statistics.median(timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000, help="steps per round (the model loop runs a fifth of them)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows = [
        ("empty loop", empty_loop, lambda: advisor.Profiler(timer_only=True), args.steps),
        ("empty loop", empty_loop, lambda: advisor.Profiler(scheduler=never), args.steps),
        ("tiny model", model_loop_factory(), lambda: advisor.Profiler(timer_only=True), max(args.steps // 5, 50)),
        ("tiny model", model_loop_factory(), lambda: advisor.Profiler(scheduler=never), max(args.steps // 5, 50)),
    ]
    print(f"advisor.Profiler per-step overhead: median over {args.rounds} interleaved rounds, torch {torch.__version__}")
    print(f"{'loop':<12}{'profiler':<28}{'steps':>7}{'plain/step':>13}{'timed/step':>13}{'overhead':>12}{'ratio':>8}")
    for label, loop, make, steps in rows:
        plain, timed = measure(loop, make, steps, args.rounds)
        kind = "timer_only=True" if make().timer_only else "scheduler never records"
        print(f"{label:<12}{kind:<28}{steps:>7}{plain / 1e3:>10.2f} us{timed / 1e3:>10.2f} us"
              f"{(timed - plain) / 1e3:>9.2f} us{timed / plain:>8.3f}")


if __name__ == "__main__":
    main()
