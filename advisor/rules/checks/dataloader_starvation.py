"""dataloader-starvation: the step waits on input, and the fix that holds for this loader.

Measure: the loader's share of the step, from the steps that ran unrecorded where there are
any (a profiler slows per-item indexing several times over, and a share measured under it
overstates the loader); what a batch costs and where (the dataloaders table); the cores
the job may use (its CPU affinity and cgroup quota: never other processes' momentary load,
which a batch scheduler's neighbours change from one minute to the next).

Decide which fix holds:

- items that are cheap to fetch (in-memory tensors; ``cheap_item_us`` per item or less):
  the time is Python's per-item overhead and collation, which worker processes would only
  add inter-process traffic to; index whole batches instead;
- per-item work that dominates: worker processes, as many as it takes for loading to hide
  under the rest of the step and as the cores the job may use allow; a loader that mostly
  waits (sleeps, reads files) overlaps without a free core;
- per-item CPU work with no core to spare: make the work cheaper, naming the function that
  takes the time;
- loaders that already have workers and still starve the loop: more workers where cores
  allow, else cheaper per-item work, which also gives the rest of the step back the cores
  the busy workers shared with it;
- where workers pay and the loading is the script's own CPU work, making that work cheaper
  too: both are replayed, and the one that saves clearly more leads (where the items draw
  random numbers while they are made, only their busiest function of their own, a decode
  or a tokenizer, is made once, the random part kept per item);
- on a CPU run, workers that keep up but crowd the cores the model's operators run on:
  however short the wait, cheaper per-item work gives the rest of the step the cores back;
- a trace from another profiler: what cannot be seen there is said.

The saving is the fix replayed on the step graph: the loading's host time gone (or cut to
the batched index), the rest of the host's work a little slower while workers share the
CPU, the floors the workers and the cores set; on the recorded steps run at the job's own
unrecorded pace.

Word: the finding, its evidence and its advice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from advisor.findings import Evidence, Finding, Saving
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share, value
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import StepFigures, best_workers, replayed, rest_slowdown, step_after, worker_floor
from advisor.step.load import weighed_per_step
from advisor.step.whatif import Fix

# -- measure ---------------------------------------------------------------------------------------


@dataclass
class Measure:
    share: float  # the loader's share of the step
    per_step: float  # its time per step, ns
    over: str  # what the share was measured over, in words
    evidence: list[Any]
    step: float  # the step those figures are of, ns
    loader: pd.Series | None  # the dataloaders table's first row; None on a trace
    key: str
    logical_cores: float
    usable_cores: float  # the cores the job may use (NaN: not known)
    starved_note: str = ""
    rest_threads: float = math.nan  # the main process's operator threads (NaN: not known)


def _share(ctx: RuleContext) -> tuple[float, float, str, list[Any]] | None:
    """The loader's share of the step, its time per step, where they come from, and the
    evidence."""
    timing = ctx.table("step_timing")
    ratio = value(timing, "Dataloader", "best_ratio")
    if ratio is not None:
        source = value(timing, "Dataloader", "source", "")
        steps = value(timing, "Dataloader", "unrecorded_steps" if source == "unrecorded steps" else "recorded_steps", 0)
        evidence = [row_evidence("step_timing", timing, "Dataloader", "best_ratio", f"over {steps} {source}"),
                    row_evidence("step_timing", timing, "Dataloader", "best_avg_ns")]
        overhead = value(timing, "Dataloader", "overhead_ratio")
        if overhead is not None and overhead > 0.25:
            evidence.append(row_evidence("step_timing", timing, "Dataloader", "overhead_ratio",
                                         "recording slowed loading this much; the unrecorded steps are used"))
        return float(ratio), float(value(timing, "Dataloader", "best_avg_ns")), f"{steps} {source}", evidence
    model = ctx.table("model")
    ratio = value(model, "Dataloader", "cpu_ratio")
    if ratio is None:
        return None
    evidence = [row_evidence("model", model, "Dataloader", "cpu_ratio"),
                row_evidence("model", model, "Dataloader", "cpu_avg_ns"),
                row_evidence("perf", ctx.table("perf"), "reader_cost", "avg")]
    return float(ratio), float(value(model, "Dataloader", "cpu_avg_ns", 0.0)), \
        f"{ctx.step_count} recorded steps", evidence


def _cores(ctx: RuleContext) -> tuple[float, float]:
    """(logical cores, cores the job may use: its affinity and cgroup quota), NaN where
    not recorded."""
    device = ctx.table("device")
    cores = float(value(device, "cpu", "logical_cores", math.nan) or math.nan)
    usable = float(value(device, "cpu", "usable_cores", math.nan) or math.nan)
    return cores, usable if not math.isnan(usable) else cores


def measure(ctx: RuleContext) -> Measure | None:
    found = _share(ctx)
    if found is None:
        return None
    share, per_step, over, evidence = found
    step = per_step / share if share > 0 else per_step
    # On a busy machine the loading's share is the quiet machine's (advisor.step.load): the
    # load stretched the model's operators many times more than the loader's Python.
    weighed = weighed_per_step(ctx.model, ctx.model.facts.phase_intervals("Dataloader")) if ctx.model else None
    whole = weighed_per_step(ctx.model) if weighed else None
    if weighed and whole:
        share = min(weighed / whole, 1.0)
        per_step, over = share * step, f"{over}, weighed as on a quiet machine"
    loaders = ctx.table("dataloaders")
    loader = loaders.iloc[0] if loaders is not None and len(loaders) else None
    cores, usable = _cores(ctx)
    # The replays need no base of their own at the unrecorded pace: every replay runs the
    # host at the job's own pace already (advisor.step.pace, the Dataloader phase included).
    return Measure(share, per_step, over, evidence, step, loader, str(loaders.index[0]) if loader is not None else "",
                   cores, usable, rest_threads=_rest_threads(loader))


def _rest_threads(loader: pd.Series | None) -> float:
    """The threads the main process runs its operators on (torch.get_num_threads() at the
    loader's first read); NaN where not recorded."""
    return _number(loader.get("torch_threads", math.nan)) if loader is not None else math.nan


# -- decide ----------------------------------------------------------------------------------------


@dataclass
class Verdict:
    advice: str  # trace, batched indexing, num_workers=N, cheaper per-item work, workers cannot keep up
    fix: Fix
    low: Fix | None
    high: Fix | None
    basis: str
    remains: str
    workers: int = 0
    figures: StepFigures | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # The other fix where two hold (workers, and making the per-item work cheaper): word()
    # replays both and leads with the one that saves clearly more.
    alternative: Verdict | None = None


def _number(x: Any) -> float:
    return float(x) if x is not None and pd.notna(x) else math.nan


def _remains(fig: StepFigures, contention: float, gpu: bool, fewer_threads: float = 1.0) -> str:
    """What the step keeps after the workers take the loading, in words (``fewer_threads``:
    how much longer the point counts the rest of the host's work on the threads the workers
    leave it)."""
    slower = (f"{fewer_threads:.2f} times as long on the threads the workers leave it" if fewer_threads > 1.0
              else "a little slower while workers share the CPU")
    parts = [("the GPU's own work and " if gpu else "") + f"the host's other work ({slower})"]
    if math.isfinite(fig.workers):
        parts.append(f"the workers' {ms(fig.moved_ns)} per batch shared among {fig.workers:.0f}")
    if math.isfinite(fig.cores):
        parts.append(f"{fig.cores:.1f} CPU cores for the main process and its workers")
    return f"The step keeps {'; '.join(parts)}."


def _crowding(ctx: RuleContext, m: Measure) -> float:
    """On a CPU run whose loader has workers: how much slower the main process's operators
    ran for sharing the cores with the busy workers (_shared_cores); 1 where not known, on
    a GPU run (the model's operators are the GPU's there), or without workers."""
    loader = m.loader
    if loader is None or ctx.gpu_measured or not int(loader["num_workers"]) or math.isnan(m.usable_cores):
        return 1.0
    return _shared_cores(m.usable_cores, int(loader["num_workers"]), _number(loader["workers_busy"]),
                         m.rest_threads)


@dataclass(frozen=True)
class _Batch:
    """What making one batch of the loader costs and may use, as ``decide`` weighs it."""

    workers: int  # the loader's worker processes now
    item_ns: float  # per item (NaN: not timed)
    items: float  # items per batch
    collate_ns: float  # collation per batch
    demand: float  # the share of making a batch that wants a CPU (ran on one, or waited for one)
    usable: float  # the cores the job may use (inf: not known)
    cap: int  # the most workers worth weighing
    cheap: bool  # an item costs cheap_item_us or less
    room: bool  # a core is free for a worker (or the loading mostly waits)
    own_collate: bool  # a collate function of the script's own is most of a batch's time
    handoff: float  # the main process's time to receive one batch from a worker, ns (0: not timed)
    handoff_worker: float  # the worker's, ns


def decide(ctx: RuleContext, m: Measure) -> Verdict | None:
    # Workers that keep up can still crowd the cores the model's operators run on (a CPU
    # run): the wait for batches is short, but the rest of the step runs that much slower.
    crowded = _crowding(ctx, m) >= ctx.threshold("crowded_cores")
    if not crowded and (m.share < ctx.threshold("dataloader_share")
                        or m.per_step < ctx.threshold("min_saving_ms") * 1e6):
        return None
    if m.loader is None:
        return _trace_verdict(ctx)
    batch = _batch(ctx, m)
    metrics: dict[str, Any] = {"fetch_cpu_demand": batch.demand}
    if (batch.workers == 0 and (m.loader["kind"] == "in-memory tensors" or batch.cheap)
            and not m.loader["batched_fetch"] and not batch.own_collate):
        return _batched_verdict(m, batch, metrics)
    if batch.workers == 0 and batch.room:
        verdict = _workers_verdict(ctx, m, batch, metrics)
        if verdict is not None:
            return verdict
        metrics["workers_do_not_pay"] = True
    if batch.workers == 0:
        return _cheaper_work(m.loader, batch.own_collate, metrics)
    return _more_workers_verdict(ctx, m, batch, metrics, crowded)


def _trace_verdict(ctx: RuleContext) -> Verdict:
    """A trace: how many workers, and how many cores, is not known; the rest of the step is
    taken to run slower beside them (point and worst), or, where the loader ran in a thread
    of the training process and slowed the rest, faster (best)."""
    gone = {"loading": 0.0}
    return Verdict("trace", Fix("workers", gone, rest_factor=ctx.threshold("contention_trace")),
                   Fix("workers, at worst", gone, rest_factor=ctx.threshold("contention_worst_trace")),
                   Fix("workers, at best", gone, rest_factor=ctx.threshold("rest_speedup_trace")),
                   "the step replayed with the loading overlapped by worker processes: what the GPU and the "
                   "host's other work leave, the rest slower while workers share the CPU",
                   "The step keeps the GPU's own work and the host's other work, slower while workers share the "
                   "CPU.")


def _batch(ctx: RuleContext, m: Measure) -> _Batch:
    loader = m.loader
    item_ns, items = _number(loader["item_avg_ns"]), _number(loader["items_per_batch"])
    collate_ns = _number(loader["collate_avg_ns"])
    cpu_share = _number(loader.get("fetch_cpu_share", math.nan))
    # Time the fetch waited for a core (other processes held them) is CPU work it wanted:
    # on a busy machine that, not waiting on data, is why so little of it ran.
    runnable = _number(loader.get("fetch_runnable_share", math.nan))
    demand = 1.0 if math.isnan(cpu_share) else min(max(cpu_share, 0.0) + (0.0 if math.isnan(runnable)
                                                                             else max(runnable, 0.0)), 1.0)
    usable = m.usable_cores if not math.isnan(m.usable_cores) else math.inf
    # Workers that mostly wait can outnumber the cores; CPU-bound ones cannot usefully.
    rest = max(m.step - m.per_step, 0.0)
    cap = (max(1, math.ceil(usable / max(demand, 0.25) - 0.05)) if math.isfinite(usable)
           else max(1, math.ceil(m.per_step / max(rest, 1.0))))
    # A batched index replaces per-item fetching and torch's own collation (stacking the
    # items); a collate function of the script's own that is most of a batch's time stays:
    # its work is what must get cheaper, or move to workers.
    collate_fn = str(loader.get("collate_fn") or "")
    own_collate = (collate_fn not in ("", "default_collate", "default_convert") and not math.isnan(collate_ns)
                   and (math.isnan(item_ns) or math.isnan(items) or collate_ns > item_ns * items))
    # Handing a batch over from a worker, timed on this machine after the run (NaN: not
    # timed, taken as free): the main process still receives each batch.
    handoff, handoff_worker = _number(loader.get("handoff_main_ns")), _number(loader.get("handoff_wall_ns"))
    return _Batch(
        workers=int(loader["num_workers"]), item_ns=item_ns, items=items, collate_ns=collate_ns, demand=demand,
        usable=usable, cap=min(cap, 32),
        cheap=not math.isnan(item_ns) and item_ns <= ctx.threshold("cheap_item_us") * 1e3,
        # A core for a worker: the main process idles while it waits for a batch, so one core
        # beside it is room; a loader that mostly waits needs none.
        room=not math.isfinite(usable) or usable >= 1 + ctx.threshold("free_core") or demand < 0.5,
        own_collate=own_collate, handoff=0.0 if math.isnan(handoff) else handoff,
        handoff_worker=0.0 if math.isnan(handoff_worker) else handoff_worker)


def _batched_verdict(m: Measure, batch: _Batch, metrics: dict[str, Any]) -> Verdict:
    """Cheap items made one at a time: a batched index replaces the per-item fetching and
    the collation."""
    read_ns = m.loader["read_avg_ns"]
    replaced = ((batch.item_ns * batch.items + batch.collate_ns) * (m.per_step / float(read_ns))
                if not math.isnan(batch.items) and read_ns > 0 else m.per_step)
    kept = max(1.0 - min(replaced, m.per_step) / m.per_step, 0.0) if m.per_step else 1.0
    return Verdict("batched indexing", Fix("batched indexing", {"loading": kept}),
                   Fix("batched indexing, at worst", {"loading": 1 - (1 - kept) * 0.5}),
                   Fix("batched indexing, at best", {"loading": 0.0}),
                   "the step replayed without the per-item fetching and collation a batched index replaces",
                   "The step keeps the batched index itself (one indexing of each tensor per batch) and the rest "
                   "of the step.", metrics=metrics)


def _workers_verdict(ctx: RuleContext, m: Measure, batch: _Batch, metrics: dict[str, Any]) -> Verdict | None:
    """Worker processes for a loader that has none, where a core is free: None where they
    would not make the step shorter (``metrics`` then holds the reasons weighed)."""
    contention, worst = ctx.threshold("contention"), ctx.threshold("contention_worst")
    figures = StepFigures(step_ns=m.step, moved_ns=m.per_step, cores=batch.usable, moved_cpu_share=batch.demand,
                          handoff_ns=batch.handoff, handoff_worker_ns=batch.handoff_worker)
    n = best_workers(figures, contention, batch.cap)
    fig_n = StepFigures(**{**figures.__dict__, "workers": n})
    # Workers pay where the step they leave, the hand-over counted and the CPU shared at
    # its worst, is shorter than the step now: where a batch is cheap to make, handing it
    # over can cost more, and workers that slow the job are worse advice than none.
    pays = step_after(fig_n, worst)[0] < m.step * (1 - ctx.threshold("min_worker_gain"))
    if batch.handoff:
        metrics.update({"handoff_ns": batch.handoff, "handoff_worker_ns": batch.handoff_worker})
    # At worst, the rest of the step's operators (on torch's threads, on a CPU) lose the
    # cores the workers take, having scaled perfectly with them; at best they had not
    # scaled at all. The point takes the geometric middle of the two: on 2 cores, 2
    # threads cut to 1 ran the rest of the step of two scripts that augment images at
    # random 1.37 and 1.55 times as long, where perfect scaling says 2 and none 1
    # (benchmarks/RESULTS.md).
    fig_worst = StepFigures(**{**fig_n.__dict__, "rest_threads": m.rest_threads})
    slower = rest_slowdown(fig_worst)
    if slower > 1.0:
        metrics.update({"rest_threads": m.rest_threads, "rest_slowdown": slower,
                        "rest_slowdown_point": math.sqrt(slower)})
    if not pays:
        return None
    # The main process's loading shrinks to receiving the batch. Where the loading is CPU
    # work of the script's own, making that work cheaper is the other fix: on few cores,
    # where the workers and the model's operators share them, it can save more (word()
    # weighs the two).
    received = {"loading": min(batch.handoff / m.per_step, 1.0) if m.per_step > 0 else 0.0}
    other = None
    if batch.demand >= 0.5 and not math.isnan(batch.item_ns) and not math.isnan(batch.items):
        # Items drawn at random: only a function of their own (a decode, a tokenizer) can
        # be made once; the random part stays per item.
        other = (_made_once_beside_random(m.loader) if _random_items(m.loader)
                 else _cheaper_work(m.loader, batch.own_collate, {}))
    return Verdict(f"num_workers={n}",
                   Fix(f"{n} workers", received, rest_factor=contention * math.sqrt(slower),
                       floor_ns=worker_floor(fig_n, contention)),
                   Fix(f"{n} workers, at worst", received, rest_factor=worst * slower,
                       floor_ns=worker_floor(fig_worst, worst)),
                   Fix(f"{n} workers, at best", received, floor_ns=worker_floor(fig_n, 1.0)),
                   f"the step replayed with {n} worker{'s' if n != 1 else ''} making the batches: what the "
                   "rest of the step, the GPU, the workers, the hand-over of each batch and the cores leave",
                   _remains(fig_n, contention, ctx.gpu_measured, math.sqrt(slower)), workers=n,
                   figures=fig_n, metrics=metrics, alternative=other)


def _more_workers_verdict(ctx: RuleContext, m: Measure, batch: _Batch, metrics: dict[str, Any],
                          crowded: bool) -> Verdict:
    """A loader with workers that still starve the loop (more of them where cores allow),
    or that keep up but crowd the cores: cheaper loading gives the rest of the step the
    cores back."""
    contention, worst = ctx.threshold("contention"), ctx.threshold("contention_worst")
    workers, gone = batch.workers, {"loading": 0.0}
    busy = _number(m.loader["workers_busy"])
    # Loader-bound, the workers make one batch per step between them: each takes
    # workers x step to make one.
    batch_ns = workers * m.step * (busy if not math.isnan(busy) else 1.0)
    more = StepFigures(step_ns=m.step, moved_ns=batch_ns, rest_ns=max(m.step - m.per_step, 0.0), cores=batch.usable)
    n = best_workers(more, contention, max(batch.cap, workers))
    metrics["workers_busy"] = busy
    if crowded and m.share < ctx.threshold("dataloader_share"):
        metrics["workers_keep_up"] = True
    if n > workers and not crowded:
        fig_n = StepFigures(**{**more.__dict__, "workers": n})
        return Verdict("workers cannot keep up",
                       Fix(f"{n} workers", gone, rest_factor=contention, floor_ns=worker_floor(fig_n, contention)),
                       Fix(f"{n} workers, at worst", gone, rest_factor=worst, floor_ns=worker_floor(fig_n, worst)),
                       Fix(f"{n} workers, at best", gone, floor_ns=worker_floor(fig_n, 1.0)),
                       f"the step replayed with {n} workers instead of {workers}",
                       _remains(fig_n, contention, ctx.gpu_measured), workers=n, figures=fig_n, metrics=metrics)
    # No core is left for more: the workers' CPU work shares the cores with the main
    # process's, which ran that much slower, and beside them slower still (contention, as
    # the rest of a step beside workers runs everywhere in this rule). Once a batch is cheap
    # to make, the workers mostly wait and the rest of the step gets the cores back; at
    # worst half the wait goes and the rest keeps its pace.
    shared = _shared_cores(batch.usable, workers, busy, m.rest_threads)
    back = (1.0 / (shared * contention), 1.0 / (shared * worst)) if shared > 1.0 else (1.0, 1.0)
    if shared > 1.0:
        metrics["main_slowed_by_workers"] = shared
    return Verdict("workers cannot keep up", Fix("cheaper loading", gone, rest_factor=back[0]),
                   Fix("cheaper loading, at worst", {"loading": 0.5}),
                   Fix("cheaper loading, at best", gone, rest_factor=back[1]),
                   "the step replayed without the wait for batches, removed when a batch is cheaper to make"
                   + (f", the rest of the step {shared:.2f} times faster with the cores the workers leave"
                      if shared > 1.0 else ""),
                   "The step keeps the rest of its work" + (", on the cores the workers no longer take." if shared > 1.0
                                                            else "."), workers=workers, metrics=metrics)


def _shared_cores(cores: float, workers: int, busy: float, threads: float) -> float:
    """How much slower the main process's work ran while ``workers`` busy for ``busy`` of
    their time shared ``cores`` with its operator threads (each runnable thread a fair
    share of them): (workers x busy + threads) / cores, at least 1; 1 where the cores or
    the workers' business are not known."""
    if not math.isfinite(cores) or cores <= 0 or math.isnan(busy):
        return 1.0
    own = 1.0 if math.isnan(threads) else min(max(threads, 1.0), cores)
    return max((workers * busy + own) / cores, 1.0)


def _items(items: float, loader: pd.Series) -> str:
    """A batch's items in words: the loader's batch size where the mean falls short of it
    only by an epoch's shorter last batches (a batch_size of 64 said as 64, not 63)."""
    size = _number(loader.get("batch_size", math.nan))
    if not math.isnan(size) and size >= 1 and size * 0.8 <= items < size - 0.05:
        return f"{size:.0f} items ({items:.1f} on average, with each epoch's shorter last batch)"
    return f"{items:.0f} items"


def _random_items(loader: pd.Series) -> bool:
    """Whether most batches drew random numbers while they were made (augmentation): such
    items differ every epoch, so making them once is no fix."""
    return _number(loader.get("random_share", math.nan)) >= 0.5


def _made_once_beside_random(loader: pd.Series) -> Verdict | None:
    """Items drawn at random (augmentation) whose busiest function is one of its own, not
    ``__getitem__`` where the draws are made: that function's results made once before
    training (a decode, a tokenizer), the random part kept per item. Its share of loading
    goes (at worst half of it); None where the busiest function is ``__getitem__`` itself,
    the loader's collate function (it combines the items drawn, so its results change
    with them), or is not known (nothing separable to make once)."""
    function = str(loader.get("top_function") or "").partition(" (")[0]
    share = _number(loader.get("top_function_share", math.nan))
    collate_fn = str(loader.get("collate_fn") or "")
    if (not function or function in ("__getitem__", "__getitems__", "__iter__", "__next__", collate_fn)
            or not share > 0):
        return None
    share = min(share, 1.0)
    item_ns = _number(loader["item_avg_ns"]) * _number(loader["items_per_batch"])
    read_ns = _number(loader["read_avg_ns"])
    metrics = {"made_once_function": function}
    if read_ns > 0:
        metrics["own_work_ns"] = share * read_ns  # per batch: what making its results once moves before training
    elif not math.isnan(item_ns):
        metrics["own_work_ns"] = share * item_ns
    return Verdict("cheaper per-item work", Fix(f"{function} made once", {"loading": 1.0 - share}),
                   Fix(f"{function} made once, at worst", {"loading": 1.0 - share / 2}),
                   None,  # at best the point: the random part stays
                   f"the step replayed without {function}'s share of loading, its results made once before training",
                   "The step keeps the random augmentation of each item, the collation, the loader's own "
                   "machinery and the rest of the step.", metrics=metrics)


def _cheaper_work(loader: pd.Series, own_collate: bool, metrics: dict[str, Any]) -> Verdict:
    """Making the per-item work cheaper (precomputing, caching, vectorising it) removes the
    script's own work: the per-item work (__getitem__'s share of a read) and a collate
    function of its own; torch's collation and the loader's machinery stay (at worst half
    of that work goes, at best all of the loading)."""
    read_ns = _number(loader["read_avg_ns"])
    item_ns, items, collate_ns = (_number(loader["item_avg_ns"]), _number(loader["items_per_batch"]),
                                  _number(loader["collate_avg_ns"]))
    own_ns = item_ns * items + (collate_ns if own_collate else 0.0)
    own = min(own_ns / read_ns, 1.0) if read_ns > 0 and not math.isnan(own_ns) else 1.0
    if not math.isnan(own_ns):
        metrics = {**metrics, "own_work_ns": own_ns}  # per batch: what making the items once moves before training
    return Verdict("cheaper per-item work", Fix("cheaper per-item work", {"loading": 1.0 - own}),
                   Fix("cheaper per-item work, at worst", {"loading": 1.0 - own / 2}),
                   Fix("no loading left", {"loading": 0.0}),
                   "the step replayed without the script's own loading work (__getitem__"
                   + (", its collate function" if own_collate else "") + ") that precomputing or caching removes",
                   "The step keeps " + ("the loader's own machinery" if own_collate else
                                        "the collation and the loader's own machinery")
                   + ", what remains of the work made cheaper, and the rest of the step.", metrics=metrics)


# -- word ------------------------------------------------------------------------------------------


def _hotspot(loader: pd.Series | None) -> str:
    if loader is None or not loader.get("top_function"):
        return ""
    lines = str(loader.get("top_lines") or "")
    where = str(loader["top_function"])
    if lines:
        where = where[:-1] + f", line{'s' if ',' in lines else ''} {lines})" if where.endswith(")") else \
            f"{where} (lines {lines})"
    text = f"{pct(float(loader['top_function_share']))} of loading is in {where}"
    caller = str(loader.get("top_caller") or "")
    if caller:
        text += (f", called from {caller}, which with what it calls takes "
                 f"{pct(float(loader['top_caller_share']))}")
    return text


def _spare(m: Measure) -> str:
    if math.isnan(m.usable_cores):
        return "how many CPU cores the job may use was not recorded"
    limited = (f" (its CPU affinity or quota allows {m.usable_cores:.1f} of the machine's {m.logical_cores:.0f})"
               if not math.isnan(m.logical_cores) and m.usable_cores < m.logical_cores - 0.05 else "")
    return (f"the job may use {m.usable_cores:.1f} cores{limited}; the main process idles while it waits for a batch, "
            "so a worker can run there")


def _threads_advice(v: Verdict, m: Measure, metrics: dict[str, Any], contention: float) -> str:
    """Where the workers' CPU work fills the cores the job may use (the step after the fix
    sits on the CPU floor), or takes cores the main process's operator threads use now, the
    main process's own operators must not compete with them: torch's default of a thread
    per core, its idle threads spinning between operators, takes back much of what the
    workers save."""
    if v.figures is None or math.isnan(m.usable_cores):
        return ""
    slower = rest_slowdown(StepFigures(**{**v.figures.__dict__, "rest_threads": m.rest_threads}))
    crowded = slower > 1.0
    if step_after(v.figures, contention)[1] != "cpu" and not crowded:
        return ""
    threads = max(1, math.floor(m.usable_cores + 0.05) - v.workers)
    metrics["fix_torch_threads"] = threads  # the threads advised (the table's torch_threads: as run)
    if m.rest_threads <= threads:
        # The script already keeps its operators to what the workers leave.
        return (f" The script already keeps the main process's operators to {m.rest_threads:.0f} thread"
                f"{'s' if m.rest_threads != 1 else ''} (torch.set_num_threads): keep it so beside the workers.")
    if crowded:
        return (f" The model's operators run on {m.rest_threads:.0f} threads now (torch's default, a thread per "
                f"core): give them what the workers leave, torch.set_num_threads({threads}), or they compete with "
                "the workers for the cores. On fewer threads the rest of the step runs slower: the saving counts it "
                f"{math.sqrt(slower):.2f} times as long (as long as it is at best, {slower:.2f} times at worst, the "
                "low end).")
    return (f" With the workers on every core, give the main process's operators what they leave: "
            f"torch.set_num_threads({threads}) (its default, a thread per core, would compete with the workers "
            "for them).")


def _weigh(ctx: RuleContext, v: Verdict) -> tuple[Verdict, Saving, tuple[Verdict, Saving] | None] | None:
    """The fix to lead with, its saving, and the other fix with its own where two hold:
    each replayed; the other leads where it saves clearly more (``cheaper_work_lead``
    times the first's point), so that a near tie, which the run's noise decides, does not
    turn the advice over."""
    found = replayed(ctx, v.fix, v.basis, low=v.low, high=v.high, remains=v.remains)
    if found is None:
        return None
    estimate = found[0]
    alternative = v.alternative
    if alternative is None:
        return v, estimate, None
    other = replayed(ctx, alternative.fix, alternative.basis, low=alternative.low, high=alternative.high,
                     remains=alternative.remains)
    if other is None:
        return v, estimate, None
    if other[0].ms_per_step > estimate.ms_per_step * ctx.threshold("cheaper_work_lead"):
        # The workers' figures (the hand-over, the operator threads) stay among the metrics.
        led = Verdict(**{**alternative.__dict__, "metrics": {**v.metrics, **alternative.metrics}, "alternative": None})
        return led, other[0], (v, estimate)
    return v, estimate, (alternative, other[0])


def _instead(cheaper: Verdict) -> str:
    """The cheaper-work fix beside the workers, in words."""
    function = cheaper.metrics.get("made_once_function")
    if function:
        return f"with {function}'s results made once before training (the random part kept per item)"
    return "made cheaper instead of moved to workers (precomputed once before training)"


def _figure(saving: Saving) -> str:
    """A fix's saving in words: "12.1 ms a step (30.4%; 0 to 13.1 ms)"."""
    span = ""
    if saving.low_ms_per_step is not None and saving.high_ms_per_step is not None:
        low = ms(saving.low_ms_per_step * 1e6) if saving.low_ms_per_step > 0 else "0"
        span = f"; {low} to {ms(saving.high_ms_per_step * 1e6)}"
    return f"{ms(saving.ms_per_step * 1e6)} a step ({pct(saving.share_of_step)}{span})"


def _one_pass(loader: pd.Series, own_work_ns: float, m: Measure, what: str = "every item") -> str:
    """What making every item once costs, where the dataset's length is known: a pass over
    it before training (the script's own work per batch, per item, times the items),
    which pays back where training reads an item more than once. The loader's own timings
    are of every read, the recorded steps' too, which the profiler slowed: the work is
    taken at the job's own pace, the loading per step of the steps run without it."""
    length, items = _number(loader.get("length", math.nan)), _number(loader["items_per_batch"])
    if math.isnan(length) or math.isnan(own_work_ns) or length <= 0 or not items > 0:
        return ""
    read_ns = _number(loader["read_avg_ns"])
    if read_ns > 0 and m.per_step > 0:
        own_work_ns *= min(m.per_step / read_ns, 1.0)
    per_item = own_work_ns / items
    return (f" Making {what} once costs a pass over the dataset before training ({length:.0f} items at "
            f"{ms(per_item)}: {ms(length * per_item)}); it pays back from the second epoch, or at once where the "
            "results are kept on disk between runs.")


@dataclass
class _Said:
    """What the finding says, built up by the parts of ``word``: its message, evidence and
    metrics."""

    message: str
    evidence: list[Any]
    metrics: dict[str, Any]


_NO_LOADER_ADVICE = (
    "Load batches in worker processes so they overlap compute, DataLoader(num_workers=N, pin_memory=True, "
    "persistent_workers=True), where the per-item work (reading, decoding, tokenizing, augmenting in __getitem__) "
    "dominates and CPU cores are free; where the data are in-memory tensors, index whole batches at once instead "
    "(workers would only add inter-process traffic). A trace does not show which, nor how many cores the job may "
    "use: `advisor diagnose train.py` does.")

_BATCHED_ADVICE = (
    "Index the data a whole batch at a time instead of item by item: give the Dataset a __getitems__(indices) that "
    "returns the batch (X[indices], y[indices]) and pass collate_fn=lambda batch: batch, or iterate a BatchSampler "
    "yourself: for idx in BatchSampler(RandomSampler(data), batch_size, drop_last=False): xb, yb = X[idx], y[idx]. "
    "Worker processes would not help: each item is cheap, and passing every batch between processes would cost "
    "more than making it.")


def word(ctx: RuleContext, m: Measure, v: Verdict) -> Finding | None:
    weighed = _weigh(ctx, v)
    if weighed is None:
        return None
    v, estimate, other = weighed
    said = _Said(_headline(ctx, m), list(m.evidence),
                 {"share": m.share, "ns_per_step": m.per_step, "job_cores": m.usable_cores,
                  "logical_cores": m.logical_cores, "advice": v.advice, **v.metrics})
    balance = ctx.table("step_gpu")
    if ctx.gpu_measured and balance is not None and len(balance):
        row = "mean" if "mean" in balance.index else "window"
        said.evidence.append(row_evidence("step_gpu", balance, row, "gpu_busy_ns",
                                          "the GPU's own work per step: the step cannot get shorter"))
    if m.loader is None:
        advice = _NO_LOADER_ADVICE
    else:
        hotspot = _hotspot(m.loader)
        _say_the_loader(ctx, m, said, hotspot)
        advice = _advice(ctx, m, v, other, said, hotspot)
    _fix_settings(m, v, said.metrics)
    return Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        # By what the fix saves, not by the loader's share of the step: a loader that takes
        # a quarter of the step but whose fix keeps most of it is no high finding.
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.9,
        saving=estimate,
        message=said.message,
        recommendation=advice,
        evidence=[e for e in said.evidence if e is not None],
        metrics=said.metrics,
    ).with_fix(v.fix)


