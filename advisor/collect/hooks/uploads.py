"""Copies to a GPU from pageable host memory, counted as host-blocking calls.

The driver stages such a copy through a pinned buffer and the host waits for it, even with
``non_blocking=True``: ``tensor.to("cuda")`` / ``tensor.cuda()`` of an unpinned CPU tensor,
from the user's line, is counted like ``.item()`` (advisor.collect.hooks.syncs) as
``pageable copy to device``. Without a GPU nothing is uploaded and nothing is wrapped.
Where the GPU collector records, no call asks ``is_pinned()``: every upload from the
user's line gets its range, and the copy's own record says whether it read pageable memory.
"""

from __future__ import annotations

import functools
from typing import Any

from advisor.collect.hooks import base
from advisor.collect.hooks.collection import HostCollection
from advisor.collect.hooks.syncs import wrap_counted


class Uploads:
    """Wraps ``Tensor.to`` and ``Tensor.cuda`` on a machine with a GPU."""

    def __init__(self, torch: Any):
        self._torch = torch

    def install(self, patches: base.Patches) -> None:
        if self._torch.cuda.is_available():  # no upload without a GPU: keep CPU runs' calls untouched
            for method in ("to", "cuda"):
                patches.patch(self._torch.Tensor, method, functools.partial(_wrap_upload, method=method))

    def fill(self, result: HostCollection) -> None:
        """The uploads are host_syncs sites (advisor.collect.hooks.syncs fills them)."""


def pageable_upload(args: tuple, kwargs: dict) -> bool:
    """Whether ``tensor.to(...)`` / ``tensor.cuda()`` copies unpinned host memory to a GPU:
    the driver stages such a copy through a pinned buffer and the host waits for it, even
    with non_blocking=True."""
    if not host_to_device(args, kwargs):
        return False
    try:
        return not args[0].is_pinned()
    except Exception:  # is_pinned() needs a CUDA runtime; without one nothing is uploaded
        return False


def host_to_device(args: tuple, kwargs: dict) -> bool:
    """Whether ``tensor.to(...)`` copies a host tensor to a GPU, pinned or not."""
    tensor = args[0] if args else None
    if getattr(getattr(tensor, "device", None), "type", None) != "cpu":
        return False
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, str) and value.split(":")[0] == "cuda":
            return True
        if getattr(value, "type", None) == "cuda":  # torch.device
            return True
        if getattr(getattr(value, "device", None), "type", None) == "cuda":  # a tensor
            return True
    return False


def _gpu_collector_records() -> bool:
    """Whether the GPU collector records the run: its copy records then say which uploads
    read pageable memory, so no call need ask ``is_pinned()`` (an op and a CUDA call of its
    own, each time)."""
    active = base.ACTIVE
    return active is not None and active.recorder.listener is not None


def _wrap_upload(original: Any, *, method: str) -> Any:
    """``Tensor.to`` / ``Tensor.cuda``: host-to-device copies from pageable memory are
    host-blocking calls of the user's line; everything else passes through. (``.to`` towards
    the CPU is the read-back HOST_SYNC_METHODS covers; this wrapper sits outside it.) Where
    the GPU collector records, every upload from the user's line gets its range (its copy
    then carries the line) and the copy record says whether it was pageable."""

    def applies(args: tuple, kwargs: dict) -> bool:
        if _gpu_collector_records():
            return host_to_device(args, kwargs) or (method == "cuda" and bool(args)
                                                    and host_to_device((args[0], "cuda"), {}))
        return pageable_upload(args, kwargs) or (method == "cuda" and bool(args)
                                                 and pageable_upload((args[0], "cuda"), {}))

    def call() -> str:
        return "copy to device" if _gpu_collector_records() else "pageable copy to device"

    return wrap_counted(original, call=call, applies=applies, target=lambda args: None,
                        counted_here=lambda: not _gpu_collector_records())
