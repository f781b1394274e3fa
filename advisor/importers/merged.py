"""A multi-rank trace merged into one file, split back into its ranks.

Tools that merge a job's rank traces for a global view in Perfetto (TraceLens's
TraceFusion, and scripts like it) write every rank's events into one Chrome trace: each
event gets ``args.rank``, and its ``pid`` (and the ids that link events: ``id``,
``correlation``, ``External id``) is offset by the rank times a power of ten, the original
kept as ``<field>_raw``; process names may read ``RANK n - GPU 0``. Read as one process,
such a file is a machine with seven GPUs, three of them idle, and no straggler in sight.

:func:`merged_ranks` tells such a file from the head of its text, cheaply; :func:`split`
writes each rank's events back as a trace of its own (the offset fields restored) into a
folder, ``rank-N.json.gz``, which advisor reads as a job, as it reads a folder of rank
traces.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["HEAD_BYTES", "merged_ranks", "split"]

HEAD_BYTES = 4 << 20  # the text a merged trace is told by: its first events carry the marks
_RANK_PROCESS = re.compile(r"^RANK\s+(\d+)\b", re.IGNORECASE)
_OFFSET_FIELDS = ("pid", "id")
_OFFSET_ARGS = ("correlation", "External id")


def _head(path: Path) -> str:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            return handle.read(HEAD_BYTES).decode("utf-8", "replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""


def merged_ranks(path: Path) -> bool:
    """Whether ``path`` looks like a merged multi-rank trace: its events carry a rank and the
    original of an offset pid, or its processes are named by rank."""
    head = _head(path)
    marked = '"pid_raw"' in head and '"rank"' in head
    named = len(set(re.findall(r'"name"\s*:\s*"RANK\s+(\d+)', head))) >= 2
    return marked or named


def _rank_of(event: dict, by_pid: dict[Any, int]) -> int | None:
    args = event.get("args")
    if isinstance(args, dict) and isinstance(args.get("rank"), int):
        return args["rank"]
    return by_pid.get(event.get("pid"))


def _restore(event: dict) -> dict:
    args = event.get("args")
    if not isinstance(args, dict):
        return event
    for field in _OFFSET_FIELDS:
        raw = args.pop(f"{field}_raw", None)
        if raw is not None:
            event[field] = raw
    for field in _OFFSET_ARGS:
        raw = args.pop(f"{field}_raw", None)
        if raw is not None:
            args[field] = raw
    args.pop("rank", None)
    return event


def split(path: Path, folder: Path) -> list[Path]:
    """Write each rank of the merged trace at ``path`` as ``folder/rank-N.json.gz`` (the
    offset fields restored); the files, by rank. Events with no rank (a merged file's own
    bookkeeping) go to every rank where they are metadata, else nowhere."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        data = json.load(handle)
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    if not isinstance(events, list):
        return []
    by_pid: dict[Any, int] = {}
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "M" and event.get("name") == "process_name":
            match = _RANK_PROCESS.match(str((event.get("args") or {}).get("name", "")))
            if match:
                by_pid[event.get("pid")] = int(match[1])
    ranks: dict[int, list[dict]] = defaultdict(list)
    shared: list[dict] = []
    for event in events:
        if not isinstance(event, dict):
            continue
        rank = _rank_of(event, by_pid)
        if rank is None:
            if event.get("ph") == "M":
                shared.append(event)
            continue
        ranks[rank].append(_restore(event))
    folder.mkdir(parents=True, exist_ok=True)
    top = {k: v for k, v in data.items() if k != "traceEvents"} if isinstance(data, dict) else {}
    written = []
    for rank in sorted(ranks):
        target = folder / f"rank-{rank}.json.gz"
        with gzip.open(target, "wt", encoding="utf-8") as out:
            json.dump({**top, "traceEvents": [*shared, *ranks[rank]]}, out)
        written.append(target)
    return written