def _headline(ctx: RuleContext, m: Measure) -> str:
    return (f"The data loader takes {pct(m.share)} of each step ({ms(m.per_step)} per step, over {m.over}); "
            "nothing else runs in the loop meanwhile"
            # A CPU run has no GPU to idle: said only where one was measured.
            + (", and the GPU sits idle for that time unless work is still queued on it." if ctx.gpu_measured
               else "."))


def _say_the_loader(ctx: RuleContext, m: Measure, said: _Said, hotspot: str) -> None:
    """The loader's own figures: how its batches are made, how much of that is CPU work,
    and its busiest function and line."""
    loader, key = m.loader, m.key
    loaders = ctx.table("dataloaders")
    said.evidence.append(row_evidence("dataloaders", loaders, key, "num_workers"))
    workers = int(loader["num_workers"])
    item_ns, items = _number(loader["item_avg_ns"]), _number(loader["items_per_batch"])
    collate_ns = _number(loader["collate_avg_ns"])
    cpu_share = _number(loader.get("fetch_cpu_share", math.nan))
    said.metrics.update({"dataset": loader["dataset"], "num_workers": workers, "item_ns": item_ns,
                         "collate_ns": collate_ns})
    if workers == 0 and not math.isnan(item_ns):
        source = {"in-memory tensors": f"in-memory tensors ({key})", "iterable": f"an iterable dataset ({key})"}
        said.message += (f" Its batches come from {source.get(loader['kind'], f'a map-style dataset ({key})')}, "
                         f"made in the main process one item at a time: {ms(item_ns)} per item, "
                         f"{_items(items, loader)} and {ms(collate_ns)} of collation per batch.")
        said.evidence += [row_evidence("dataloaders", loaders, key, "item_avg_ns"),
                          row_evidence("dataloaders", loaders, key, "collate_avg_ns")]
        if not math.isnan(cpu_share) and cpu_share < 0.5:
            waiting = _number(loader.get("fetch_runnable_share", math.nan))
            if not math.isnan(waiting) and waiting > 0.1:
                said.message += (f" {pct(cpu_share)} of making a batch ran on a CPU and {pct(waiting)} waited for one "
                                 "(other processes held the cores): CPU work, slowed by the machine being busy.")
            else:
                said.message += (f" Only {pct(cpu_share)} of making a batch is CPU work: the rest waits (on files, "
                                 "the network, sleeps), which workers overlap without a core each.")
            said.evidence.append(row_evidence("dataloaders", loaders, key, "fetch_cpu_share"))
    if hotspot:
        said.message += f" {hotspot[0].upper()}{hotspot[1:]}." if not hotspot[0].isdigit() else f" {hotspot}."
        said.evidence.append(row_evidence("dataloaders", loaders, key, "top_function"))
        function, _, file = str(loader["top_function"]).rstrip(")").partition(" (")
        busiest = str(loader.get("top_lines") or "").split(",")[0].strip()
        if file and busiest.isdigit():
            said.evidence.append(Evidence(kind="source_line", file=file, line=int(busiest), function=function,
                                          name=function, note="the busiest line of loading's busiest function"))


