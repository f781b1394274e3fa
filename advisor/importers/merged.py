"""A multi-rank trace merged into one file, split back into its ranks.

Tools that merge a job's rank traces for a global view in Perfetto (TraceLens's
TraceFusion, and scripts like it) write every rank's events into one Chrome trace: each
event gets ``args.rank``, and its ``pid`` (and the ids that link events: ``id``,
``correlation``, ``External id``) is offset by the rank times a power of ten, the original
kept as ``<field>_raw``; process names may read ``RANK n - GPU 0``. Read as one process,
such a file is a machine with seven GPUs, three of them idle, and no straggler in sight.

:func:`merged_ranks` tells such a file from the structure of its first events (nearly
every one marked, never two stray tokens), and hands a damaged file to the reader, whose
salvage judges it; :func:`split` writes each rank's events back as a trace of its own (the
offset fields restored) into a folder, ``rank-N.json.gz``, which advisor reads as a job,
as it reads a folder of rank traces. The split is bounded (its text, its ranks, each
rank's value) and says what it left out.
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import re
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HEAD_BYTES", "MAX_SPLIT_BYTES", "MAX_SPLIT_RANKS", "Split", "merged_ranks", "split"]

HEAD_BYTES = 4 << 20  # the text a merged trace is told by: its first events carry the marks
HEAD_EVENTS = 50_000  # events of the head judged, at most
# A merge marks every event it writes: at least this share of the head's complete events
# carry a rank and their pid's original, or sit in a process named by rank. Two marked
# events in an ordinary trace do not make it a merge.
MARKED_SHARE = 0.9
# Splitting reads the whole file as JSON (several times its text in memory) and writes a
# trace per rank: bounded in text and in ranks, as a job folder is.
MAX_SPLIT_BYTES = 2 << 30
MAX_SPLIT_RANKS = 1024
MAX_RANK = 1_000_000  # a rank at or past this is damage, not a rank (advisor.job.inputs.MAX_RANKS)
_RANK_PROCESS = re.compile(r"^RANK\s+(\d+)\b", re.IGNORECASE)
_OFFSET_FIELDS = ("pid", "id")
_OFFSET_ARGS = ("correlation", "External id")
_CHUNK = 1 << 20


def _opener(path: Path):
    return gzip.open if path.name.lower().endswith(".gz") else open


def _head(path: Path) -> str:
    """The first HEAD_BYTES of the file's text; "" where it cannot be read (a damaged
    compressed stream too: the trace reader's salvage judges those)."""
    try:
        with _opener(path)(path, "rb") as handle:
            return handle.read(HEAD_BYTES).decode("utf-8", "replace")
    except (OSError, EOFError, zlib.error, ValueError):
        return ""


def _head_events(head: str) -> list[Any]:
    """The events that the head's text holds whole, in order (the last one, cut by the
    head's end, is left out)."""
    at = head.find('"traceEvents"')
    at = head.find("[", at) if at >= 0 else (0 if head.lstrip().startswith("[") else -1)
    if at < 0:
        return []
    decoder, events, i = json.JSONDecoder(), [], at + 1
    while len(events) < HEAD_EVENTS:
        while i < len(head) and head[i] in " \t\r\n,":
            i += 1
        if i >= len(head) or head[i] == "]":
            break
        try:
            event, i = decoder.raw_decode(head, i)
        except (ValueError, RecursionError):
            break
        events.append(event)
    return events


def _marked(event: dict) -> bool:
    """Whether a merge wrote this event: an integer rank, and the pid's original kept."""
    args = event.get("args")
    return (isinstance(args, dict) and type(args.get("rank")) is int and 0 <= args["rank"] < MAX_RANK
            and type(args.get("pid_raw")) in (int, str))


def merged_ranks(path: Path) -> bool:
    """Whether ``path`` is a merged multi-rank trace, from the structure of its first
    events: nearly every complete event carries a rank and its pid's original, the pid
    offset from it by the rank times a power of ten (TraceFusion's layout), or sits in a
    process named by rank ('RANK 1 - GPU 0') with two ranks or more named. A damaged or
    unreadable file is not (the reader judges it)."""
    events = [e for e in _head_events(_head(path)) if isinstance(e, dict)]
    complete = [e for e in events if e.get("ph") == "X"]
    if not complete:
        return False
    marked = [e for e in complete if _marked(e)]
    if len(marked) >= MARKED_SHARE * len(complete) and _offset_layout(marked):
        return True
    named = {e.get("pid"): int(m[1]) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and type(e.get("pid")) in (int, str)
             and isinstance(e.get("args"), dict)
             and (m := _RANK_PROCESS.match(str(e["args"].get("name", "")))) is not None}
    inside = sum(1 for e in complete if type(e.get("pid")) in (int, str) and e.get("pid") in named)
    return len(set(named.values())) >= 2 and inside >= MARKED_SHARE * len(complete)


