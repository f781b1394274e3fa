"""dataloader-starvation: the step waits on input, and the fix that holds for this loader.

The share comes from the steps that ran unrecorded where there are any (a profiler slows
per-item indexing several times over, and a share measured under it overstates the
loader). The advice depends on what a batch costs and where:

- items that are cheap to fetch (in-memory tensors; ``cheap_item_us`` per item or less):
  the time is Python's per-item overhead and collation, which worker processes would only
  add inter-process traffic to; index whole batches instead;
- per-item work that dominates, with CPU cores free: worker processes, as many as it takes
  for loading to hide under compute and the free cores allow;
- per-item work with no core free: workers would compete with training; make the work
  cheaper, naming the function that takes the time;
- loaders that already have workers and still starve the loop: more workers where cores
  are free, else cheaper per-item work;
- a trace from another profiler: what cannot be seen there is said.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import (
    ms,
    pct,
    row_evidence,
    saving,
    severity_by_share,
    value,
)
from advisor.rules.checks.overlap import OverlapSaving, StepFigures, best_workers, overlap_saving
from advisor.rules.registry import RuleContext, register


def _cores_for_job(ctx: RuleContext) -> tuple[float, float]:
    """(logical cores, cores the job may use: all of them less what other processes used
    meanwhile), NaN where not sampled. The job's own use counts as usable: its main process
    idles while it waits for a batch, and its workers would run there."""
    device = ctx.table("device")
    cores = float(value(device, "cpu", "logical_cores", math.nan))
    system = float(value(device, "cpu", "system_cpu_utilization", math.nan))
    process = float(value(device, "cpu", "process_cpu_cores", math.nan))
    if math.isnan(system) or math.isnan(process) or math.isnan(cores):
        return cores, math.nan
    return cores, min(max(cores - max(system * cores - process, 0.0), 0.0), cores)


def _gpu_balance(ctx: RuleContext) -> tuple[float, float, bool]:
    """The GPU's busy time and tail per step and whether the host waits on it each step
    (step_gpu's mean row; zeros without a GPU)."""
    balance = ctx.table("step_gpu")
    row = "mean" if balance is not None and "mean" in balance.index else "window"
    busy = float(value(balance, row, "gpu_busy_ns", 0.0) or 0.0)
    tail = float(value(balance, row, "tail_ns", 0.0) or 0.0)
    waits = float(value(balance, row, "blocking_calls", 0.0) or 0.0) >= 1.0
    return busy, tail, waits


def _share(ctx: RuleContext) -> tuple[float, float, str, list[Any]] | None:
    """The loader's share of the step, its time per step, where they come from, and the
    evidence: the unrecorded steps' timing where there is some, else the Model Summary."""
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


@register("dataloader-starvation")
def check(ctx: RuleContext) -> list[Finding]:
    found = _share(ctx)
    if found is None:
        return []
    share, per_step, over, evidence = found
    if share < ctx.threshold("dataloader_share") or per_step < ctx.threshold("min_saving_ms") * 1e6:
        return []
    loaders = ctx.table("dataloaders")
    loader = loaders.iloc[0] if loaders is not None and len(loaders) else None
    cores, job_cores = _cores_for_job(ctx)
    step = per_step / share if share > 0 else per_step
    gpu_busy, tail, waits = _gpu_balance(ctx)
    if gpu_busy:
        evidence += [row_evidence("step_gpu", ctx.table("step_gpu"), "mean", "gpu_busy_ns",
                                  "the GPU's own work per step: the step cannot get shorter")]
        if waits and tail:
            evidence.append(row_evidence("step_gpu", ctx.table("step_gpu"), "mean", "tail_ns",
                                         "waited for once a step after the fix"))
    contention, worst = ctx.threshold("contention"), ctx.threshold("contention_worst")
    figures = StepFigures(step_ns=step, moved_ns=per_step, gpu_busy_ns=gpu_busy, tail_ns=tail, waits_each_step=waits)
    message = (f"The data loader takes {pct(share)} of each step ({ms(per_step)} per step, over {over}); "
               "nothing else runs in the loop meanwhile, and a GPU would sit idle for that time.")
    hotspot = _hotspot(loader)
    metrics: dict[str, Any] = {"share": share, "ns_per_step": per_step, "job_cores": job_cores,
                               "logical_cores": cores}
    if loader is None:
        # A trace: how many workers, and how many cores, is not known. The loader may have
        # run in a thread of the training process (Paddle's buffered reader) and slowed the
        # rest of the step too, so at best the rest gets faster.
        estimate = overlap_saving(figures, contention=contention, contention_worst=worst,
                                  contention_best=ctx.threshold("rest_speedup_trace"))
        found_saving = saving(ctx, estimate.point_ns, "the step once loading overlaps the rest of it: what the "
                              "GPU and the host's other work leave, with workers sharing the CPU",
                              low_ns=estimate.low_ns, high_ns=estimate.high_ns, remains=estimate.remains)
        advice = ("Load batches in worker processes so they overlap compute, DataLoader(num_workers=N, "
                  "pin_memory=True, persistent_workers=True), where the per-item work (reading, decoding, "
                  "tokenizing, augmenting in __getitem__) dominates and CPU cores are free; where the data are "
                  "in-memory tensors, index whole batches at once instead (workers would only add inter-process "
                  "traffic). A trace does not show which, nor how many cores are free: `advisor diagnose "
                  "train.py` does.")
    else:
        key = str(loaders.index[0])
        evidence.append(row_evidence("dataloaders", loaders, key, "num_workers"))
        workers = int(loader["num_workers"])
        item_ns = _number(loader["item_avg_ns"])
        items = _number(loader["items_per_batch"])
        collate_ns = _number(loader["collate_avg_ns"])
        cpu_share = _number(loader.get("fetch_cpu_share", math.nan))
        metrics.update({"dataset": loader["dataset"], "num_workers": workers, "item_ns": item_ns,
                        "collate_ns": collate_ns, "fetch_cpu_share": cpu_share})
        if workers == 0 and not math.isnan(item_ns):
            source = {"in-memory tensors": f"in-memory tensors ({key})", "iterable": f"an iterable dataset ({key})"}
            message += (f" Its batches come from {source.get(loader['kind'], f'a map-style dataset ({key})')}, made "
                        "in the main "
                        f"process one item at a time: {ms(item_ns)} per item, {items:.0f} items and {ms(collate_ns)} "
                        "of collation per batch.")
            evidence += [row_evidence("dataloaders", loaders, key, "item_avg_ns"),
                         row_evidence("dataloaders", loaders, key, "collate_avg_ns")]
            if not math.isnan(cpu_share) and cpu_share < 0.5:
                message += f" Only {pct(cpu_share)} of making a batch is CPU work: the rest is waiting."
                evidence.append(row_evidence("dataloaders", loaders, key, "fetch_cpu_share"))
        if hotspot:
            message += f" {hotspot[0].upper()}{hotspot[1:]}." if not hotspot[0].isdigit() else f" {hotspot}."
            evidence.append(row_evidence("dataloaders", loaders, key, "top_function"))
            function, _, file = str(loader["top_function"]).rstrip(")").partition(" (")
            busiest = str(loader.get("top_lines") or "").split(",")[0].strip()
            if file and busiest.isdigit():
                evidence.append(Evidence(kind="source_line", file=file, line=int(busiest), function=function,
                                         name=function, note="the busiest line of loading's busiest function"))
        cpu_share = 1.0 if math.isnan(cpu_share) else max(cpu_share, 0.0)
        # Workers that mostly wait can outnumber the cores; CPU-bound ones cannot usefully.
        # Rounded up (less a hair, so that noise just above a whole core adds none): 1.9 free
        # cores, another process having taken a little, still run two workers beside a main
        # process that idles while it waits; the step model weighs the cores the workers
        # share, and best_workers takes no more of them than help.
        cap = (max(1, math.ceil(job_cores / max(cpu_share, 0.25) - 0.05)) if not math.isnan(job_cores)
               else max(1, math.ceil(per_step / max(step - per_step, 1.0))))
        cap = min(cap, 32)
        usable = job_cores if not math.isnan(job_cores) else math.inf
        if math.isnan(job_cores):
            spare = "how many CPU cores are free was not measured"
        else:
            others = (" (other processes used the rest)" if job_cores < cores - 0.05 else "")
            spare = (f"the job may use {job_cores:.1f} of the {cores:.0f} logical cores{others}; the main process "
                     "idles while it waits for a batch, so a worker can run there")
        cheap = not math.isnan(item_ns) and item_ns <= ctx.threshold("cheap_item_us") * 1e3
        room = math.isnan(job_cores) or job_cores >= 1 + ctx.threshold("free_core") or cpu_share < 0.5
        if workers == 0 and (loader["kind"] == "in-memory tensors" or cheap) and not loader["batched_fetch"]:
            advice = ("Index the data a whole batch at a time instead of item by item: give the Dataset a "
                      "__getitems__(indices) that returns the batch (X[indices], y[indices]) and pass "
                      "collate_fn=lambda batch: batch, or iterate a BatchSampler yourself: for idx in "
                      "BatchSampler(RandomSampler(data), batch_size, drop_last=False): xb, yb = X[idx], y[idx]. "
                      "Worker processes would not help: each item is cheap, and passing every batch between "
                      "processes would cost more than making it.")
            replaced = ((item_ns * items + collate_ns) * (per_step / float(loader["read_avg_ns"]))
                        if not math.isnan(items) and loader["read_avg_ns"] > 0 else per_step)
            point = min(per_step, replaced)
            found_saving = saving(ctx, point, "the per-item fetching and collation a batched index replaces",
                                  low_ns=point * 0.5, high_ns=per_step,
                                  remains="The step keeps the batched index itself (one indexing of each tensor "
                                          "per batch) and the rest of the step.")
            metrics["advice"] = "batched indexing"
        elif workers == 0 and room:
            figures = StepFigures(**{**figures.__dict__, "cores": usable, "moved_cpu_share": cpu_share})
            n = best_workers(figures, contention, cap)
            estimate = overlap_saving(StepFigures(**{**figures.__dict__, "workers": n}), contention=contention,
                                      contention_worst=worst, contention_best=1.0)
            found_saving = saving(ctx, estimate.point_ns, f"the step with {n} worker{'s' if n != 1 else ''}: "
                                  "what the rest of the step, the GPU, the workers and the cores leave",
                                  low_ns=estimate.low_ns, high_ns=estimate.high_ns, remains=estimate.remains)
            advice = (f"Make batches in worker processes so loading overlaps the model: DataLoader(num_workers={n}, "
                      "persistent_workers=True, prefetch_factor=2, pin_memory=True on a GPU); "
                      f"{spare}.{_threads_advice(estimate, job_cores, n, metrics)} Then cut the per-item work"
                      + (f": {hotspot}." if hotspot else " in __getitem__ (decode once, cache, vectorise)."))
            metrics["advice"] = f"num_workers={n}"
        elif workers == 0:
            advice = (f"Worker processes would compete with training for CPU: other processes leave the job "
                      f"{job_cores:.1f} of the machine's {cores:.0f} logical cores. Make the per-item work cheaper "
                      "instead" + (f": {hotspot} (cache its results, precompute them once before training, or "
                                   "vectorise it)." if hotspot else " (cache, precompute once before training, "
                                                                    "vectorise)."))
            found_saving = saving(ctx, per_step, "the loading that precomputing or caching the per-item work removes",
                                  low_ns=per_step * 0.5, high_ns=per_step,
                                  remains="The step keeps whatever loading remains after the work is made cheaper, "
                                          "and the rest of the step.")
            metrics["advice"] = "cheaper per-item work"
        else:
            busy = _number(loader["workers_busy"])
            # Loader-bound, the workers make one batch per step between them: each takes
            # workers x step to make one.
            batch_ns = workers * step * (busy if not math.isnan(busy) else 1.0)
            more = StepFigures(step_ns=step, moved_ns=batch_ns, rest_ns=step - per_step, gpu_busy_ns=gpu_busy,
                               tail_ns=tail, waits_each_step=waits, cores=usable)
            n = best_workers(more, contention, max(cap, workers))
            threads = ""
            if n > workers:
                estimate = overlap_saving(StepFigures(**{**more.__dict__, "workers": n}), contention=contention,
                                          contention_worst=worst, contention_best=1.0)
                found_saving = saving(ctx, estimate.point_ns, f"the step with {n} workers instead of {workers}",
                                      low_ns=estimate.low_ns, high_ns=estimate.high_ns, remains=estimate.remains)
                what = f"raise num_workers from {workers} to {n} ({spare})"
                threads = _threads_advice(estimate, job_cores, n, metrics)
            else:
                found_saving = saving(ctx, per_step, "the wait for batches, removed when a batch is cheaper to make",
                                      low_ns=per_step * 0.5, high_ns=per_step,
                                      remains="The step keeps the rest of its work.")
                what = "make the per-item work cheaper (no CPU core is left for more workers)"
            advice = (f"The {workers} worker process{'es' if workers != 1 else ''} cannot keep up"
                      + (f" (busy {pct(busy)} of their time)" if not math.isnan(busy) else "")
                      + f": {what}" + (f"; {hotspot}." if hotspot else ".") + threads
                      + " Keep persistent_workers=True so workers are not restarted each epoch.")
            metrics["advice"] = "workers cannot keep up"
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, share),
        confidence=0.9,
        saving=found_saving,
        message=message,
        recommendation=advice,
        evidence=[e for e in evidence if e is not None],
        metrics=metrics,
    )]


def _threads_advice(estimate: OverlapSaving, job_cores: float, workers: int, metrics: dict[str, Any]) -> str:
    """Where the workers' CPU work fills the cores the job may use (the step after the fix
    sits on the CPU floor), the main process's own operators must not compete with them:
    torch's default of a thread per core, its idle threads spinning between operators,
    takes back much of what the workers save (a character tokenizer on 2 cores: 18.3 ms a
    step, 13.0 with 2 workers, 10.2 with 2 workers and one torch thread). Returns the
    sentence to add to the advice ("" where none applies) and records the thread count in
    ``metrics["torch_threads"]``."""
    if estimate.binding != "cpu" or math.isnan(job_cores):
        return ""
    threads = max(1, math.floor(job_cores + 0.05) - workers)
    metrics["torch_threads"] = threads
    return (f" With the workers on every core, give the main process's operators what they leave: "
            f"torch.set_num_threads({threads}) (its default, a thread per core, would compete with the workers "
            "for them).")


def _number(x: Any) -> float:
    return float(x) if x is not None and pd.notna(x) else math.nan
