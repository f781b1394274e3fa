"""What each DataLoader the script reads is, and what its reads, fetches and collation took.

A DataLoader's facts (dataset, workers, pinning, batch size...) are taken at its first read;
each read's time is counted by the step hooks (advisor.collect.hooks.steps, which mark the
read as the Dataloader phase), and where the loader fetches in this process
(``num_workers=0``) each fetch, and the collate function inside it, is timed here, with
the thread's CPU time and its wait for a core beside the wall time. Beside the sums, the
first ``KEPT`` reads' and fetches' own times are kept, so that the summary can tell a read
the process stalled in (one collation held up 187 ms among ones of 0.2 ms) from the
loader's ordinary work (advisor.tables.dataloaders).
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from advisor.collect.hooks import base
from advisor.collect.hooks.collection import HostCollection

# Reads and fetches whose own times are kept, per loader: enough to see a stall among
# them, bounded so a long run's collection stays small (a few tens of kB per loader).
KEPT = 2048

# Fetches whose draws from the global random generators are checked, per loader.
RANDOM_CHECKED = 32


class Loaders:
    """The DataLoaders of the run, keyed by their dataset."""

    def __init__(self, torch: Any, run_delay: Callable[[], Any]):
        """``run_delay()``: the main thread's RunDelay (None where not measured)."""
        self._torch = torch
        self._run_delay = run_delay
        self._loaders: dict[int, dict[str, Any]] = {}

    def install(self, patches: base.Patches) -> None:
        fetch_mod = importlib.import_module("torch.utils.data._utils.fetch")
        for fetcher in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            if hasattr(fetch_mod, fetcher):
                patches.patch(getattr(fetch_mod, fetcher), "fetch", _wrap_fetch)

    def fill(self, result: HostCollection) -> None:
        result.loaders = [dict(entry) for entry in self._loaders.values()]

    def entry(self, iterator: Any) -> dict[str, Any]:
        """The facts of the DataLoader ``iterator`` reads for, made at its first read."""
        dataset = getattr(iterator, "_dataset", None)
        key = id(dataset)
        entry = self._loaders.get(key)
        if entry is None:
            entry = self._loaders[key] = loader_facts(self._torch, iterator)
        return entry

    @staticmethod
    def read(original: Any, iterator: Any, loader: dict[str, Any]) -> Any:
        """One batch from ``iterator``, its time counted for its loader (a read that finds
        the iterator exhausted is not a batch)."""
        start = time.perf_counter_ns()
        batch = original(iterator)
        spent = time.perf_counter_ns() - start
        loader["read_ns"] += spent
        loader["reads"] += 1
        if len(loader["read_each_ns"]) < KEPT:
            loader["read_each_ns"].append(spent)
        if loader["reads"] == 1:
            # What a batch is made of: what handing one over from a worker would move
            # (advisor.collect.handoff times that after the run).
            loader["batch_tensors"] = batch_tensors(batch)
        return batch

    def timed_fetch(self, original: Any, fetcher: Any, index: Any) -> Any:
        """A fetcher's ``fetch`` in this process (num_workers=0): the whole fetch, and the
        collate function inside it, timed for the fetcher's loader."""
        entry = self._loaders.get(id(getattr(fetcher, "dataset", None)))
        if entry is None:
            return original(fetcher, index)
        collate = fetcher.collate_fn
        spent = [0]

        def timed_collate(data: Any) -> Any:
            began = time.perf_counter_ns()
            try:
                return collate(data)
            finally:
                spent[0] += time.perf_counter_ns() - began

        fetcher.collate_fn = timed_collate
        # Reading the generators' states costs 0.2-0.5 ms a fetch (numpy's copies its key):
        # read only for the first RANDOM_CHECKED fetches, which tell a loader that draws on
        # every item from one that does not as well as every fetch would.
        checked = entry.get("random_checked", 0) < RANDOM_CHECKED
        drawn = _random_states() if checked else None
        delay = self._run_delay()
        began_delay = delay.read() if delay is not None else None
        began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return original(fetcher, index)
        finally:
            fetcher.collate_fn = collate
            fetched = time.perf_counter_ns() - began
            entry["fetch_ns"] += fetched
            # The thread's CPU time tells work from waiting (reading files, sleeps):
            # workers that mostly wait can outnumber the cores. Time spent ready but
            # waiting for a core (a busy machine) is CPU work too, not waiting.
            entry["fetch_cpu_ns"] += time.thread_time_ns() - began_cpu
            ended_delay = delay.read() if delay is not None else None
            if began_delay is not None and ended_delay is not None:
                entry["fetch_runnable_ns"] = entry.get("fetch_runnable_ns", 0) + ended_delay - began_delay
            entry["collate_ns"] += spent[0]
            entry["fetches"] += 1
            # Items that draw random numbers (augmentation) differ every epoch: they cannot
            # be made once before training.
            if drawn is not None:
                entry["random_checked"] = entry.get("random_checked", 0) + 1
                if not _same_states(drawn, _random_states()):
                    entry["random_fetches"] = entry.get("random_fetches", 0) + 1
            try:
                items = len(index) if getattr(fetcher, "auto_collation", False) else 1
            except TypeError:  # an index without a length (an iterable dataset's batch)
                items = 1
            entry["items"] += items
            if len(entry["fetch_each"]) < KEPT:
                entry["fetch_each"].append([fetched, spent[0], items])


