"""What every hook shares: the one acting collector, the patches it made, the protocol.

Only one host collector runs in a process at a time (:func:`activate`). The wrappers and
hooks are module-level functions that look it up each call (:func:`acting`), so a hook left
behind by a failed uninstall does nothing once its collector is gone.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from advisor.collect.hooks.collection import HostCollection

# The folder of the hooks' own files: a frame or warning from here is advisor's, not the user's.
HOOKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

class Collector(Protocol):
    """What a hook reaches through the acting collector: its sibling concerns, its clock,
    and whose thread and frame it is (advisor.collect.torch_hooks.HostCollector is the one;
    named here by what it offers, so this module, which every hook imports, imports none of
    them back)."""

    clock: Any
    recorder: Any
    loaders: Any
    steps: Any
    syncs: Any
    children: Any
    on_gpu: bool

    def ours(self) -> bool: ...

    def hand_over(self, frame: Any) -> None: ...

    def is_library_frame(self, frame: Any) -> bool: ...


ACTIVE: Collector | None = None
"""The running collector, read by the wrappers' cheapest test (``ACTIVE is None``)."""
_FORKED = False


def _in_forked_child() -> None:
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)


def _never() -> bool:
    return False


# Set at install to a test that torch.compile (dynamo) folds to True while it traces:
# it must be the first thing a hook checks, before any global it would guard on.
_IN_TRACED_CODE: Any = _never


def in_traced_code() -> bool:
    """Whether torch.compile or torch.jit.trace is tracing the code being run."""
    return _IN_TRACED_CODE()


def activate(collector: Collector, torch: Any) -> None:
    """Make ``collector`` the one the hooks report to (RuntimeError if another runs)."""
    global ACTIVE, _IN_TRACED_CODE
    if ACTIVE is not None:
        raise RuntimeError("another advisor collector is already running in this process")
    _IN_TRACED_CODE = _traced_code_test(torch)
    ACTIVE = collector


def deactivate() -> None:
    global ACTIVE
    ACTIVE = None


def owned_here(thread: int) -> bool:
    """Whether the caller runs on ``thread`` of the collector's own process. (A forked child,
    a DataLoader worker, sets _FORKED; reading it is cheaper than os.getpid(), a system
    call, on every hook.)"""
    return not _FORKED and threading.get_ident() == thread


def hide_from_dynamo(*functions: Any) -> bool:
    """Mark ``functions``, and all they call, as code torch.compile runs as it is and never
    compiles as a frame of its own. A hook torch calls around a compiled module (a global
    forward hook of the compiled module's own call), or a signal handler that runs while a
    compiled function's frame hook is set, would otherwise be compiled as the user's code:
    an extra compilation the job does not make, and with ``fullgraph=True`` a failed call.
    Inside a traced forward torch inlines the hooks as before (they do nothing there, see
    acting). Done through the frame hook's own per-code setting, where torch is loaded;
    False where it is not (or has no such setting), and the functions are left as they are."""
    frames = sys.modules.get("torch._C._dynamo.eval_frame")
    if frames is None:
        return False
    try:
        skip = frames._FrameAction.SKIP
        for function in functions:
            frames.set_code_exec_strategy(function.__code__, frames._FrameExecStrategy(skip, skip))
    except Exception:  # noqa: BLE001  (a private interface that may change; the hooks run on)
        return False
    return True


def acting() -> Collector | None:
    """The collector a hook should report to: none while torch.compile or torch.jit.trace
    traces the code the hook is in (the hook must stay invisible to them, or a
    ``fullgraph=True`` compile fails on it), on another thread or in a forked worker."""
    if _IN_TRACED_CODE():
        return None
    collector = ACTIVE
    if collector is None or not collector.ours():
        return None
    return collector


def _traced_code_test(torch: Any) -> Any:
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    if is_compiling is None:  # torch before 2.3
        is_compiling = getattr(getattr(torch, "_dynamo", None), "is_compiling", _never)
    is_tracing = torch._C._get_tracing_state

    def traced() -> bool:
        return is_compiling() or is_tracing() is not None

    return traced


def on_stack(target: Any) -> bool:
    """Whether the frame ``target`` is on the caller's stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


class Patches:
    """Every change the hooks made to torch and the standard library, undone together."""

    def __init__(self) -> None:
        self._undo: list[Any] = []

    def patch(self, owner: Any, name: str, wrap: Any, *, only_if_unchanged: bool = False) -> None:
        """Replace ``owner.name`` by ``wrap(original)`` until :meth:`undo`; with
        ``only_if_unchanged``, leave it at undo if the script replaced it meanwhile."""
        had_own = name in vars(owner)
        original = getattr(owner, name)
        wrapped = wrap(original)
        setattr(owner, name, wrapped)

        def undo() -> None:
            if only_if_unchanged and getattr(owner, name, None) is not wrapped:
                return
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def ignore_warning(self, message: str) -> None:
        """Ignore UserWarnings matching ``message`` until :meth:`undo`."""
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
        entry = warnings.filters[0]

        def undo() -> None:
            if entry in warnings.filters:
                warnings.filters.remove(entry)
                getattr(warnings, "_filters_mutated", lambda: None)()

        self._undo.append(undo)

    def on_undo(self, undo: Any) -> None:
        """Call ``undo()`` at :meth:`undo` (a hook handle's ``remove``)."""
        self._undo.append(undo)

    def undo(self) -> None:
        """Undo every change, last first."""
        while self._undo:
            self._undo.pop()()


def wrap_showwarning(original: Any) -> Any:
    """A warning raised in a call the hooks wrap (torch's C code warns about the Python
    frame that called it, a library warns with stacklevel=2) would name a file of the
    hooks; show it at the user's line that made the call instead, as it would be without
    advisor."""

    @functools.wraps(original)
    def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                    line: Any = None) -> Any:
        if filename.startswith(HOOKS_DIR):
            frame = sys._getframe(1)
            while frame is not None and not frame.f_code.co_filename.startswith(HOOKS_DIR):
                frame = frame.f_back
            while frame is not None and frame.f_code.co_filename.startswith(HOOKS_DIR):
                frame = frame.f_back
            if frame is not None:
                filename, lineno, line = frame.f_code.co_filename, frame.f_lineno, None
        return original(message, category, filename, lineno, file, line)

    return showwarning


class Hooks(Protocol):
    """One concern of the host collector."""

    def install(self, patches: Patches) -> None:
        """Put this concern's hooks in place, each recorded in ``patches``."""

    def fill(self, result: "HostCollection") -> None:
        """Write what this concern found so far into ``result``."""
