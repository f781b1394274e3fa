"""How the rules turn a fix into a saving: replayed on the step model's graph.

A rule states its fix as a change to the graph (advisor.step.whatif.Fix); ``replayed``
replays it at the point estimate and at the two ends of its range and returns the finding's
Saving: the replayed step's reduction, never more than the time the fix changes, with what
the step keeps. Where a fix leaves a floor the graph cannot see (worker processes that make
a batch at their own pace, the CPU cores they share with the training loop), the floor is
part of the Fix.

What worker processes leave, for a fix that moves loading into them (``StepFigures``,
``step_after``, ``best_workers``): the step is still at least

- the time the workers need to make a batch and hand it over, divided among them,
- the main process's own work: the rest of the step and receiving the batch from a worker;
  where its operators run on more threads than the workers leave cores (torch's default of
  a thread per core, on a CPU), at worst they scaled with their threads and run that much
  slower on the cores left (``rest_slowdown``),
- the CPU time the whole step needs (the rest of the host's work, receiving the batch and
  the workers' CPU time per batch) spread over the cores the job may use, where that is
  known: the main process and its workers share them, and a worker that only waits (files,
  sleeps) takes none;

and the graph adds the rest: the GPU's own work, the host's other work (a little slower
while the workers share the CPU), and the GPU's tail where the host waits for it.
``best_workers`` picks the fewest workers that get within 5 % of the best step these
floors allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from advisor.findings import Saving

if TYPE_CHECKING:
    from advisor.rules.registry import RuleContext
    from advisor.step.whatif import Fix, WhatIf


@dataclass(frozen=True)
class StepFigures:
    """Per-step figures of a step whose loading moves into worker processes, ns (NaN:
    unknown). The GPU's work and the host's waits are the step graph's to replay; these are
    what it cannot see."""

    step_ns: float  # the whole step
    moved_ns: float  # the host time the fix takes off the critical path (loading)
    rest_ns: float = math.nan  # the host's other work per step (NaN: step_ns - moved_ns)
    workers: float = math.inf  # processes the moved work is spread over (inf: enough of them)
    cores: float = math.inf  # CPU cores the job may use (inf: not known)
    moved_cpu_share: float = 1.0  # the share of the moved work that is CPU time, not waiting
    # Handing a batch over from a worker (advisor.collect.handoff, timed on the machine; 0:
    # not known): the main process's CPU time to receive one, and a worker's time to send one.
    handoff_ns: float = 0.0
    handoff_worker_ns: float = 0.0
    # The threads the host's other work runs its operators on now (torch.get_num_threads();
    # 1: one, or not known).
    rest_threads: float = 1.0


def _rest(fig: StepFigures) -> float:
    return max(fig.step_ns - fig.moved_ns, 0.0) if math.isnan(fig.rest_ns) else max(fig.rest_ns, 0.0)


def rest_slowdown(fig: StepFigures) -> float:
    """At worst, how much longer the host's other work takes once the workers run: where
    its operators run on more threads than the cores the workers leave (at least one), as
    if they had scaled perfectly with their threads; 1 where they fit in what the workers
    leave, or the figures do not say. (Their CPU time is no better a guide: idle operator
    threads spin between operators, and it counts that too.)"""
    if not (math.isfinite(fig.cores) and math.isfinite(fig.workers)) or not fig.rest_threads > 1.0:
        return 1.0
    left = max(fig.cores - fig.workers * fig.moved_cpu_share, 1.0)
    return max(min(fig.rest_threads, fig.cores) / left, 1.0)


def step_after(fig: StepFigures, contention: float) -> tuple[float, str]:
    """The step once ``moved_ns`` overlaps the rest, with the rest of the host's work and
    the workers' own slowed by ``contention`` (the rest also by ``rest_slowdown``), as far
    as these figures say; and which floor binds: host (the rest of the host's work),
    workers or cpu."""
    floors = {
        "host": _rest(fig) * contention * rest_slowdown(fig) + fig.handoff_ns,
        "workers": _worker_batch(fig, contention) / fig.workers if fig.workers > 0 else math.inf,
        "cpu": _cpu_floor(fig, contention),
    }
    binding = max(floors, key=floors.__getitem__)
    return floors[binding], binding


def _worker_batch(fig: StepFigures, contention: float) -> float:
    """A worker's time to make one batch and hand it over."""
    return fig.moved_ns * contention + fig.handoff_worker_ns


def _cpu_floor(fig: StepFigures, contention: float) -> float:
    """The step's CPU time (the main process's: the rest of its work, as long as it runs
    beside the workers, and receiving the batch; the workers' per batch) spread over the
    cores they share; 0 where the cores are not known."""
    if not (math.isfinite(fig.cores) and fig.cores > 0):
        return 0.0
    main_cpu = _rest(fig) * rest_slowdown(fig) * contention + fig.handoff_ns
    worker_cpu = fig.moved_ns * fig.moved_cpu_share * contention + fig.handoff_worker_ns
    return (main_cpu + worker_cpu) / min(fig.cores, fig.workers + 1)


def best_workers(fig: StepFigures, contention: float, cap: int) -> int:
    """The fewest workers (1..cap) whose step is within 5 % of the best this model allows."""
    cap = max(int(cap), 1)
    steps = [step_after(StepFigures(**{**fig.__dict__, "workers": n}), contention)[0] for n in range(1, cap + 1)]
    best = min(steps)
    return next(n for n, after in enumerate(steps, start=1) if after <= best * 1.05)


def saving(ctx: RuleContext, ns_per_step: float, basis: str, *, low_ns: float | None = None,
           high_ns: float | None = None, remains: str = "", step_ns: float | None = None) -> Saving:
    """A finding's saving: the point estimate ``ns_per_step`` (ranking uses it), and where
    the rule models them, the bounds it lies between and what the fix cannot remove. A
    point that is not a finite number is refused: the saving is then 0, its basis says it
    was not estimated, and the rule goes on; a bound that is none is left out. The share is
    of the run's step (``ctx.run_step_ns``), or of ``step_ns`` where the rule knows the job's
    own step better (advisor's own cost taken out of it)."""
    step = _finite(ctx.run_step_ns if step_ns is None else step_ns)
    if not ctx.step_count:
        basis += "; no steps were found, so the whole window counts as one step"
    point = _finite(ns_per_step)
    if point is None:
        # Refused here, so the rule still says what it found: a figure that is no number
        # (a replay over a graph the profile made degenerate) is never ranked or shown.
        return Saving(ms_per_step=0.0, share_of_step=0.0, remains=remains,
                      basis=basis + f"; not estimated: the estimate came out as {ns_per_step!r}, not a number of ns")
    ns = max(point, 0.0)
    share = min(ns / step, 1.0) if step is not None and step > 0 else 0.0
    low_ns, high_ns = _finite(low_ns), _finite(high_ns)
    low = None if low_ns is None else round(min(max(low_ns, 0.0), ns) / 1e6, 4)
    high = None if high_ns is None else round(max(high_ns, ns) / 1e6, 4)
    return Saving(ms_per_step=round(ns / 1e6, 4), share_of_step=round(share, 4), basis=basis,
                  low_ms_per_step=low, high_ms_per_step=high, remains=remains)


def _finite(value: object) -> float | None:
    """A figure as a finite float, or None where it is none (NaN, infinite, no number)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def worker_floor(fig: StepFigures, contention: float) -> float:
    """The step the workers and the cores allow, whatever the graph does: the floors of
    ``step_after`` that the step graph cannot see."""
    floors = [_worker_batch(fig, contention) / fig.workers if fig.workers > 0 else math.inf]
    if math.isfinite(fig.cores) and fig.cores > 0:
        floors.append(_cpu_floor(fig, contention))
    return max(f for f in floors if math.isfinite(f)) if any(math.isfinite(f) for f in floors) else 0.0


def replayed(ctx: RuleContext, fix: Fix, basis: str, *, low: Fix | None = None, high: Fix | None = None,
             base: Fix | None = None, remains: str = "", step_ns: float | None = None) -> tuple[Saving, WhatIf] | None:
    """The finding's Saving from ``fix`` replayed on the step graph (the point), ``low``
    and ``high`` (the ends of the range, each the point's fix where not given), each on
    ``base`` (the graph as the job runs it, where given); None where the context has no
    step model."""
    point = ctx.what_if(fix, base=base)
    if point is None:
        return None
    ends = [ctx.what_if(other, base=base) if other is not None else point for other in (low, high)]
    saved = [w.saved_ns for w in (point, *ends)]
    low_ns, high_ns = min(saved), max(saved)
    # The replay's step is the graph's; a share of the step is of the job's own step where
    # the engine knows a better one (steps run without the profiler).
    return saving(ctx, saved[0], basis, low_ns=low_ns, high_ns=high_ns, remains=remains, step_ns=step_ns), point