def _random_states() -> tuple[Any, ...]:
    """The global random generators' states as they are (Python's, torch's CPU generator,
    numpy's where it is loaded): read, never drawn from, so the job's numbers are its own."""
    import random  # noqa: PLC0415

    import torch  # noqa: PLC0415

    states: list[Any] = [random.getstate(), torch.default_generator.get_state()]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        legacy = numpy.random.get_state(legacy=False)
        states.append((legacy["state"]["pos"], legacy["state"]["key"].copy()))
    return tuple(states)


def _same_states(before: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
    """Whether no generator moved between the two reads of _random_states."""
    import torch  # noqa: PLC0415

    if len(before) != len(after) or before[0] != after[0] or not torch.equal(before[1], after[1]):
        return False
    if len(before) > 2:
        (pos, key), (pos_after, key_after) = before[2], after[2]
        return pos == pos_after and bool((key == key_after).all())
    return True


def _wrap_fetch(original: Any) -> Any:
    @functools.wraps(original)
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        collector = base.acting()
        if collector is None:
            return original(self, possibly_batched_index)
        return collector.loaders.timed_fetch(original, self, possibly_batched_index)

    return fetch


def loader_facts(torch: Any, iterator: Any) -> dict[str, Any]:
    """What a DataLoader iterator says of its loader: the dataset, how batches are made
    and by how many workers; with zeroed counters for its reads and fetches."""
    dataset = getattr(iterator, "_dataset", None)
    kind = type(dataset)
    sampler = getattr(iterator, "_index_sampler", None)
    collate = getattr(iterator, "_collate_fn", None)
    data = importlib.import_module("torch.utils.data")
    auto = bool(getattr(iterator, "_auto_collation", False))
    return {
        "dataset": f"{kind.__module__}.{kind.__qualname__}",
        "dataset_name": kind.__name__,
        "in_memory_tensors": isinstance(dataset, data.TensorDataset),
        "batched_fetch": hasattr(dataset, "__getitems__"),
        "iterable": isinstance(dataset, data.IterableDataset),
        "length": _length(dataset),
        "num_workers": int(getattr(iterator, "_num_workers", 0) or 0),
        "pin_memory": bool(getattr(iterator, "_pin_memory", False)),
        "persistent_workers": bool(getattr(iterator, "_persistent_workers", False)),
        "prefetch_factor": getattr(iterator, "_prefetch_factor", None),
        "batch_size": getattr(sampler, "batch_size", None) if auto else None,
        "auto_collation": auto,
        "collate_fn": getattr(collate, "__qualname__", None) or type(collate).__name__,
        # The main process's operator threads as the script set them (the advice on threads
        # beside workers must not ask for what the script already does).
        "torch_threads": importlib.import_module("torch").get_num_threads(),
        "reads": 0, "read_ns": 0, "fetches": 0, "fetch_ns": 0, "fetch_cpu_ns": 0, "collate_ns": 0, "items": 0,
        "random_fetches": 0, "random_checked": 0,
        # The first KEPT reads' times, ns, and fetches' [fetch, collation, items].
        "read_each_ns": [], "fetch_each": [],
    }


def _length(dataset: Any) -> int | None:
    try:
        return int(len(dataset))
    except Exception:  # an iterable dataset, or a len() that raises
        return None


def first_batch_size(batch: Any, _depth: int = 0) -> int | None:
    """The first dimension of the first tensor found in ``batch`` (depth first through
    tensors, mappings, lists and tuples), or None."""
    import torch  # noqa: PLC0415

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() >= 1 else None
    if _depth > 8:
        return None
    if isinstance(batch, Mapping):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        size = first_batch_size(item, _depth + 1)
        if size is not None:
            return size
    return None




MAX_BATCH_TENSORS = 64


def batch_tensors(batch: Any) -> list[list[Any]]:
    """The tensors of ``batch`` (depth first through mappings, lists and tuples, at most
    ``MAX_BATCH_TENSORS``) as ``[shape, dtype]`` pairs: ``[[32, 3, 224, 224], "float32"]``."""
    import torch  # noqa: PLC0415

    found: list[list[Any]] = []

    def walk(item: Any, depth: int) -> None:
        if len(found) >= MAX_BATCH_TENSORS or depth > 8:
            return
        if isinstance(item, torch.Tensor):
            found.append([[int(n) for n in item.shape], str(item.dtype).removeprefix("torch.")])
        elif isinstance(item, Mapping):
            for value in item.values():
                walk(value, depth + 1)
        elif isinstance(item, (list, tuple)):
            for value in item:
                walk(value, depth + 1)

    walk(batch, 0)
    return found


def exhausted(iterator: Any) -> bool:
    """Whether a map-style DataLoader iterator has yielded all its batches, so the next
    ``__next__`` raises StopIteration (an IterableDataset has no length: False)."""
    try:
        return iterator._num_yielded >= len(iterator)
    except Exception:
        return False
