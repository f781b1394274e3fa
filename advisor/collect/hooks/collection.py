"""What the host collector records, and the names it records it under.

The step and phase ranges land in the exported Chrome trace as ``user_annotation``
events under these names; :class:`HostCollection` is what the hooks found beside the
trace, written into its top-level ``advisor`` object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STEP_PREFIX = "ProfilerStep#"
DATALOADER = "advisor::Dataloader"
FORWARD = "advisor::Forward"
BACKWARD = "advisor::Backward"
OPTIMIZATION = "advisor::Optimization"
PHASE_NAMES = (DATALOADER, FORWARD, BACKWARD, OPTIMIZATION)
PHASE_LABELS = {DATALOADER: "Dataloader", FORWARD: "Forward", BACKWARD: "Backward", OPTIMIZATION: "Optimization"}
SYNC_RANGE_PREFIX = "advisor::sync "


@dataclass
class HostCollection:
    """What the hooks found about the run, beside the trace itself."""

    step_source: str | None = None
    steps: int = 0
    partial_steps: list[int] = field(default_factory=list)
    batch_size: int | None = None
    batch_size_source: str | None = None
    host_syncs: list[dict[str, Any]] = field(default_factory=list)
    """HostSyncSite.as_dict() rows, most time first."""
    notes: list[str] = field(default_factory=list)
    step_times: list[dict[str, Any]] = field(default_factory=list)
    """Every step the clock timed (StepClock.as_records()), recorded by the profiler or not."""
    recording: dict[str, Any] = field(default_factory=dict)
    """What the profiler recorded: the window asked for, the steps recorded, where and why
    recording stopped early, the trace parts written."""
    loaders: list[dict[str, Any]] = field(default_factory=list)
    """One entry per DataLoader the script read: its dataset and settings, and the time
    its reads, fetches and collation took in this process."""
    children: list[dict[str, Any]] = field(default_factory=list)
    """Processes the script started that are not DataLoader workers (torch.multiprocessing
    spawn, multiprocessing.Process): advisor's collector does not run in them."""
    library_roots: list[str] = field(default_factory=list)
    """Folders of installed code (the standard library, site-packages, torch, advisor): a
    stack frame outside them is the user's."""
    compiles: list[dict[str, Any]] = field(default_factory=list)
    """torch.compile's compilations (advisor.collect.hooks.compiles): compile_id, trigger,
    step (None before the first), start_ns and duration_ns on time.time_ns()."""
    forward_sites: dict[str, int] = field(default_factory=dict)
    """The user's lines that called the model ('file:line' -> calls, over the first forward
    calls of the run): where a per-sample loop calls it."""
    cpu_wait: dict[str, Any] = field(default_factory=dict)
    """The script's main thread from the collector's start: ``wall_ns`` and ``run_delay_ns``
    (the time it was ready to run but waited for a core; empty where not measured)."""

    def metadata(self) -> dict[str, Any]:
        """The ``advisor`` object written into the trace's top level."""
        return {
            "collector": "advisor-host",
            "step_source": self.step_source,
            "steps": self.steps,
            "partial_steps": list(self.partial_steps),
            "batch_size": self.batch_size,
            "batch_size_source": self.batch_size_source,
            "phases": list(PHASE_NAMES),
            "host_syncs": list(self.host_syncs),
            "step_times": list(self.step_times),
            "recording": dict(self.recording),
            "loaders": list(self.loaders),
            "children": list(self.children),
            "library_roots": list(self.library_roots),
            "forward_sites": dict(self.forward_sites),
            "cpu_wait": dict(self.cpu_wait),
            "compiles": list(self.compiles),
        }