def _offset_layout(marked: list[dict]) -> bool:
    """Whether the marked events' pids are laid out as a merge offsets them: each the
    original plus the rank times one power of ten (rank 0's the original), for nearly all
    of them (text pids, which no offset applies to, aside)."""
    offsets: collections.Counter[int] = collections.Counter()
    checked = fits = 0
    for event in marked:
        pid, raw, rank = event.get("pid"), event["args"]["pid_raw"], event["args"]["rank"]
        if type(pid) is not int or type(raw) is not int:
            continue
        checked += 1
        shift = pid - raw
        if rank == 0:
            fits += shift == 0
        elif shift > 0 and shift % rank == 0:
            offsets[shift // rank] += 1
    if offsets:
        offset, count = offsets.most_common(1)[0]
        fits += count if offset >= 10 and 10 ** round(math.log10(offset)) == offset else 0
    return checked == 0 or fits >= MARKED_SHARE * checked


@dataclass
class Split:
    """What :func:`split` wrote: the rank files in rank order, and the events it left out
    and why (reason -> count)."""

    files: list[Path]
    left_out: dict[str, int] = field(default_factory=dict)

    def said(self) -> str:
        """One line on the events left out ('' where none)."""
        if not self.left_out:
            return ""
        parts = ", ".join(f"{n:,} {why}" for why, n in sorted(self.left_out.items(), key=lambda kv: -kv[1]))
        return f"{sum(self.left_out.values()):,} events of the merged trace were not read: {parts}"


def _rank_of(event: dict, by_pid: dict[Any, int]) -> int | str | None:
    """The event's rank, None where it carries none, or the reason its rank is not one."""
    args = event.get("args")
    rank = args.get("rank") if isinstance(args, dict) else None
    if rank is None:
        pid = event.get("pid")
        return by_pid.get(pid) if type(pid) in (int, str) else None
    if type(rank) is not int:
        return "with a rank that is not a whole number"
    if not 0 <= rank < MAX_RANK:
        return f"with a rank outside 0..{MAX_RANK - 1:,}"
    return rank


def _restore(event: dict) -> dict:
    args = event.get("args")
    if not isinstance(args, dict):
        return event
    for name in _OFFSET_FIELDS:
        raw = args.pop(f"{name}_raw", None)
        if raw is not None:
            event[name] = raw
    for name in _OFFSET_ARGS:
        raw = args.pop(f"{name}_raw", None)
        if raw is not None:
            args[name] = raw
    args.pop("rank", None)
    return event


def _text_size(path: Path) -> int:
    """The file's text in bytes (a compressed file's, counted as it decompresses), up to
    one past MAX_SPLIT_BYTES."""
    if not path.name.lower().endswith(".gz"):
        return path.stat().st_size
    size = 0
    with gzip.open(path, "rb") as handle:
        while size <= MAX_SPLIT_BYTES:
            chunk = handle.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
    return size


def split(path: Path, folder: Path) -> Split:
    """Write each rank of the merged trace at ``path`` as ``folder/rank-N.json.gz`` (the
    offset fields restored). Events with no rank (a merged file's own bookkeeping) go to
    every rank where they are metadata, else nowhere; events whose rank is not one, and
    events of no rank, are counted in ``left_out``. Raises ValueError where the file is
    past MAX_SPLIT_BYTES of text or holds more than MAX_SPLIT_RANKS ranks, and
    OSError/zlib.error where it cannot be read."""
    size = _text_size(path)
    if size > MAX_SPLIT_BYTES:
        raise ValueError(f"its text is past the {MAX_SPLIT_BYTES >> 30} GiB advisor splits; split it into rank "
                         "traces with the tool that merged it")
    with _opener(path)(path, "rt", encoding="utf-8", errors="replace") as handle:
        data = json.load(handle)
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    if not isinstance(events, list):
        return Split([])
    by_pid: dict[Any, int] = {}
    for event in events:
        if (isinstance(event, dict) and event.get("ph") == "M" and event.get("name") == "process_name"
                and type(event.get("pid")) in (int, str) and isinstance(event.get("args"), dict)):
            match = _RANK_PROCESS.match(str(event["args"].get("name", "")))
            if match and int(match[1]) < MAX_RANK:
                by_pid[event.get("pid")] = int(match[1])
    ranks: dict[int, list[dict]] = defaultdict(list)
    shared: list[dict] = []
    left_out: dict[str, int] = defaultdict(int)
    for event in events:
        if not isinstance(event, dict):
            left_out["that are not objects"] += 1
            continue
        rank = _rank_of(event, by_pid)
        if rank is None:
            if event.get("ph") == "M":
                shared.append(event)
            else:
                left_out["with no rank"] += 1
            continue
        if isinstance(rank, str):
            left_out[rank] += 1
            continue
        if rank not in ranks and len(ranks) >= MAX_SPLIT_RANKS:
            raise ValueError(f"it holds more than {MAX_SPLIT_RANKS:,} ranks (each event's args.rank), past what "
                             "advisor splits from one file")
        ranks[rank].append(_restore(event))
    folder.mkdir(parents=True, exist_ok=True)
    top = {k: v for k, v in data.items() if k != "traceEvents"} if isinstance(data, dict) else {}
    written = []
    for rank in sorted(ranks):
        target = folder / f"rank-{rank}.json.gz"
        with gzip.open(target, "wt", encoding="utf-8") as out:
            json.dump({**top, "traceEvents": [*shared, *ranks[rank]]}, out)
        written.append(target)
    return Split(written, dict(left_out))
