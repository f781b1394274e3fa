"""Copies to a GPU from pageable host memory, counted as host-blocking calls.

The driver stages such a copy through a pinned buffer and the host waits for it, even with
``non_blocking=True``: ``tensor.to("cuda")`` / ``tensor.cuda()`` of an unpinned CPU tensor,
from the user's line, is counted like ``.item()`` (advisor.collect.hooks.syncs) as
``pageable copy to device``. Without a GPU nothing is uploaded and nothing is wrapped.
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
    tensor = args[0] if args else None
    if getattr(getattr(tensor, "device", None), "type", None) != "cpu":
        return False
    try:
        if tensor.is_pinned():
            return False
    except Exception:  # is_pinned() needs a CUDA runtime; without one nothing is uploaded
        return False
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, str) and value.split(":")[0] == "cuda":
            return True
        if getattr(value, "type", None) == "cuda":  # torch.device
            return True
        if getattr(getattr(value, "device", None), "type", None) == "cuda":  # a tensor
            return True
    return False


def _wrap_upload(original: Any, *, method: str) -> Any:
    """``Tensor.to`` / ``Tensor.cuda``: host-to-device copies from pageable memory are
    host-blocking calls of the user's line; everything else passes through. (``.to`` towards
    the CPU is the read-back HOST_SYNC_METHODS covers; this wrapper sits outside it.)"""

    def applies(args: tuple, kwargs: dict) -> bool:
        return pageable_upload(args, kwargs) or (method == "cuda" and bool(args)
                                                 and pageable_upload((args[0], "cuda"), {}))

    return wrap_counted(original, call="pageable copy to device", applies=applies,
                        target=lambda args: args[0] if args else None)