def _advice(ctx: RuleContext, m: Measure, v: Verdict, other: tuple[Verdict, Saving] | None, said: _Said,
            hotspot: str) -> str:
    """The fix the verdict chose, in words."""
    if v.advice == "batched indexing":
        return _BATCHED_ADVICE
    if v.advice.startswith("num_workers="):
        return _workers_advice(ctx, m, v, other, said, hotspot)
    if v.advice == "cheaper per-item work":
        return _cheaper_advice(ctx, m, v, other, said, hotspot)
    return _more_workers_advice(ctx, m, v, said, hotspot)


def _workers_advice(ctx: RuleContext, m: Measure, v: Verdict, other: tuple[Verdict, Saving] | None, said: _Said,
                    hotspot: str) -> str:
    """Worker processes, where the main process makes its batches and they would pay."""
    advice = (f"Make batches in worker processes so loading overlaps the model: DataLoader(num_workers={v.workers}, "
              "persistent_workers=True, prefetch_factor=2, pin_memory=True on a GPU); "
              f"{_spare(m)}.{_threads_advice(v, m, said.metrics, ctx.threshold('contention'))} Then cut the per-item "
              "work" + (f": {hotspot}" if hotspot else " in __getitem__ (decode once, cache, vectorise)")
              + (f"; {_instead(other[0])}, it would save {_figure(other[1])}." if other is not None else "."))
    if other is not None:
        said.metrics.update({"other_advice": other[0].advice, "other_ms_per_step": other[1].ms_per_step})
    if v.metrics.get("rest_slowdown", 1.0) > 1.0:
        said.evidence.append(row_evidence("dataloaders", ctx.table("dataloaders"), m.key, "torch_threads",
                                          "the main process's operator threads"))
    return advice


