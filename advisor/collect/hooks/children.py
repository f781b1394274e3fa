"""Processes the script starts, and the ranks torch.multiprocessing.spawn starts.

DataLoader workers are the loader's (advisor.collect.hooks.loaders); any other process
(``multiprocessing.Process``, ``torch.multiprocessing.spawn``) runs work advisor's
collector does not see, so it is counted for the report to say so. Where the command asks
for it, each rank torch.multiprocessing.spawn starts runs its function under a collector of
its own instead (advisor.collect.spawned.ProfiledRank, handed down by the command).
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.collect.hooks import base
from advisor.collect.hooks.collection import HostCollection


class Children:
    """The processes the script started, by target and launcher."""

    def __init__(self, open_step: Callable[[], int | None], ranks: tuple[Path, dict, type] | None):
        """``open_step()``: the step open now, or None. ``ranks``: (folder, collection
        options, the class that runs a rank under its own collector), or None."""
        self._open_step = open_step
        self._ranks = ranks
        self._seen: list[dict[str, Any]] = []

    def install(self, patches: base.Patches) -> None:
        patches.patch(importlib.import_module("multiprocessing.process").BaseProcess, "start", _wrap_process_start)
        if self._ranks is not None:
            spawn_mod = importlib.import_module("torch.multiprocessing.spawn")
            if hasattr(spawn_mod, "start_processes"):
                folder, options, wrap = self._ranks
                patches.patch(spawn_mod, "start_processes",
                              functools.partial(_wrap_start_processes, folder=folder, options=options, wrap=wrap))
        distributed = importlib.import_module("torch.distributed")
        if getattr(distributed, "is_available", lambda: False)() and hasattr(distributed, "destroy_process_group"):
            patches.patch(distributed, "destroy_process_group", _wrap_destroy_process_group)

    def fill(self, result: HostCollection) -> None:
        result.children = list(self._seen)

    def note(self, process: Any) -> None:
        """A process the script starts: DataLoader workers are the loader's; any other runs
        work advisor's collector does not see."""
        from advisor.collect.stacks import sampled_worker_loop  # noqa: PLC0415

        target = getattr(process, "_target", None)
        worker_loop = getattr(importlib.import_module("torch.utils.data._utils.worker"), "_worker_loop", None)
        if target is sampled_worker_loop or target is worker_loop or getattr(target, "__name__", "") == "_worker_loop":
            return
        launcher = "multiprocessing"
        if getattr(target, "__module__", "") == "torch.multiprocessing.spawn":
            args = getattr(process, "_args", ()) or ()
            launcher = "torch.multiprocessing.spawn"
            target = args[0] if args and callable(args[0]) else target
            if self._ranks is not None and isinstance(target, self._ranks[2]):
                return  # profiled in the child: a rank of the job
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(process).__name__
        module = getattr(target, "__module__", "") or ""
        for child in self._seen:
            if child["target"] == name and child["launcher"] == launcher:
                child["count"] += 1
                return
        self._seen.append({"target": name, "module": module, "launcher": launcher,
                           "count": 1, "step": self._open_step()})


def _wrap_process_start(original: Any) -> Any:
    @functools.wraps(original)
    def start(self: Any) -> Any:
        collector = base.ACTIVE
        if collector is not None and collector.ours():
            try:
                collector.children.note(self)
            except Exception:  # noqa: BLE001  (counting must never stop the user's process)
                pass
        return original(self)

    return start


def _wrap_start_processes(original: Callable[..., Any], *, folder: Path, options: dict,
                          wrap: type) -> Callable[..., Any]:
    """torch.multiprocessing.spawn's start_processes, each process's function run under a
    collector of its own that saves the rank's session in ``folder``: ``wrap(fn, folder,
    options)``, the class the command gave (advisor.collect.spawned.ProfiledRank)."""

    @functools.wraps(original)
    def start_processes(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(fn, wrap):
            fn = wrap(fn, str(folder), options)
        return original(fn, *args, **kwargs)

    return start_processes


# How long destroy_process_group lets gloo's threads run before it joins them.
SETTLE_BEFORE_DESTROY_S = 0.2


def _wrap_destroy_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    """Give gloo's threads the GIL for a moment before the script destroys its process group.

    A gloo collective started during backward keeps a Python object (the autograd engine's
    stashed context) in the thread-local state it captured, and gloo's worker thread needs
    the GIL to drop it; ``destroy_process_group`` (through the DDP reducer's deallocation)
    joins that thread while holding the GIL. Plain runs rarely lose that race; with the
    collector's sampler threads also taking the GIL, a rank hung at exit in 3 of 12 runs of
    examples/ddp_straggler.py under torchrun, and in none of 16 with this pause (which
    releases the GIL) first."""

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SETTLE_BEFORE_DESTROY_S)
        return original(*args, **kwargs)

    return destroy_process_group
