"""Whether a command a user gives advisor is a torchrun launch (advisor.job.launch runs
it). Apart from that module so that `advisor diagnose trace.json` learns its target is
no launcher without importing what running one takes (subprocess, the rank's entry point):
it asks before it reads anything."""

from __future__ import annotations

from pathlib import Path

__all__ = ["LAUNCHER_MODULES", "is_launcher"]

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def is_launcher(target: str, script_args: list[str]) -> bool:
    """Whether ``target script_args`` is a torchrun launch."""
    name = Path(target).name
    if name == "torchrun":
        return True
    return name.startswith("python") and len(script_args) >= 2 and script_args[0] == "-m" \
        and script_args[1] in LAUNCHER_MODULES
