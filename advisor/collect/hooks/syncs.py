"""Host-blocking calls the script makes itself, counted per source line.

``loss.item()``, ``.cpu()``, ``.tolist()``, ``float(t)``, ``if t:``, ``f"{t:.3f}"``,
``torch.cuda.synchronize()``... are counted per source line while something records (the
steps of the window), with the time spent in them, and written to the trace's ``advisor``
metadata as ``host_syncs``: the Chrome trace itself cannot give the line, since its
``python_function`` events name a function by the line it is defined on. Calls made inside
torch (an optimizer reading its step count) are not counted: the line to point at is the
user's. On a CPU-only run these calls do not wait for a device; ``device`` says where the
tensor was. Each call is also a range, ``advisor::sync item @ train.py(42): main``, so the
ops inside it carry the calling line in the trace.
"""

from __future__ import annotations

import functools
import linecache
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from advisor.collect.hooks import base
from advisor.collect.hooks.collection import SYNC_RANGE_PREFIX, HostCollection
from advisor.collect.hooks.recorder import NO_RANGE, Recorder

# Tensor methods that read a tensor's data on the host, so on a GPU they wait for every
# kernel queued before them: name -> what the call does, in the user's words.
HOST_SYNC_METHODS = {
    "item": "item",
    "tolist": "tolist",
    "numpy": "numpy",
    "cpu": "copy to host",
    "to": "copy to host",  # counted only from a device to the CPU
    "__bool__": "bool",
    "__int__": "int",
    "__float__": "float",
    "__format__": "format",
    "__repr__": "print",
}


@dataclass
class HostSyncSite:
    """Host-blocking calls made from one source line."""

    call: str
    file: str
    line: int
    function: str
    code: str = ""
    calls: int = 0
    total_ns: int = 0
    steps: set[int] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {
            "call": self.call,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "code": self.code,
            "calls": self.calls,
            "total_ns": self.total_ns,
            "steps": len(self.steps),
            "devices": sorted(self.devices),
        }


MAX_HOST_SYNC_SITES = 200


class SyncSites:
    """Host-blocking calls by (file, line, call)."""

    def __init__(self, torch: Any, recorder: Recorder, open_step: Callable[[], int | None]):
        """``open_step()``: the number of the step open now, or None."""
        self._torch = torch
        self._recorder = recorder
        self._open_step = open_step
        self._sites: dict[tuple[str, int, str], HostSyncSite] = {}

    def install(self, patches: base.Patches) -> None:
        torch = self._torch
        for method, call in HOST_SYNC_METHODS.items():
            patches.patch(torch.Tensor, method, functools.partial(_wrap_host_sync, call=call, method=method))
        cuda = torch.cuda
        patches.patch(cuda, "synchronize", functools.partial(_wrap_host_sync, call="synchronize", method=""))
        for owner in (cuda.Stream, cuda.Event):
            patches.patch(owner, "synchronize", functools.partial(_wrap_host_sync, call="synchronize", method=""))

    def fill(self, result: HostCollection) -> None:
        sites = sorted(self._sites.values(), key=lambda site: (-site.total_ns, site.file, site.line))
        result.host_syncs = [site.as_dict() for site in sites[:MAX_HOST_SYNC_SITES]]

    def range(self, call: str, frame: Any) -> Any:
        """A record_function range named for a host-blocking call and its source line,
        in Kineto's call-stack spelling: ``advisor::sync item @ train.py(42): main``.
        Where nothing records (outside the window, no GPU collector listening) a range
        would cost more than the call it marks, so there is none."""
        if not self._recorder.records_now():
            return NO_RANGE
        code = frame.f_code
        return self._recorder.reported_range(f"{SYNC_RANGE_PREFIX}{call} @ {code.co_filename}({frame.f_lineno}): "
                                             f"{code.co_name}")

    def note(self, call: str, target: Any, frame: Any, elapsed_ns: int) -> None:
        """One call ``call`` on ``target`` from ``frame``'s line, which took ``elapsed_ns``."""
        code = frame.f_code
        key = (code.co_filename, frame.f_lineno, call)
        site = self._sites.get(key)
        if site is None:
            if len(self._sites) >= 10 * MAX_HOST_SYNC_SITES:
                return
            source = linecache.getline(code.co_filename, frame.f_lineno).strip()
            site = HostSyncSite(call, code.co_filename, frame.f_lineno, code.co_name, source)
            self._sites[key] = site
        site.calls += 1
        site.total_ns += elapsed_ns
        step = self._open_step()
        if step is not None:
            site.steps.add(step)
        # A site's tensors live on one device in practice: look at the first few calls
        # only (reading .device builds an object each time, in a per-sample loop too).
        if site.calls <= 4:
            device = getattr(target, "device", None)
            if device is not None:
                site.devices.add(str(getattr(device, "type", device)))


