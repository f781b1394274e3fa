"""The user's own ranges: ``advisor.RecordEvent(name)`` and ``advisor.region(name)``.

A range marks a stretch of the user's code by name: a context manager, a decorator, or
``begin()`` / ``end()`` where a ``with`` block does not fit. Under the hood it is a
``torch.autograd.profiler.record_function`` range, so whatever profiles the process sees it
as a ``user_annotation`` event (advisor's Profiler, ``advisor diagnose``, torch.profiler):
the UserDefined table and the timeline show it. On a machine with CUDA it is also an NVTX
range (Nsight Systems, and the CUPTI collector where NVTX is injected). While one of
advisor's collectors runs with the CUPTI collector listening, the range is reported to it
too, so it lands on the GPU collector's timeline.

Outside any profiler the cost is that of an idle ``record_function`` (a few microseconds);
without torch a range does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["RecordEvent", "region"]

F = TypeVar("F", bound=Callable[..., Any])

_UNSET: Any = object()
_torch: Any = _UNSET
_nvtx: Any = None
_hooks: Any = None


def _modules() -> tuple[Any, Any]:
    """torch (None where it cannot be imported) and torch.cuda.nvtx (None without CUDA),
    looked up once: a range is entered on hot paths. (Imported here, not at the top, so
    that ``import advisor`` stays light.)"""
    global _torch, _nvtx, _hooks
    if _torch is _UNSET:
        from advisor.collect import torch_hooks  # noqa: PLC0415
        from advisor.collect.hooks import base  # noqa: PLC0415

        _hooks = base
        torch, _why = torch_hooks.import_torch()
        _torch = torch
        try:
            if torch is not None and torch.cuda.is_available():
                _nvtx = torch.cuda.nvtx
        except Exception:  # a broken CUDA install: ranges still go to the profilers
            _nvtx = None
    return _torch, _nvtx


class RecordEvent:
    """A named range of the user's code, shown in the UserDefined table and the timeline.

        with advisor.RecordEvent("augment"):
            batch = augment(batch)

        @advisor.RecordEvent("evaluate")
        def evaluate(model): ...

        event = advisor.RecordEvent("io")
        event.begin()
        ...
        event.end()

    One RecordEvent object is one range at a time (``begin`` twice without ``end`` raises);
    as a decorator every call opens a range of its own, so recursion and threads are safe.
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise ValueError("RecordEvent needs a non-empty name")
        self.name = name
        self._handle: Any = None
        self._nvtx = False

    def __repr__(self) -> str:
        return f"RecordEvent({self.name!r})"

    def begin(self) -> None:
        """Open the range."""
        if self._handle is not None:
            raise RuntimeError(f"RecordEvent({self.name!r}) is already open; end() it first")
        torch, nvtx = _modules()
        if torch is None:
            self._handle = False  # nothing to record into, but begin/end still pair up
            return
        collector = _hooks.ACTIVE
        if collector is not None and collector.ours():
            # A collector with the GPU collector listening hears of the range too.
            handle: Any = collector.recorder.reported_range(self.name)
        else:
            handle = torch.autograd.profiler.record_function(self.name)
        handle.__enter__()
        self._handle = handle
        if nvtx is not None:
            nvtx.range_push(self.name)
            self._nvtx = True

    def end(self) -> None:
        """Close the range (a no-op where it is not open)."""
        handle, self._handle = self._handle, None
        if self._nvtx:
            self._nvtx = False
            _modules()[1].range_pop()
        if handle:
            handle.__exit__(None, None, None)

    def __enter__(self) -> RecordEvent:
        self.begin()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end()

    def __call__(self, func: F) -> F:
        name = self.name

        @functools.wraps(func)
        def ranged(*args: Any, **kwargs: Any) -> Any:
            with RecordEvent(name):
                return func(*args, **kwargs)

        return ranged  # type: ignore[return-value]


def region(name: str) -> RecordEvent:
    """``advisor.region("name")``: the same as ``RecordEvent("name")``, as a context
    manager or a decorator."""
    return RecordEvent(name)
