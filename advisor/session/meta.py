"""What a session knows besides its events: its source, the collector and what it could
not measure, the devices, the job's ranks, the steps the collector timed. Pydantic models
only (no pandas): a report, or a command that reads a session's metadata alone, needs no
more.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticSerializationError

from advisor.session.layout import SESSION_FORMAT

__all__ = ["FORWARD_NO_GRAD", "CollectionGap", "CollectorCost", "CollectorInfo", "DeviceInfo", "DistributedInfo", "SessionMeta",
           "TimedStep"]


class DeviceInfo(BaseModel):
    """A device the session ran on, with what is known of it."""

    id: int = Field(description="Device ordinal as the trace numbers it; -1 for the host CPU.")
    kind: str = Field(description="'gpu' or 'cpu'.")
    name: str = ""
    vendor: str = Field(default="", description="'nvidia' or 'amd' where the source says (ROCm traces: a "
                                                "64-wide wavefront, an AMD name); '' where it does not.")
    architecture: str = Field(default="", description="The architecture as its vendor names it ('gfx942 (CDNA 3)', "
                                                      "'hopper (sm 9.0)'), from the knowledge base's profile of "
                                                      "the device; '' where none matched.")
    compute_capability: str | None = Field(default=None, description="NVIDIA's compute capability; on AMD the GFXIP "
                                                                     "version ROCm reports in the same fields.")
    sm_count: int | None = Field(default=None, description="Streaming multiprocessors; on AMD, compute units.")
    total_memory_bytes: int | None = None
    memory_bandwidth_gbps: float | None = Field(default=None, description="Peak, where known.")
    clock_mhz: float | None = None
    l2_bytes: int | None = None
    peak_flops: dict[str, float] = Field(
        default_factory=dict, description="Peak FLOP/s by dtype (fp32, bf16...), where measured (advisor calibrate)."
    )
    properties: dict[str, Any] = Field(default_factory=dict, description="The source's raw record.")


class CollectionGap(BaseModel):
    """Something the collection did not measure, or measured only in part, and why."""

    what: str = Field(description="What was missed: 'host profile', 'steps', 'GPU', 'child processes', "
                                  "'trace events'...")
    why: str = Field(description="Why, in one line, with what to do about it where there is something.")
    incomplete: bool = Field(default=True, description="True where the profile misses part of the job that ran "
                                                       "(never a clean bill of health); False where the thing "
                                                       "was not there to measure (a CPU-only machine's GPU).")


FORWARD_NO_GRAD = "Forward without grad"  # TimedStep.calls: a forward called with autograd off (evaluation)


class TimedStep(BaseModel):
    """One step as the collector's own clock saw it, whether the profiler recorded it or not."""

    step: int
    start_ns: int = Field(description="When the step began, on the session's clock.")
    duration_ns: int
    recorded: bool = Field(description="Whether the profiler was recording the step (the window's steps).")
    partial: bool = Field(default=False, description="Cut off (the run ended, the loop was left by a break).")
    phases: dict[str, int] = Field(default_factory=dict, description="ns per phase (Dataloader, Forward, Backward, "
                                                                     "Optimization); the rest is Others.")
    own_ns: int = Field(default=0, description="The collector's own time in the step (its hooks' code), ns: part of "
                                               "duration_ns that the job without advisor does not spend.")
    cpu_ns: int = Field(default=0, description="The main thread's CPU time in the step, ns (0: not measured): "
                                               "unlike duration_ns, it does not grow while the thread waits for a core.")
    calls: dict[str, int] = Field(default_factory=dict, description="Times each phase opened in the step; a forward "
                                                                    "with autograd off counts as FORWARD_NO_GRAD.")
    process_cpu_ns: int = Field(default=0, description="The whole process's CPU time in the step, all its threads "
                                                       "(torch's operator threads too), ns (0: not measured).")


class CollectorCost(BaseModel):
    """What the collector itself cost the job, as measured in the run: the diagnosis reasons
    at the job's own pace, so what recording added must be known, not guessed."""

    op_recorder: str = Field(default="", description="How ops were recorded: 'native' (torch's RecordFunction "
                                                     "callbacks in C++), 'python' (a dispatch mode), '' (none).")
    ops_recorded: int = 0
    ops_dropped: int = Field(default=0, description="Ops past the recorder's bound, counted and not kept.")
    per_op_ns: float | None = Field(default=None, description="What recording added to one cheap op, calibrated "
                                                              "in the run (a burst with the recorder off and on).")
    plain_ns_per_op: float | None = Field(default=None, description="The same op unrecorded, in that burst.")
    spread_ns_per_op: float | None = Field(default=None, description="The unrecorded bursts' spread: the noise "
                                                                     "the per-op cost is measured against.")


class CollectorInfo(BaseModel):
    """What produced the session and what it could not measure."""

    name: str = Field(description="e.g. 'kineto-import', 'host' (torch.profiler CPU), 'cupti'.")
    version: str = ""
    activities: list[str] = Field(default_factory=list)
    gpu_measured: bool = False
    dropped_records: int = 0
    overhead_ns: int = 0
    notes: list[str] = Field(default_factory=list, description="One line each: what was not measured and why.")
    gaps: list[CollectionGap] = Field(default_factory=list, description="What the collection missed, structured: "
                                                                        "the profile-incomplete rule reads them.")
    cost: CollectorCost | None = Field(default=None, description="What the collector cost the job, measured in "
                                                                 "the run (advisor's own collectors).")


class DistributedInfo(BaseModel):
    backend: str = ""
    rank: int = 0
    world_size: int = 1
    raw: dict[str, Any] = Field(default_factory=dict)


class SessionMeta(BaseModel):
    """Everything about a session that is not an event."""

    format: str = SESSION_FORMAT
    source: str = Field(description="The trace file or script the session came from.")
    source_format: str = Field(description="'kineto' (PyTorch profiler JSON), 'script', ...")
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    command: list[str] | None = Field(default=None, description="The script and its arguments, where one ran.")
    exit_code: int | None = Field(default=None, description="The script's own exit code, where one ran.")
    script_error: str | None = Field(default=None, description="How the script ended, if not normally.")
    collector: CollectorInfo
    devices: list[DeviceInfo] = Field(default_factory=list)
    distributed: DistributedInfo | None = None
    base_time_ns: int = 0
    target_gpu: str | None = Field(
        default=None, description="Knowledge-base id of the GPU to judge the session against (--gpu), if not its own."
    )
    trace_metadata: dict[str, Any] = Field(default_factory=dict)
    timed_steps: list[TimedStep] = Field(default_factory=list, description="Every step the collector timed, "
                                                                           "recorded or not (a script's run).")

    @field_validator("source")
    @classmethod
    def _printable_source(cls, value: str) -> str:
        # A file name need not be UTF-8; the session is written as JSON all the same.
        from advisor.units import valid_text

        return valid_text(value)

    def json_text(self, *, indent: int | None = None) -> str:
        """The metadata as JSON text, whatever its strings hold: a lone surrogate (a JSON
        escape in a trace's own metadata, a file name that is not UTF-8 set after
        validation) is written as U+FFFD, where pydantic would refuse the whole."""
        try:
            return self.model_dump_json(indent=indent)
        except PydanticSerializationError:
            return json.dumps(_valid_strings(self.model_dump(mode="json")), indent=indent, ensure_ascii=False)


def _valid_strings(value: Any) -> Any:
    """``value`` (JSON data) with every string, keys included, made valid Unicode."""
    from advisor.units import valid_text

    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_text(str(k)): _valid_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_strings(v) for v in value]
    return value