def _cheaper_advice(ctx: RuleContext, m: Measure, v: Verdict, other: tuple[Verdict, Saving] | None, said: _Said,
                    hotspot: str) -> str:
    """Cheaper per-item work: why not workers (or why they save less), and how to make it
    cheaper for this loader (once before training, or per batch where it is random)."""
    why = _why_not_workers(ctx, m, v, other, said)
    loader, loaders = m.loader, ctx.table("dataloaders")
    made_once = v.metrics.get("made_once_function")
    if _random_items(loader) and made_once:
        # The items are augmented at random, but their busiest function is one of its own:
        # its results can be made once, the random part kept per item.
        cheaper = (f": {hotspot}. The items draw random numbers (augmentation that must differ every "
                   f"epoch): make {made_once}'s results once before training, or cache them, where they do "
                   "not depend on those draws, and keep the random part per item.")
        once = _one_pass(loader, _number(v.metrics.get("own_work_ns")), m, f"{made_once}'s results for every item")
        said.evidence.append(row_evidence("dataloaders", loaders, m.key, "random_share",
                                          "the batches drew random numbers while they were made"))
    elif _random_items(loader):
        # Random augmentation differs every epoch: it cannot be made once.
        cheaper = ((f": {hotspot}" if hotspot else " in __getitem__")
                   + " (it draws random numbers for every item, so it cannot be made once before training: "
                     "do it for the whole batch with tensor ops, or with fewer Python operations per item).")
        once = ""
        said.evidence.append(row_evidence("dataloaders", loaders, m.key, "random_share",
                                          "the batches drew random numbers while they were made"))
    else:
        cheaper = (f": {hotspot} (precompute its results once before training, cache them, or vectorise "
                   "it)." if hotspot else " (precompute once before training, cache, vectorise).")
        once = _one_pass(loader, _number(v.metrics.get("own_work_ns")), m)
    return (f"Make the per-item work cheaper{cheaper}{once} {why}" if other is not None
            else f"{why} Make the per-item work cheaper instead{cheaper}{once}")


