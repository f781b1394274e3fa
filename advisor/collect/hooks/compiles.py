"""torch.compile's compilations in a profiled run: when each ran, in which step, how long.

A compiled model pays for its compilation once (Dynamo tracing, AOTAutograd, Inductor's
code generation, Triton's autotuning), usually in its first steps, and then runs compiled
code. The report must say which steps compiled and must not judge them as steady steps.
Dynamo announces each compilation to the callbacks registered with
``torch._dynamo.callback.callback_handler`` (start and end, with a compile id from torch
2.6 on); this hook registers there once the script first calls ``torch.compile`` (a script
that never compiles never imports Dynamo for advisor's sake), keeps each compilation's
time and step, and marks it with a range ``advisor::compile 0/0`` on the timeline.
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

from advisor.collect.hooks import base
from advisor.collect.hooks.collection import HostCollection
from advisor.collect.hooks.recorder import Recorder

COMPILE_RANGE_PREFIX = "advisor::compile "
MAX_COMPILES = 1000  # a run that recompiles without end keeps its first ones


class Compiles:
    """The run's compilations, from Dynamo's own start and end callbacks."""

    def __init__(self, torch: Any, recorder: Recorder, open_step: Callable[[], int | None]):
        self._torch = torch
        self._recorder = recorder
        self._open_step = open_step
        self._patches: base.Patches | None = None
        self._registered = False
        self._open: list[tuple[dict[str, Any], Any]] = []
        self.compiles: list[dict[str, Any]] = []

    def install(self, patches: base.Patches) -> None:
        self._patches = patches
        if "torch._dynamo" in sys.modules:  # the script's imports compiled something already
            self._register()
        if hasattr(self._torch, "compile"):
            patches.patch(self._torch, "compile", self._wrap_compile)

    def _wrap_compile(self, original: Any) -> Any:
        @functools.wraps(original)
        def compile(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not self._registered and base.ACTIVE is not None:
                self._register()
            return result

        return compile

    def _register(self) -> None:
        try:
            handler = importlib.import_module("torch._dynamo.callback").callback_handler
            handler.register_start_callback(self._started)
            handler.register_end_callback(self._ended)
        except Exception:  # a torch without the callbacks: compilations go unmarked
            return
        self._registered = True
        assert self._patches is not None

        def remove() -> None:
            for remove_one, callback in ((handler.remove_start_callback, self._started),
                                         (handler.remove_end_callback, self._ended)):
                try:
                    remove_one(callback)
                except (ValueError, AttributeError):
                    pass

        self._patches.on_undo(remove)

    def _started(self, *args: Any) -> None:
        # Dynamo calls this with CallbackArgs (torch 2.6 on) or with nothing (before).
        if base.ACTIVE is None or len(self.compiles) + len(self._open) >= MAX_COMPILES:
            return
        facts = getattr(args[0], "__dict__", {}) if args else {}
        compile_id = str(facts.get("compile_id", "")) or f"#{len(self.compiles) + len(self._open)}"
        trigger = getattr(facts.get("callback_trigger"), "name", "")
        entry = {"compile_id": compile_id, "trigger": trigger.lower(), "step": self._open_step(),
                 "start_ns": time.time_ns(), "duration_ns": 0}
        marked = self._recorder.reported_range(f"{COMPILE_RANGE_PREFIX}{compile_id}")
        try:
            marked.__enter__()
        except Exception:
            marked = None
        self._open.append((entry, marked))

    def _ended(self, *args: Any) -> None:
        if not self._open:
            return
        entry, marked = self._open.pop()
        entry["duration_ns"] = time.time_ns() - entry["start_ns"]
        if marked is not None:
            try:
                marked.__exit__(None, None, None)
            except Exception:
                pass
        self.compiles.append(entry)

    def fill(self, result: HostCollection) -> None:
        result.compiles = sorted(self.compiles, key=lambda c: c["start_ns"])
