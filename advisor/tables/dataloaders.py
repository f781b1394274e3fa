"""DataLoader Summary: each data loader the script read from, how it makes batches and
where the time of a batch goes.

The collector notes each DataLoader at its first read (the dataset, workers, batch size)
and times every read of it; where batches are made in the main process (num_workers=0)
it also times each fetch and the collate function inside it, so a batch's time splits
into per-item work (``__getitem__``), collation and the loader's own machinery. Where
workers make them, the stack samples of the worker processes say how busy they were and
in which function. The rule that judges a starved loop reads this table to tell per-item
work that worker processes would spread out from per-batch costs they would not.

The means are of the loader's ordinary reads: a read the process stalled in is set apart,
said in ``stalled_reads`` and ``stalled_ns``, where the collector kept each read's time
(advisor.collect.hooks.loaders.KEPT) and such reads are few, as the step model sets apart a
stalled step (advisor.step.timing.isolated_stalls). One such read among eighty (187 ms
inside a collation of 0.2 ms, a full garbage collection's length in that process) moved the
mean collation from 0.16 to 2.5 ms, and the share of a read the script's own work takes
from 82 to 60 %, which sizes the loader's fix. Reads that are often that slow are the
loader's own pattern (a file opened every so often) and stay in the means.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import text
from advisor.step.facts import Facts, coded
from advisor.step.timing import isolated_stalls
from advisor.tables._registry import table
from advisor.tables.python_hotspots import COMPREHENSIONS, NO_USER_FRAME, library_roots, samples_in_steps, stack_facts


def _loader_samples(f: Facts) -> pd.DataFrame:
    """The samples of loading: the main thread in the Dataloader phase and the workers,
    with their innermost user frame and whether they waited."""
    samples, _ = samples_in_steps(f)
    if not len(samples):
        return pd.DataFrame(columns=["role", "pid", "weight", "label", "waiting", "line", "callers"])
    role = text(samples["category"])
    phase = text(samples["phase"])
    loading = (role == "loader worker") | ((role == "main") & (phase == "Dataloader"))
    samples = samples[loading]
    codes, stacks = coded(samples["call_stack"])
    facts = stack_facts(stacks, library_roots(f)).iloc[codes].reset_index(drop=True)
    # Only code the loader itself calls (a Dataset, a collate function) is loading's own; a
    # main-thread sample whose user frame is the loop reading the loader is not.
    own = (facts["function"].to_numpy() != "") & facts["in_loader"].to_numpy().astype(bool)
    # By function, not line: a tokenizer's time spreads over the lines of its loop.
    label = np.where(~own, NO_USER_FRAME,
                     facts["function"].astype(str) + " (" + facts["file"].astype(str) + ")")
    return pd.DataFrame({
        "role": text(samples["category"]),
        "pid": samples["pid"].to_numpy(),
        "weight": (samples["end_ns"] - samples["start_ns"]).to_numpy().astype(np.float64),
        "label": label,
        "waiting": facts["waiting"].to_numpy(),
        "line": facts["line"].to_numpy(),
        # The user frames that led there, outermost first, for naming the caller.
        "callers": facts["user_stack"].astype(str).to_numpy(),
    })


_ENTRY_POINTS = ("__getitem__", "__getitems__", "__iter__", "__next__")  # where torch's loader calls in


def _caller(samples: pd.DataFrame) -> str:
    """The user frame that most often calls the samples' innermost user function, as
    "function (file:line)"; empty where that function is where the loader calls in (a
    Dataset's __getitem__: its caller is torch, and above that the training loop)."""
    chains = samples.groupby("callers")["weight"].sum().sort_values(ascending=False)
    if not len(chains):
        return ""
    # Outermost first; a comprehension's frame is part of the function around it.
    frames = [f for f in str(chains.index[0]).split(" > ") if f.split(" (")[0] not in COMPREHENSIONS]
    if len(frames) < 2 or any(frame.split(" (")[0] in _ENTRY_POINTS for frame in frames[-2:]):
        return ""
    return frames[-2]


def _stalls(times: object) -> list[int]:
    """Positions in ``times`` (each kept read's or fetch's ns) of the reads stalled
    (advisor.step.timing.isolated_stalls); none where the times are not all numbers."""
    if not isinstance(times, list) or not all(isinstance(t, (int, float)) for t in times):
        return []
    return isolated_stalls(np.asarray(times, dtype=np.float64)).tolist()


def _fetches(entry: dict) -> list[list[float]]:
    """The kept fetches' [fetch, collation, items], or none where any is malformed."""
    kept = entry.get("fetch_each")
    if not isinstance(kept, list) or not all(
            isinstance(f, list) and len(f) == 3 and all(isinstance(v, (int, float)) for v in f) for f in kept):
        return []
    return kept


def _random_share(entry: dict, fetches: int) -> float:
    """The share of the checked fetches that drew from a global random generator: the
    collector checks the first fetches (advisor.collect.hooks.loaders.RANDOM_CHECKED);
    sessions saved before that checked every fetch. NaN where none was checked."""
    drawn = entry.get("random_fetches")
    checked = entry.get("random_checked", fetches)
    if not isinstance(drawn, int) or not isinstance(checked, int) or checked <= 0:
        return np.nan
    return min(drawn / checked, 1.0)


def _handoff(entry: dict, figure: str) -> float:
    """A figure of the worker hand-over timed after the run, NaN where it was not."""
    handoff = entry.get("handoff")
    value = handoff.get(figure) if isinstance(handoff, dict) else None
    return float(value) if isinstance(value, (int, float)) and value >= 0 else np.nan


@table(
    "dataloaders",
    title="DataLoader Summary",
    description=(
        "One row per DataLoader the script read from (by its dataset), most read time first. "
        "Reads are every batch taken from it over the run. Where the main process made the "
        "batches (num_workers=0) a batch's time splits into per-item work (the dataset's "
        "__getitem__), the collate function, and the loader's own machinery (sampler, "
        "iteration); with workers, a read in the main process is mostly waiting for them, and "
        "the workers' sampled stacks say how busy they were. top_function is the user's "
        "function where loading spent most of its sampled time. Empty for traces."
    ),
    key="The dataset class name ('#2' appended where two loaders read datasets of one class)",
    columns={
        "dataset": "The dataset's class, with its module.",
        "kind": "'in-memory tensors' (a TensorDataset), 'map-style' or 'iterable'.",
        "batched_fetch": "Whether the dataset fetches a whole batch at once (__getitems__).",
        "num_workers": "DataLoader worker processes (0: batches are made in the main process).",
        "persistent_workers": "Whether the workers are kept from one epoch to the next (persistent_workers=True).",
        "length": "The dataset's items (len(dataset)); NaN where it has no length (an iterable dataset).",
        "batch_size": "Samples per batch (NaN where the loader does not batch).",
        "pin_memory": "Whether batches are copied to pinned memory.",
        "reads": "Batches read from it over the run.",
        "read_avg_ns": "Mean time a read took in the main process, ns (the stalled reads set apart).",
        "stalled_reads": "Reads set apart as stalls: over ten times the median read, and few (at most one in "
                         "twenty, three in all); a pause of the process, not the loader's work. 0 where none were, "
                         "or where each read's time was not kept.",
        "stalled_ns": "The stalled reads' time beyond a median read, summed over the run, ns.",
        "fetch_avg_ns": "Mean time making a batch in the main process (items and collation), ns "
                        "(NaN with workers; stalled fetches set apart, as reads are).",
        "item_avg_ns": "Mean per-item time in the main process (__getitem__), ns (NaN with workers; stalled "
                       "fetches set apart).",
        "collate_avg_ns": "Mean collate time per batch in the main process, ns (NaN with workers; stalled fetches "
                          "set apart).",
        "collate_fn": "The collate function's name: default_collate is torch's own, which stacks the items; "
                      "another is the script's (empty where the session does not say).",
        "fetch_cpu_share": "The share of making a batch the main process spent on the CPU (the rest: waiting on "
                           "files, the network, sleeps, or for a core); NaN with workers or where not measured.",
        "fetch_runnable_share": "The share of making a batch the main process was ready to run but waited for a "
                                "core (other processes held them): CPU work delayed, not waiting on data; NaN with "
                                "workers or where not measured.",
        "machinery_avg_ns": "read_avg_ns - fetch_avg_ns: the loader's own work per batch (sampler, iteration, "
                            "pinning); with workers, waiting for them.",
        "items_per_batch": "Items fetched per batch in the main process.",
        "random_share": "The share of the main process's fetches (the first 32, where the collector checked those) "
                        "during which a global random generator (Python's, "
                        "torch's CPU generator, numpy's) was drawn from: items augmented at random differ every "
                        "epoch and cannot be made once; NaN with workers or where not recorded.",
        "torch_threads": "The main process's torch operator threads (torch.get_num_threads()) when it first read "
                         "the loader; NaN where not recorded.",
        "handoff_main_ns": "Where the main process made the batches: the main process's CPU time to receive one "
                           "batch of this loader's tensors from a worker process, timed on this machine after the "
                           "run (advisor.collect.handoff), ns; NaN where not timed.",
        "handoff_wall_ns": "One worker's wall time per batch it makes and hands over (empty tensors of this "
                           "loader's shapes), timed with handoff_main_ns, ns; NaN where not timed.",
        "workers_busy": "With workers: the share of the workers' sampled time spent working rather than "
                        "waiting for work (NaN without workers or samples).",
        "top_function": "The user's function (code the loader calls: a Dataset, a collate function) where "
                        "loading spent most of its sampled working time, with its file.",
        "top_function_share": "Its share of loading's sampled working time (its own lines, not the functions it "
                              "calls).",
        "top_lines": "Its busiest lines, busiest first (comma-separated line numbers).",
        "top_caller": "The user function that calls it (most often), with its file and line; empty where "
                      "either is where the loader calls in (a Dataset's __getitem__).",
        "top_caller_share": "The caller's share of loading's sampled working time, including what it calls.",
    },
)
def dataloaders_table(f: Facts) -> pd.DataFrame | None:
    facts = f.meta.trace_metadata.get("advisor") or {}
    loaders = [entry for entry in facts.get("loaders") or [] if isinstance(entry, dict)]
    if not loaders:
        return None
    rows = {}
    for entry in sorted(loaders, key=lambda e: -float(e.get("read_ns") or 0)):
        name = str(entry.get("dataset_name") or "dataset")
        key, n = name, 2
        while key in rows:
            key, n = f"{name} #{n}", n + 1
        reads = int(entry.get("reads") or 0)
        fetches = int(entry.get("fetches") or 0)
        items = int(entry.get("items") or 0)
        workers = int(entry.get("num_workers") or 0)
        # Stalled reads and fetches set apart (module docstring): their count and time
        # leave the sums the means are of.
        read_each = entry.get("read_each_ns")
        stalled = _stalls(read_each)
        stalled_read_ns = float(sum(read_each[i] for i in stalled))
        stalled_ns = stalled_read_ns - len(stalled) * float(np.median(read_each)) if stalled else 0.0
        kept = _fetches(entry)
        slow = _stalls([f[0] for f in kept]) if not workers else []
        fetch_ns = entry["fetch_ns"] - sum(kept[i][0] for i in slow)
        collate_ns = entry["collate_ns"] - sum(kept[i][1] for i in slow)
        fetch_items = items - sum(kept[i][2] for i in slow)
        fetch_n = fetches - len(slow)
        read_avg = (entry["read_ns"] - stalled_read_ns) / (reads - len(stalled)) if reads > len(stalled) else np.nan
        fetch_avg = fetch_ns / fetch_n if fetch_n and not workers else np.nan
        collate_avg = collate_ns / fetch_n if fetch_n and not workers else np.nan
        cpu_share = (min(entry["fetch_cpu_ns"] / entry["fetch_ns"], 1.0)
                     if entry.get("fetch_cpu_ns") and entry["fetch_ns"] and not workers else np.nan)
        runnable = entry.get("fetch_runnable_ns")
        runnable_share = (min(max(runnable, 0) / entry["fetch_ns"], 1.0)
                          if runnable is not None and entry.get("fetch_ns") and not workers else np.nan)
        item_avg = (fetch_ns - collate_ns) / fetch_items if fetch_items and not workers else np.nan
        kind = "iterable" if entry.get("iterable") else "in-memory tensors" if entry.get("in_memory_tensors") \
            else "map-style"
        rows[key] = {
            "dataset": entry.get("dataset", ""), "kind": kind, "batched_fetch": bool(entry.get("batched_fetch")),
            "num_workers": workers, "persistent_workers": bool(entry.get("persistent_workers")),
            "length": float(entry["length"]) if isinstance(entry.get("length"), int) else np.nan,
            "batch_size": entry.get("batch_size"), "pin_memory": bool(entry.get("pin_memory")),
            "reads": reads, "read_avg_ns": read_avg, "stalled_reads": len(stalled), "stalled_ns": stalled_ns,
            "fetch_avg_ns": fetch_avg, "item_avg_ns": item_avg,
            "collate_avg_ns": collate_avg, "collate_fn": str(entry.get("collate_fn") or ""),
            "fetch_cpu_share": cpu_share,
            "fetch_runnable_share": runnable_share,
            "machinery_avg_ns": read_avg - fetch_avg if not workers else read_avg,
            "items_per_batch": items / fetches if fetches and not workers else np.nan,
            "random_share": _random_share(entry, fetches) if not workers else np.nan,
            "torch_threads": float(entry["torch_threads"]) if isinstance(entry.get("torch_threads"), int) else np.nan,
            "handoff_main_ns": _handoff(entry, "main_ns"), "handoff_wall_ns": _handoff(entry, "wall_ns"),
            "workers_busy": np.nan, "top_function": "", "top_function_share": np.nan, "top_lines": "",
            "top_caller": "", "top_caller_share": np.nan,
        }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out["batch_size"] = pd.to_numeric(out["batch_size"], errors="coerce")
    loading = _loader_samples(f)
    if len(loading):
        # Samples cannot tell two loaders apart: they describe the loader read the most.
        first = out.index[0]
        workers = loading[loading["role"] == "loader worker"]
        if len(workers) and out.at[first, "num_workers"] > 0:
            out.at[first, "workers_busy"] = float(workers.loc[~workers["waiting"], "weight"].sum()
                                                  / workers["weight"].sum())
        working = loading[~loading["waiting"].astype(bool)]
        by_label = working.groupby("label")["weight"].sum().sort_values(ascending=False)
        by_label = by_label[by_label.index != NO_USER_FRAME]
        if len(by_label) and working["weight"].sum() > 0:
            total = working["weight"].sum()
            top = str(by_label.index[0])
            out.at[first, "top_function"] = top
            out.at[first, "top_function_share"] = float(by_label.iloc[0] / total)
            mine = working[working["label"] == top]
            lines = mine.groupby("line")["weight"].sum().sort_values(ascending=False)
            out.at[first, "top_lines"] = ", ".join(str(int(n)) for n in lines.index[:3] if n >= 0)
            caller = _caller(mine)
            if caller:
                # The caller's inclusive share: every working sample with it on the stack.
                name = caller.rpartition(":")[0]
                out.at[first, "top_caller"] = caller
                out.at[first, "top_caller_share"] = float(
                    working.loc[working["callers"].str.contains(name, regex=False), "weight"].sum() / total)
    return out
