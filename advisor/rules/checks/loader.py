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

from advisor.findings import Finding
from advisor.rules.checks.common import (
    ms,
    pct,
    row_evidence,
    saving,
    severity_by_share,
    value,
)
from advisor.rules.registry import RuleContext, register


def _free_cores(ctx: RuleContext) -> tuple[float, float, float]:
    """(logical cores, cores the machine used meanwhile, cores free), NaN where not sampled."""
    device = ctx.table("device")
    cores = value(device, "cpu", "logical_cores", math.nan)
    system = value(device, "cpu", "system_cpu_utilization", math.nan)
    process = value(device, "cpu", "process_cpu_cores", math.nan)
    used = system * cores if not math.isnan(system) else process
    return cores, used, cores - used if not math.isnan(used) else math.nan


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
    return f"{pct(float(loader['top_function_share']))} of loading is in {loader['top_function']}"


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
    cores, used, free = _free_cores(ctx)
    step = per_step / share if share > 0 else math.nan
    compute = step - per_step
    message = (f"The data loader takes {pct(share)} of each step ({ms(per_step)} per step, over {over}); "
               "nothing else runs in the loop meanwhile, and a GPU would sit idle for that time.")
    hotspot = _hotspot(loader)
    metrics: dict[str, Any] = {"share": share, "ns_per_step": per_step, "free_cores": free, "logical_cores": cores}
    point = per_step
    basis = ("the loader's whole time per step, recoverable when loading overlaps compute (worker processes "
             "and prefetching)")
    if loader is None:
        advice = ("Load batches in worker processes so they overlap compute, DataLoader(num_workers=N, "
                  "pin_memory=True, persistent_workers=True), where the per-item work (reading, decoding, "
                  "tokenizing, augmenting in __getitem__) dominates and CPU cores are free; where the data are "
                  "in-memory tensors, index whole batches at once instead (workers would only add inter-process "
                  "traffic). A trace does not show which: `advisor diagnose train.py` does.")
    else:
        key = str(loaders.index[0])
        evidence.append(row_evidence("dataloaders", loaders, key, "num_workers"))
        workers = int(loader["num_workers"])
        item_ns = float(loader["item_avg_ns"]) if pd.notna(loader["item_avg_ns"]) else math.nan
        items = float(loader["items_per_batch"]) if pd.notna(loader["items_per_batch"]) else math.nan
        collate_ns = float(loader["collate_avg_ns"]) if pd.notna(loader["collate_avg_ns"]) else math.nan
        metrics.update({"dataset": loader["dataset"], "num_workers": workers, "item_ns": item_ns,
                        "collate_ns": collate_ns})
        if workers == 0 and not math.isnan(item_ns):
            source = {"in-memory tensors": f"in-memory tensors ({key})", "iterable": f"an iterable dataset ({key})"}
            message += (f" Its batches come from {source.get(loader['kind'], f'a map-style dataset ({key})')}, made "
                        "in the main "
                        f"process one item at a time: {ms(item_ns)} per item, {items:.0f} items and {ms(collate_ns)} "
                        "of collation per batch.")
            evidence += [row_evidence("dataloaders", loaders, key, "item_avg_ns"),
                         row_evidence("dataloaders", loaders, key, "collate_avg_ns")]
        if hotspot:
            message += f" {hotspot[0].upper()}{hotspot[1:]}." if not hotspot[0].isdigit() else f" {hotspot}."
            evidence.append(row_evidence("dataloaders", loaders, key, "top_function"))
        cheap = not math.isnan(item_ns) and item_ns <= ctx.threshold("cheap_item_us") * 1e3
        if workers == 0 and (loader["kind"] == "in-memory tensors" or cheap) and not loader["batched_fetch"]:
            advice = ("Index the data a whole batch at a time instead of item by item: give the Dataset a "
                      "__getitems__(indices) that returns the batch (X[indices], y[indices]) and pass "
                      "collate_fn=lambda batch: batch, or iterate a BatchSampler yourself: for idx in "
                      "BatchSampler(RandomSampler(data), batch_size, drop_last=False): xb, yb = X[idx], y[idx]. "
                      "Worker processes would not help: each item is cheap, and passing every batch between "
                      "processes would cost more than making it.")
            point = min(per_step, (item_ns * items + collate_ns) * (per_step / float(loader["read_avg_ns"]))
                        if not math.isnan(items) and loader["read_avg_ns"] > 0 else per_step)
            basis = "the per-item fetching and collation a batched index replaces"
            metrics["advice"] = "batched indexing"
        elif workers == 0 and (math.isnan(free) or free >= ctx.threshold("free_core")):
            wanted = max(1, math.ceil(per_step / compute)) if compute > 0 else 1
            n = wanted if math.isnan(free) else max(1, min(wanted, round(free)))
            spare = (f"{free:.1f} of {cores:.0f} logical cores are free while it runs" if not math.isnan(free)
                     else "this trace does not say how many CPU cores are free")
            advice = (f"Make batches in worker processes so loading overlaps the model: DataLoader(num_workers={n}, "
                      "persistent_workers=True, prefetch_factor=2, pin_memory=True on a GPU); "
                      f"{spare}. Then cut the per-item work" + (f": {hotspot}." if hotspot else
                                                                " in __getitem__ (decode once, cache, vectorise)."))
            metrics["advice"] = f"num_workers={n}"
        elif workers == 0:
            advice = (f"Worker processes would compete with training for CPU: the machine already uses {used:.1f} "
                      f"of its {cores:.0f} logical cores. Make the per-item work cheaper instead"
                      + (f": {hotspot} (cache its results, precompute them once before training, or vectorise it)."
                         if hotspot else " (cache, precompute once before training, vectorise)."))
            metrics["advice"] = "cheaper per-item work"
        else:
            busy = float(loader["workers_busy"]) if pd.notna(loader["workers_busy"]) else math.nan
            more = (f"raise num_workers from {workers} (about {free:.1f} cores are free)" if not math.isnan(free)
                    and free >= ctx.threshold("free_core") else
                    "make the per-item work cheaper (no CPU core is free for more workers)")
            advice = (f"The {workers} worker process{'es' if workers != 1 else ''} cannot keep up"
                      + (f" (busy {pct(busy)} of their time)" if not math.isnan(busy) else "")
                      + f": {more}" + (f"; {hotspot}." if hotspot else ".")
                      + " Keep persistent_workers=True so workers are not restarted each epoch.")
            metrics["advice"] = "workers cannot keep up"
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, share),
        confidence=0.9,
        saving=saving(ctx, point, basis),
        message=message,
        recommendation=advice,
        evidence=[e for e in evidence if e is not None],
        metrics=metrics,
    )]
