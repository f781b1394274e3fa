"""Collectors: turn a running program into a profile.

``run_script`` runs a user's script as ``python script.py args`` would, under
torch.profiler on the host (CPU activities) with step and phase marks added by hooks, and
returns a ``ScriptRun`` naming the exported Chrome trace.
"""

from __future__ import annotations

from advisor.collect.script import ScriptRun, run_script
from advisor.collect.session import CollectedRun, collect_script

__all__ = ["CollectedRun", "ScriptRun", "collect_script", "run_script"]