def _why_not_workers(ctx: RuleContext, m: Measure, v: Verdict, other: tuple[Verdict, Saving] | None,
                     said: _Said) -> str:
    """Why cheaper per-item work leads: workers would save less, would not make the step
    shorter (the reasons the replay weighed), or would compete for the CPU."""
    if other is not None:
        # Workers pay, but less: on few cores they share them with the model's operators.
        workers_v, workers_saving = other
        asked: dict[str, Any] = {}
        _threads_advice(workers_v, m, asked, ctx.threshold("contention"))
        threads = asked.get("fix_torch_threads")
        set_threads = (f" and torch.set_num_threads({threads}) in the main process"
                       if threads and not m.rest_threads <= threads else "")
        made_once = v.metrics.get("made_once_function")
        said.metrics.update({"other_advice": workers_v.advice, "other_ms_per_step": workers_saving.ms_per_step})
        return (f"Worker processes would save less here, {_figure(workers_saving)}, with "
                f"DataLoader(num_workers={workers_v.workers}, persistent_workers=True){set_threads}: the job "
                f"may use {m.usable_cores:.1f} cores, and the workers' CPU work and the model's operators "
                "share them. Use the workers where "
                + (f"{made_once}'s results depend on the random draws." if made_once else
                   "the items cannot be made once (random augmentation each epoch)."))
    if not v.metrics.get("workers_do_not_pay"):
        return f"Worker processes would compete with training for CPU: the job may use {m.usable_cores:.1f} cores."
    handoff = v.metrics.get("handoff_ns", 0.0)
    slower = v.metrics.get("rest_slowdown", 1.0)
    # The reasons the replay weighed: the cores the workers take from the model's
    # operators, where they would be slower, and the hand-over of each batch.
    reasons = []
    if slower > 1.0:
        reasons.append(f"the job may use {m.usable_cores:.1f} cores, and a worker's CPU work would take "
                       f"them from the model's operators (torch runs them on {m.rest_threads:.0f} "
                       f"threads): the rest of the step up to {slower:.2f}x as long")
    if handoff:
        reasons.append(f"handing a batch over from a worker costs the main process {ms(handoff)} and the "
                       f"worker {ms(v.metrics.get('handoff_worker_ns', 0.0))} (timed after the run), "
                       f"against {ms(m.per_step)} to make it in the main process")
        said.evidence.append(row_evidence("dataloaders", ctx.table("dataloaders"), m.key, "handoff_main_ns",
                                          "the main process's time to receive one batch from a worker"))
    return ("Worker processes would not make the step shorter here: "
            + ("; ".join(reasons) if reasons else f"the job may use {m.usable_cores:.1f} cores") + ".")


