"""A command that runs a user's script, started so that it can be ended whole.

verify's trials (advisor.verify.run) and the MCP server's ``verify`` (advisor.api.mcp_server)
start a process that runs the user's script. The script may start helpers of its own (a
DataLoader's workers, a logger, ``subprocess.Popen`` of anything) that outlive it and hold
its output open. So the command starts in a process group and session of its own, with its
output going to files, never to pipes whose end a helper could hold; it is waited for by
its own exit, and then ``end`` ends what is left of it: its process group, the groups of
the processes it started, and each of them, asked with SIGTERM first and, after a grace
period, killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["end", "start"]

_POLL_S = 0.05


def start(command: Sequence[str], *, stdout: IO[Any] | int, stderr: IO[Any] | int,
          env: dict[str, str] | None = None, parent_death: int = signal.SIGKILL) -> subprocess.Popen:
    """``command`` in a session of its own (a Ctrl-C at the terminal reaches advisor, which
    ends it), reading nothing: a script that reads its input gets end of file. On Linux it
    gets ``parent_death`` when the process that started it dies, however it dies (a
    SIGKILLed MCP server runs no clean-up of its own): SIGTERM for a command that ends its
    own children when asked (advisor verify), SIGKILL for a script."""
    return subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                            start_new_session=True, preexec_fn=_dies_with_parent(parent_death))


def _dies_with_parent(signum: int) -> Any:
    """A preexec function that asks Linux to send ``signum`` to the child when its parent
    dies (prctl PR_SET_PDEATHSIG); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signum)

    return arm


_PR_SET_PDEATHSIG = 1


def end(process: subprocess.Popen, *, grace_s: float) -> None:
    """End ``process`` and whatever it started that is still running: SIGTERM to each, then
    SIGKILL to what is left after ``grace_s`` seconds. A Ctrl-C meanwhile ends them at once."""
    known = _descendants(process)
    try:
        _signal_all(process, known, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not _all_gone(process, known):
            time.sleep(_POLL_S)
    finally:
        # Those the process started while being asked to stop are ended too.
        _signal_all(process, known + _descendants(process), signal.SIGKILL)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # not ours to wait for any longer (a process stuck in the kernel)
            pass


def _descendants(process: subprocess.Popen) -> list[Any]:
    """The processes ``process`` started, theirs too (psutil.Process objects, which refuse to
    signal a process whose id was reused), while it runs. Once it is waited for, its id may
    be another process's: what it left is found by its process group instead."""
    if process.poll() is not None:
        return []
    try:
        import psutil

        return psutil.Process(process.pid).children(recursive=True)
    except Exception:  # noqa: BLE001  (gone already, or psutil missing: its process group is still ended)
        return []


def _groups(process: subprocess.Popen, known: list[Any]) -> set[int]:
    groups = {process.pid}  # the session's own group: its id is the process's, alive or not
    for child in known:
        try:
            groups.add(os.getpgid(child.pid))
        except OSError:
            pass
    groups.discard(os.getpgrp())  # never advisor's own
    return groups


def _signal_all(process: subprocess.Popen, known: list[Any], signum: int) -> None:
    """``signum`` once to each process: by its group, or alone where it left the group
    (a second SIGTERM would stop advisor's own reading back of what it collected)."""
    groups = _groups(process, known)
    for group in groups:
        try:
            os.killpg(group, signum)
        except OSError:  # no process left in it, or not ours
            pass
    for child in known:
        try:
            if os.getpgid(child.pid) not in groups:
                child.send_signal(signum)
        except Exception:  # noqa: BLE001  (gone, or not ours: OSError, psutil.NoSuchProcess, AccessDenied)
            pass


def _all_gone(process: subprocess.Popen, known: list[Any]) -> bool:
    if process.poll() is None:
        return False
    for group in _groups(process, known):
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            continue
        except OSError:
            continue
        return False
    return not any(_running(child) for child in known)


def _running(child: Any) -> bool:
    try:
        return bool(child.is_running()) and child.status() != "zombie"
    except Exception:  # noqa: BLE001
        return False