def copies_to_host(args: tuple, kwargs: dict) -> bool:
    """Whether ``tensor.to(*args[1:], **kwargs)`` copies a device tensor to the CPU.
    (``.to(device)`` of a CPU tensor is the portable host-to-device idiom, not a read-back,
    even on a run where ``device`` is the CPU.)"""
    source = getattr(getattr(args[0], "device", None), "type", "cpu") if args else "cpu"
    if source == "cpu":
        return False
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, str) and value.split(":")[0] == "cpu":
            return True
        kind = getattr(value, "type", None)  # torch.device
        if kind == "cpu" and not callable(kind):
            return True
        device = getattr(value, "device", None)  # a tensor: .to(other) takes its device
        if getattr(device, "type", None) == "cpu":
            return True
    return False


def wrap_counted(original: Any, *, call: str | Callable[[], str], applies: Callable[[tuple, dict], bool],
                 target: Callable[[tuple], Any], counted_here: Callable[[], bool] | None = None) -> Any:
    """``original`` counted as a host-blocking call ``call`` of the user's line where
    ``applies(args, kwargs)``: timed, noted per source line and marked by a range; passed
    through as it is outside the window, from library code, where it does not apply, and
    for a CPU tensor where the job runs on a GPU (reading a host tensor waits for nothing).
    ``call`` may be a function naming the call as the run stands; ``counted_here()`` False:
    only the range is kept, the call is not noted (what it was is read from the records)."""

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        # Outside the window nothing records: a per-sample loop's int(t) would pay the
        # wrapper's few microseconds for a count no table reads. The cheapest test first.
        active = base.ACTIVE
        if active is None or not active.recorder.records_now():
            return original(*args, **kwargs)
        collector = base.acting()
        if collector is None:
            return original(*args, **kwargs)
        value = target(args)
        if collector.on_gpu and getattr(value, "is_cpu", False) is True:
            return original(*args, **kwargs)
        caller = sys._getframe(1)
        if collector.is_library_frame(caller) or not applies(args, kwargs):
            return original(*args, **kwargs)
        name = call if isinstance(call, str) else call()
        start = time.perf_counter_ns()
        try:
            # The range carries the calling line into the trace: the importer gives the
            # ops inside it (aten::item, aten::_local_scalar_dense...) this line as their
            # call stack, since torch's Python frames only know where functions begin.
            with collector.syncs.range(name, caller):
                return original(*args, **kwargs)
        finally:
            if counted_here is None or counted_here():
                collector.syncs.note(name, value, caller, time.perf_counter_ns() - start)

    return counted


def _always(args: tuple, kwargs: dict) -> bool:
    return True


def _first(args: tuple) -> Any:
    return args[0] if args else None


def _none(args: tuple) -> Any:
    return None


def _wrap_host_sync(original: Any, *, call: str, method: str) -> Any:
    """A Tensor method that reads its data on the host (``.to`` only towards the CPU), or a
    ``synchronize`` (``method`` empty: no tensor to note the device of)."""
    return wrap_counted(original, call=call, applies=copies_to_host if method == "to" else _always,
                        target=_first if method else _none)