def _more_workers_advice(ctx: RuleContext, m: Measure, v: Verdict, said: _Said, hotspot: str) -> str:
    """A loader with workers that cannot keep up (more of them where cores allow, else
    cheaper items), or that keeps up but crowds the cores the model's operators run on."""
    loader, workers = m.loader, int(m.loader["num_workers"])
    busy = v.metrics.get("workers_busy", math.nan)
    what = (f"raise num_workers from {workers} to {v.workers} ({_spare(m)})" if v.workers > workers
            else "make the per-item work cheaper (no CPU core is left for more workers)")
    threads = _threads_advice(v, m, said.metrics, ctx.threshold("contention")) if v.workers > workers else ""
    if v.metrics.get("workers_keep_up"):
        shared = float(v.metrics.get("main_slowed_by_workers", 1.0))
        said.message += (f" Its {workers} worker process{'es' if workers != 1 else ''} keep up, busy {pct(busy)} "
                         f"of their time, but they share the job's {m.usable_cores:.1f} cores with the model's "
                         f"{m.rest_threads if not math.isnan(m.rest_threads) else 1:.0f} operator thread(s): the "
                         f"rest of the step runs about {shared:.2f} times as long as on cores of its own.")
        said.evidence.append(row_evidence("dataloaders", ctx.table("dataloaders"), m.key, "workers_busy",
                                          "the workers' share of their time spent working"))
        what = ("make the per-item work cheaper (where the items are the same every epoch, make them once "
                "before training), so that the workers leave the cores to the model")
    if v.workers > workers:
        said.metrics["advice"] = f"num_workers={v.workers}"
    return (f"The {workers} worker process{'es' if workers != 1 else ''} "
            + ("crowd the cores" if v.metrics.get("workers_keep_up") else "cannot keep up")
            + (f" (busy {pct(busy)} of their time)" if not math.isnan(busy) else "")
            + f": {what}" + (f"; {hotspot}." if hotspot else ".") + threads
            + (" Keep persistent_workers=True so workers are not restarted each epoch."
               if bool(loader.get("persistent_workers", False))
               else " Set persistent_workers=True too, so workers are not restarted each epoch."))


def _fix_settings(m: Measure, v: Verdict, metrics: dict[str, Any]) -> None:
    """The settings of the fix, for `advisor verify` to apply (rules/builtin/dataloader-starvation.yaml: verify)."""
    if m.loader is not None and v.advice == "batched indexing":
        metrics["fix_batched_index"] = True
    elif m.loader is not None and (v.advice.startswith("num_workers=") or
                                   str(metrics.get("advice", "")).startswith("num_workers=")):
        metrics["fix_num_workers"] = v.workers


@register("dataloader-starvation")
def check(ctx: RuleContext) -> list[Finding]:
    m = measure(ctx)
    if m is None:
        return []
    v = decide(ctx, m)
    if v is None:
        return []
    finding = word(ctx, m, v)
    return [finding] if finding is not None else []
