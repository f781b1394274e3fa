"""What handing a batch over from a DataLoader worker costs on this machine, measured after
the script's run, for a loader that made its batches in the main process (num_workers=0).

A worker makes each batch in its own process and sends it to the main process: every
tensor of the batch goes into shared memory, its handle through a pipe (under torch's
default "file_descriptor" strategy, one socket round trip per tensor), and the main process
maps it back. That costs the main process CPU time per batch, and the worker wall time per
batch, whatever the batch's contents. Where a batch is cheap to make, handing it over can
cost more than making it: the dataloader-starvation rule weighs workers against it rather
than assuming the move is free. The cost differs by machine (a virtual machine's system
calls are slower) and by how many tensors a batch holds, so it is measured here, not
assumed.

The probe runs torch's own DataLoader with one worker, under the script's sharing strategy,
over batches of the loader's tensors (their shapes and dtypes; empty tensors made in shared
memory in the worker, as torch's collation makes them there): a few batches to start the
worker, then up to ``BATCHES`` batches or ``SECONDS`` of them. ``main_ns`` is the main
thread's CPU time per batch received, ``wall_ns`` the wall time per batch (one worker's pace
at making and sending one). It is run once, for the loader read the most, after the script
has ended; it never fails the run: where it cannot run, it says why.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["BATCHES", "MAX_BYTES", "SECONDS", "probe_handoff"]

BATCHES = 24
WARMUP = 3
SECONDS = 0.4  # of timed batches at most
# A larger batch is not probed: its copy, not the hand-over, dominates, and a container's
# /dev/shm is often no larger.
MAX_BYTES = 64 * 2**20
TIMEOUT_S = 10  # a batch the worker has not sent by then ends the probe


def probe_handoff(torch: Any, tensors: list[list[Any]]) -> dict[str, Any]:
    """Hand batches of ``tensors`` (``[shape, dtype]`` pairs, as the loaders hook records
    them) over from one worker: {"main_ns", "wall_ns", "batches", "bytes", "tensors"}, or
    {"skipped": why} where the probe could not or should not run."""
    try:
        specs = [(tuple(int(n) for n in shape), getattr(torch, str(dtype))) for shape, dtype in tensors]
    except (AttributeError, TypeError, ValueError) as exc:
        return {"skipped": f"the batch's tensors could not be described ({exc})"}
    if not specs:
        return {"skipped": "the batches hold no tensors"}
    nbytes = sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in specs)
    if nbytes > MAX_BYTES:
        return {"skipped": f"a batch of {nbytes / 2**20:.0f} MiB is not probed"}
    try:
        return {**_timed(torch, specs), "bytes": nbytes, "tensors": len(specs)}
    except Exception as exc:  # noqa: BLE001  (a probe that cannot run costs the figure, never the run)
        return {"skipped": f"one worker could not hand batches over ({type(exc).__name__}: {exc})"}


def _timed(torch: Any, specs: list[tuple[tuple[int, ...], Any]]) -> dict[str, Any]:
    data = torch.utils.data

    class Batches(data.Dataset):
        def __len__(self) -> int:
            return WARMUP + BATCHES

        def __getitem__(self, index: int) -> list[Any]:
            return [torch.empty(shape, dtype=dtype).share_memory_() for shape, dtype in specs]

    loader = data.DataLoader(Batches(), batch_size=None, num_workers=1, timeout=TIMEOUT_S)
    batches = iter(loader)
    try:
        for _ in range(WARMUP):
            next(batches)
        count, began, began_cpu = 0, time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(BATCHES):
            next(batches)
            count += 1
            if time.perf_counter_ns() - began >= SECONDS * 1e9:
                break
        wall, cpu = time.perf_counter_ns() - began, time.thread_time_ns() - began_cpu
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    return {"main_ns": cpu / count, "wall_ns": wall / count, "batches": count}
