"""How busy the machine was while the run was recorded: the share of its time the
script's main thread was ready to run but waited for a CPU core (the collector reads it
from the kernel's scheduler statistics, ``cpu_wait`` in advisor's metadata).

On a busy machine every figure in milliseconds stretches with the load while shares of
the step hold: a finding's saving is then read as a share, its milliseconds said to be
this run's (``busy_share``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUSY_SHARE", "busy_share", "waited_share"]

BUSY_SHARE = 0.10  # the main thread waited for a core this share of its run, or more: a busy machine


def waited_share(trace_metadata: dict[str, Any]) -> float | None:
    """The share of its run the script's main thread waited for a core (None: not measured)."""
    facts = trace_metadata.get("advisor") if isinstance(trace_metadata, dict) else None
    wait = facts.get("cpu_wait") if isinstance(facts, dict) else None
    if not isinstance(wait, dict):
        return None
    wall, delay = wait.get("wall_ns"), wait.get("run_delay_ns")
    if not isinstance(wall, (int, float)) or not isinstance(delay, (int, float)) or wall <= 0 or delay < 0:
        return None
    return min(float(delay) / float(wall), 1.0)


def busy_share(trace_metadata: dict[str, Any]) -> float | None:
    """The waited share where the machine was busy (at least BUSY_SHARE), else None."""
    share = waited_share(trace_metadata)
    return share if share is not None and share >= BUSY_SHARE else None
