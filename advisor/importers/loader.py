"""Turn a path a user gives into a Session: a saved session folder or a trace file.

``load(path)`` is the one entry point; it decides by what the path is, not by its name,
so a trace without the usual suffix still loads and a stray file gets one clear line. A
trace's Session is kept in the cache (advisor.importers.cache) for the next command on
the same file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from advisor.errors import SessionError, TraceError
from advisor.importers import cache
from advisor.importers.advisor_metadata import read_trace_metadata
from advisor.importers.kineto import (
    _takes_events,
    events_from_raw,
    open_trace,
    read_events,
    reading_notes,
    unlinked_gpu_events,
)
from advisor.importers.parts import read_in_parts
from advisor.importers.pages import give_back_freed
from advisor.paths import special_file
from advisor.session import is_session_dir, text
from advisor.session.attribute import attribute, name_matches
from advisor.session.calls import LAUNCH_CALLS
from advisor.units import valid_text

# The Session's models (pydantic) are imported where a Session is built, not here: a
# forked read (advisor.importers.ahead) runs read_kineto alone and need not wait for them.
if TYPE_CHECKING:
    import pandas as pd

    from advisor.session import Session

__all__ = ["load", "load_kineto", "read_kineto", "session_from"]


class Ahead(Protocol):
    """A read of a trace started ahead in a forked process (advisor.importers.ahead.Ahead,
    which calls this module's readers: named here by what it offers)."""

    path: Path

    def session(self, progress: Callable[..., None] | None = None) -> Session | None: ...

    def stop(self) -> None: ...


def load(path: str | Path, *, progress: Callable[[int, int], None] | None = None,
         ahead: Ahead | None = None, give_back: bool = False, processes: int = 1,
         use_cache: bool = True) -> Session:
    """A saved session folder or a PyTorch profiler / Kineto trace, as a Session.
    ``progress(done, total)`` hears of the bytes of a trace read so far. ``ahead``: the
    read of this trace already started in a forked process (advisor.importers.ahead).
    ``give_back``: the memory the read freed is given back to the system (a command's
    own process, advisor.importers.pages), not held through the tables. ``processes``: how
    many processes a large plain trace may be read by, this one included (the command's
    advisor.importers.forked.processes_allowed; 1: this one alone). ``use_cache``: a trace
    is taken from the session cache where it was kept, and kept there once read
    (advisor.importers.cache); False reads it afresh and keeps nothing."""
    target = Path(path)
    if not target.exists():
        raise TraceError(f"{target}: no such file or directory")
    special = special_file(target)
    if special is not None:
        raise TraceError(f"{target} is {special}, not a trace file or a session folder")
    if target.is_dir():
        if is_session_dir(target):
            from advisor.session import Session

            return Session.load(target)
        raise SessionError(f"{target} is a directory but not an advisor session (it has no session.json)")
    if not use_cache:
        session = _read(target, progress, ahead, processes)
        if give_back:
            give_back_freed()
        return session
    found = cache.cached(target)
    if found is not None:
        # The entry is the file's, whatever path reached it: the source is the one given now
        # (as valid text, as the metadata's validator makes it: model_copy does not validate).
        found.meta = found.meta.model_copy(update={"source": valid_text(str(target))})
        if ahead is not None:  # kept by another command since the read began
            ahead.stop()
        if progress is not None:
            size = target.stat().st_size
            progress(size, size)
        return found
    session = _read(target, progress, ahead, processes)
    if give_back:
        give_back_freed()
    cache.store(target, session)
    return session


def _read(target: Path, progress: Callable[..., None] | None, ahead: Ahead | None, processes: int) -> Session:
    """The trace's Session: from the forked read where one was started and came back, else
    read here."""
    if ahead is not None and ahead.path == target:
        session = ahead.session(progress if progress is None or _takes_events(progress)
                                else lambda done, total, events=None: progress(done, total))
        if session is not None:
            return session
    return load_kineto(target, progress=progress, processes=processes)


def _int_or(value: Any, default: int | None) -> int | None:
    """An integer field of the trace's metadata, or ``default`` where it is none (text,
    null, a float that is not whole): one damaged field must not lose the trace."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


def _vendor(name: str, warp_size: int | None) -> str:
    """Who made a GPU, from its deviceProperties record: AMD's wavefront is 64 wide on
    Instinct parts (ROCm fills the CUDA-named fields too, computeMajor 9 reading as
    Hopper's sm 9.0), NVIDIA's warp 32."""
    lowered = name.lower()
    if warp_size == 64 or lowered.startswith("amd") or "instinct" in lowered or "radeon" in lowered:
        return "amd"
    if warp_size == 32 or lowered.startswith(("nvidia", "tesla", "quadro")) or "geforce" in lowered:
        return "nvidia"
    return ""


def _device(record: dict[str, Any], gpu: int) -> dict[str, Any]:
    """A GPU's DeviceInfo fields from its deviceProperties record."""
    major, minor = _int_or(record.get("computeMajor"), None), _int_or(record.get("computeMinor"), None)
    name = str(record.get("name", ""))
    return {
        "id": gpu,
        "kind": "gpu",
        "name": name,
        "vendor": _vendor(name, _int_or(record.get("warpSize"), None)),
        "compute_capability": f"{major}.{minor}" if major is not None and minor is not None else None,
        "sm_count": _int_or(record.get("numSms"), None),
        "total_memory_bytes": _int_or(record.get("totalGlobalMem"), None),
        "properties": record,
    }


# Kernel names that say the architecture they were built for, where the trace names no
# device: cuBLAS and CUTLASS prefix their kernels with it; rocBLAS / hipBLASLt's Tensile
# kernels (Cijk_...) and MIOpen's run on AMD Instinct GPUs.
_ARCHITECTURE_KERNELS = (
    (re.compile(r"^(void )?(cutlass::Kernel.*)?sm100_|blackwell", re.IGNORECASE), "Blackwell, from its kernel names"),
    (re.compile(r"^(void )?sm90_|hopper|_sm90", re.IGNORECASE), "Hopper, from its kernel names"),
    (re.compile(r"^(void )?(ampere_|sm80_)|_sm80", re.IGNORECASE), "Ampere, from its kernel names"),
    (re.compile(r"^(void )?turing_|_sm75", re.IGNORECASE), "Turing, from its kernel names"),
    (re.compile(r"^(void )?volta_|_sm70", re.IGNORECASE), "Volta, from its kernel names"),
    (re.compile(r"^Cijk_|^miopen|rocblas|hipblaslt", re.IGNORECASE), "AMD Instinct (ROCm), from its kernel names"),
)


def _family_from_kernels(events: pd.DataFrame, gpu: int) -> str:
    """The GPU's architecture as its kernels' names give it, or "" where none says."""
    kernels = events[(events["kind"] == "kernel").to_numpy() & (events["device"] == gpu).to_numpy()]
    if not len(kernels):
        return ""
    names = [str(n) for n in kernels["name"].astype(str).unique()[:2000]]
    for pattern, family in _ARCHITECTURE_KERNELS:
        if any(pattern.search(name) for name in names):
            return family
    return ""


def _records_for(gpu_ids: list[int], records: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The deviceProperties record of each GPU the events use. A process that sees only
    some devices (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES) lists them from 0 while its
    events may carry the physical ids (a ROCm trace's kernels under device 9, its
    deviceProperties holding id 0 alone): where the ids the events use are not among the
    records, they are matched to the records in order, as the runtime numbered them. A
    record without a name takes one from a named record of the same part (same compute
    capability, multiprocessors and memory)."""
    out = {gpu: records[gpu] for gpu in gpu_ids if gpu in records}
    unmatched = [gpu for gpu in gpu_ids if gpu not in out]
    # (A record whose id could not be read is no one's: nothing says which device it was.)
    spare = [records[i] for i in sorted(records) if i >= 0 and records[i] not in out.values()]
    if unmatched and len(unmatched) <= len(spare):
        out.update(zip(unmatched, spare))
    named = [r for r in records.values() if str(r.get("name", "")).strip()]
    for gpu, record in list(out.items()):
        if str(record.get("name", "")).strip():
            continue
        twin = next((r for r in named if all(r.get(k) == record.get(k) for k in
                                              ("computeMajor", "computeMinor", "numSms", "totalGlobalMem"))), None)
        if twin is not None:
            out[gpu] = {**record, "name": twin["name"]}
    return out


def _advisor_metadata(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """What advisor's own host collector wrote into the trace (strings decoded), if it did."""
    if "advisor" not in metadata:
        return None
    return read_trace_metadata(metadata)


def _without_partial_steps(raw, facts: dict[str, Any] | None):
    """Drop the step ranges advisor's collector marked partial (a warm-up call, a step cut
    off by the end of the run or a break): their events then belong to no step, so
    per-step figures are not skewed by a half step."""
    partial = (facts or {}).get("partial_steps") or []
    if not partial:
        return raw
    names = {f"ProfilerStep#{n}" for n in partial}
    return raw[~raw["name"].astype(str).isin(names)].reset_index(drop=True)


def load_kineto(path: Path, *, progress: Callable[[int, int], None] | None = None,
                processes: int = 1) -> Session:
    """Read a Kineto Chrome trace (plain or gzipped JSON) into a Session (in parts, by up
    to ``processes`` processes, where it is large and plain)."""
    return session_from(*read_kineto(path, progress=progress, processes=processes))


def session_from(events: pd.DataFrame, fields: dict[str, Any]) -> Session:
    """The Session of what read_kineto returned."""
    from advisor.session import Session, SessionMeta

    return Session(SessionMeta.model_validate(fields), events)


def read_kineto(path: Path, *, progress: Callable[[int, int], None] | None = None, processes: int = 1
                ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A Kineto Chrome trace's events, attributed, and its SessionMeta's fields as plain
    data (``session_from`` makes the Session of them). Apart from load_kineto so that a
    forked read returns them without importing pydantic and the Session's models: on a
    35 MB trace the diagnosis waited 0.07 s for those imports there."""
    stream = open_trace(path)
    try:
        in_parts = functools.partial(read_in_parts, processes=processes) if processes > 1 else None
        raw, metadata, process_names = read_events(stream, path, progress=progress, in_parts=in_parts)
    finally:
        stream.close()
    collector_facts = _advisor_metadata(metadata)
    # The reader's frame and the unattributed events are each let go as soon as the next
    # one is built (a one-item list hands attribute() the only reference): on a large
    # trace each is hundreds of MB, and holding them raised the peak by as much.
    unattributed = [events_from_raw(_without_partial_steps(raw, collector_facts))]
    del raw
    events = attribute(unattributed.pop(), sync_ranges_only=collector_facts is not None)

    gpu_ids = sorted(set(events.loc[events["device"] >= 0, "device"].astype(int)))
    properties = metadata.get("deviceProperties")
    records = {_int_or(d.get("id"), -1): d for d in (properties if isinstance(properties, list) else [])
               if isinstance(d, dict)}
    devices = [{"id": -1, "kind": "cpu", "name": "host CPU (as recorded in the trace)"}]
    matched = _records_for(gpu_ids, records)
    for gpu in gpu_ids:
        record = matched.get(gpu)
        if record is not None:
            devices.append(_device(record, gpu))
            continue
        family = _family_from_kernels(events, gpu)
        devices.append({"id": gpu, "kind": "gpu", "name": f"GPU {gpu}" + (f" ({family})" if family else ""),
                        "properties": {"guessed_from": "kernel names"} if family else {}})

    distributed = None
    info = metadata.get("distributedInfo")
    if isinstance(info, dict) and info:
        distributed = {
            "backend": str(info.get("backend", "")),
            "rank": max(_int_or(info.get("rank"), 0), 0),
            "world_size": max(_int_or(info.get("world_size"), 1), 1),
            "raw": info,
        }
    notes = []
    if not gpu_ids:
        # A trace of a GPU job recorded without the GPU's activities still holds its launches.
        launched = (events["kind"].isin(("runtime", "driver")) & name_matches(events["name"], LAUNCH_CALLS)).any()
        if launched:
            notes.append("GPU not measured: the trace holds kernel launches but no GPU activity (kernels, copies, "
                         "sets): it was recorded without the GPU's activities")
        elif metadata.get("deviceProperties"):
            # The profiler saw a GPU, and this process launched nothing on it: a serving
            # stack's front end, whose model runs in a worker process with a trace of its own.
            notes.append("GPU not measured: this process launched no GPU work though the profiler saw a GPU; where "
                         "the model runs in another process (a serving engine's worker, a DataLoader's producer), "
                         "that process's trace holds the GPU: diagnose it")
        else:
            notes.append("GPU not measured: the trace holds no GPU activity (kernels, copies, sets).")
    skipped = metadata.pop("_skipped_events", 0)
    damage = metadata.pop("_damage", None)
    # Every event the reader left out, repaired, read once of several copies or could not
    # tie to its launch is said, by cause: a figure must never move without a word.
    unlinked = unlinked_gpu_events(events)
    if isinstance(damage, dict):
        damage["unlinked"] = unlinked
    notes.extend(reading_notes(damage, unlinked))
    kept = {k: v for k, v in metadata.items() if k not in ("deviceProperties", "distributedInfo", "traceEvents")}
    if collector_facts is not None:
        kept["advisor"] = collector_facts
    kept["skipped_events"] = skipped
    # What the reader skipped, repaired, and whether the file was cut off: for the
    # reports and the rules that say what was not measured.
    kept["damage"] = damage
    kept["process_names"] = process_names
    base = metadata.get("baseTimeNanoseconds")
    fields = {
        "source": str(path),
        "source_format": "kineto",
        "collector": {
            "name": "kineto-import",
            "version": str(metadata.get("schemaVersion", "")),
            "activities": sorted(set(text(events["kind"]))),
            "gpu_measured": bool(gpu_ids),
            "notes": notes,
        },
        "devices": devices,
        "distributed": distributed,
        "base_time_ns": int(base) if isinstance(base, (int, float)) else 0,
        "trace_metadata": kept,
    }
    return events, fields


