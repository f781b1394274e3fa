"""What a step becomes when part of the host's work is taken off its critical path.

A fix that moves loading into worker processes does not save the loader's whole time: the
step after it is still at least

- the GPU's own busy time per step (work the GPU must do whatever the host does),
- the host's remaining work, run a little slower while the workers share the CPU, plus,
  where the host waits for the GPU once a step (``.item()``, a copy from pageable memory),
  the GPU's tail: the work still running after the host's last launch, which the loader
  used to hide and every step now waits for,
- the time the workers need to make a batch, divided among them,
- the CPU time the whole step needs (the rest of the host's work and the workers' CPU
  time per batch) spread over the cores the job may use, where that is known: the main
  process and its workers share them, and a worker that only waits (files, sleeps) takes
  none.

``best_workers`` picks the fewest workers that get within 5 % of the best step this
model allows.

``overlap_saving`` works that out three times, with the CPU contention the workers cause
at its expected value (the point estimate), at its worst (the low end of the saving) and
at its best (the high end: for a trace, where the loader may have run in a thread of the
training process and slowed the rest of the step too, the rest may even get faster). It
is a pure function of per-step figures, so ``benchmarks/savings.py`` applies it to a case
known only by its published summary tables as well as to the findings advisor makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.units import format_ns


@dataclass(frozen=True)
class StepFigures:
    """Per-step figures of the step a fix would change, ns (NaN: unknown)."""

    step_ns: float  # the whole step
    moved_ns: float  # the host time the fix takes off the critical path (loading)
    rest_ns: float = math.nan  # the host's other work per step (NaN: step_ns - moved_ns)
    gpu_busy_ns: float = 0.0  # the GPU's own busy time per step; 0 without a GPU
    tail_ns: float = 0.0  # GPU work still running after the host's last launch of a step
    waits_each_step: bool = False  # the host blocks on the GPU at least once a step
    workers: float = math.inf  # processes the moved work is spread over (inf: enough of them)
    cores: float = math.inf  # CPU cores the job may use (inf: not known)
    moved_cpu_share: float = 1.0  # the share of the moved work that is CPU time, not waiting


@dataclass(frozen=True)
class OverlapSaving:
    point_ns: float
    low_ns: float
    high_ns: float
    step_after_ns: float  # the step the point estimate leaves
    remains: str  # what the step keeps, in words
    binding: str = ""  # the floor the point estimate's step sits on: gpu, host, workers or cpu


def _rest(fig: StepFigures) -> float:
    return max(fig.step_ns - fig.moved_ns, 0.0) if math.isnan(fig.rest_ns) else max(fig.rest_ns, 0.0)


def step_after(fig: StepFigures, contention: float) -> tuple[float, str]:
    """The step once ``moved_ns`` overlaps the rest, with the rest of the host's work and
    the workers' own slowed by ``contention``; and which floor binds."""
    rest = _rest(fig) * contention
    tail = fig.tail_ns if fig.waits_each_step else 0.0
    floors = {
        "gpu": fig.gpu_busy_ns if not math.isnan(fig.gpu_busy_ns) else 0.0,
        "host": rest + (tail if not math.isnan(tail) else 0.0),
        "workers": fig.moved_ns * contention / fig.workers if fig.workers > 0 else math.inf,
        "cpu": ((rest + fig.moved_ns * fig.moved_cpu_share * contention) / min(fig.cores, fig.workers + 1)
                if math.isfinite(fig.cores) and fig.cores > 0 else 0.0),
    }
    binding = max(floors, key=floors.__getitem__)
    return floors[binding], binding


def overlap_saving(fig: StepFigures, *, contention: float, contention_worst: float,
                   contention_best: float) -> OverlapSaving:
    """The saving's point estimate and range (see the module docstring)."""
    after, binding = step_after(fig, contention)
    worst, _ = step_after(fig, contention_worst)
    best, _ = step_after(fig, contention_best)
    clamp = lambda ns: min(max(fig.step_ns - ns, 0.0), fig.step_ns)
    point, low, high = clamp(after), clamp(worst), clamp(best)
    low, high = min(low, point), max(high, point)
    rest = _rest(fig)
    parts = []
    if fig.gpu_busy_ns and not math.isnan(fig.gpu_busy_ns):
        parts.append(f"the GPU's own {format_ns(fig.gpu_busy_ns)} of work per step")
    parts.append(f"the host's other {format_ns(rest)} per step"
                 + (" (slower while workers share the CPU)" if fig.workers != 0 else ""))
    if fig.waits_each_step and fig.tail_ns and not math.isnan(fig.tail_ns):
        parts.append(f"the {format_ns(fig.tail_ns)} the GPU runs on after the host's last launch, which the host "
                     "waits for once a step")
    if math.isfinite(fig.workers):
        parts.append(f"the workers' {format_ns(fig.moved_ns)} per batch shared among {fig.workers:.0f}")
    if math.isfinite(fig.cores):
        parts.append(f"{fig.cores:.1f} CPU cores for the main process and its workers")
    bound = {"gpu": "the GPU's work", "host": "the host's other work", "workers": "the workers",
             "cpu": "the CPU cores"}[binding]
    remains = (f"The step keeps {'; '.join(parts)}. About {format_ns(after)} per step after the fix, bound by "
               f"{bound}.")
    return OverlapSaving(point, low, high, after, remains, binding)


def best_workers(fig: StepFigures, contention: float, cap: int) -> int:
    """The fewest workers (1..cap) whose step is within 5 % of the best this model allows."""
    cap = max(int(cap), 1)
    steps = [step_after(StepFigures(**{**fig.__dict__, "workers": n}), contention)[0] for n in range(1, cap + 1)]
    best = min(steps)
    return next(n for n, after in enumerate(steps, start=1) if after <= best * 1.05)
