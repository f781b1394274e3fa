"""Read PyTorch profiler / Kineto Chrome-trace JSON (.json or .json.gz) into a Session.

Both schemas are understood: the 2021 one with capitalised categories (Operator, Runtime,
Kernel, Memcpy, Memset) and today's (cpu_op, cuda_runtime, cuda_driver, kernel, gpu_memcpy,
gpu_memset, cuda_sync, user_annotation, gpu_user_annotation, python_function).

Fast: the file is read (and gunzipped) as a stream of 256 KiB blocks. The event array is
cut into chunks after an event's closing brace (a ``}`` then ``,`` then ``{``), and msgspec
decodes each chunk straight into typed structs that hold only the fields the Session uses;
every other key is skipped without being built. Each chunk's structs become typed arrays
at once, text interned as codes, so memory holds those arrays and a chunk or two, never
the whole document (benchmarks/ingest.py has the figures against json.load, orjson and
ijson). A large plain file is read in parts, each by a process of its own, where the
parts give exactly this reading (advisor.importers.parts, which the loader hands the reader;
otherwise ReadAgain). A cut that
lands inside a string or a nested value cannot go unnoticed: that chunk then fails to
decode and takes the careful path below, so the fast path tracks no strings.

Tolerant: a chunk that fails to decode is bisected at its candidate cuts until the pieces
that fail alone are found; only those go through Python's json, which is lenient where
msgspec is strict (NaN and Infinity, invalid UTF-8 replaced, torch's unescaped quotes in
names repaired), and through a field-by-field check (a ``cat`` that is a list, a ``ts`` that
is text, an integer past int64). What cannot be repaired is skipped; both are counted by
reason in ``metadata["_damage"]``. A file that ends early (a job killed while writing it,
plain or gzipped) keeps every whole event before the cut and says it was truncated and
how far it got. A file that is no trace at all, or in which no event could be read, is a
TraceError.

The few top-level keys besides ``traceEvents`` (deviceProperties, distributedInfo,
baseTimeNanoseconds...) sit before or after the event array: the ones before are parsed
on the way to the array, the ones after from the bytes left when the array ends.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Callable
from functools import reduce
from itertools import compress
from operator import or_
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import pandas as pd

from advisor.errors import TraceError
from advisor.session.layout import DAY_NS, MAX_SPREAD_NS
from advisor.units import valid_text

# Bytes read (and decoded) at a time. Small blocks are much faster than large ones:
# the buffers are reused while still in cache instead of being faulted in afresh.
BLOCK = 1 << 18
# Past this the top-level values before the event array are taken to be no trace.
_HEAD_LIMIT = 64 << 20
# A run of bytes this long without a place to cut is treated as damage, not read on.
_MAX_EVENT_BYTES = 256 << 20
# How many candidate cuts a bad event may span before it is given up on.
_MAX_JOIN = 8
# How many candidates for the end of the event array are tried where each costs a parse
# of the event before it, and how many characters may be parsed past candidates in all.
_MAX_TRIES = 256
_PARSE_BUDGET = 1 << 24

# Category spellings, old and new, to the Session's kinds.
CATEGORY_KIND = {
    "operator": "op",
    "cpu_op": "op",
    "python_function": "python",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "runtime": "runtime",
    "cuda_runtime": "runtime",
    "cuda_driver": "driver",
    "kernel": "kernel",
    "memcpy": "memcpy",
    "gpu_memcpy": "memcpy",
    "memset": "memset",
    "gpu_memset": "memset",
    "cuda_sync": "sync",
}

_GPU_KINDS = frozenset({"kernel", "memcpy", "memset", "gpu_annotation", "sync"})
# Groups of kinds whose events carry fields the others do not, a code for each (0: none),
# and which group carries which field: only the rows of that group read it.
_CARRIERS = {"op": 1, "gpu": 3}
_CARRIER_OF_KIND = {"op": 1, **{kind: 3 for kind in _GPU_KINDS}}
_CARRIED_BY = {
    **dict.fromkeys(("device", "stream", "bytes", "registers", "shared_memory", "grid", "block"), "gpu"),
    **dict.fromkeys(("flops", "sequence", "input_dims", "input_types", "input_strides", "concrete_inputs",
                     "comm"), "op"),
}
_NAN = float("nan")
_COPY_NAME = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_HEX = re.compile(r"[-+]?0[xX][0-9a-fA-F]{1,64}")
_DECIMAL = re.compile(r"[-+]?[0-9]{1,64}")
_MAX_US = 9e15  # microseconds: as nanoseconds, just inside int64

# -- what is decoded --------------------------------------------------------------------
# Only these fields are built; msgspec skips every other key of an event unread. Where an
# event's field has another type than declared here the chunk fails to decode and the
# careful path judges that event alone.

_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    # null is written for some fields: it reads as absent. (A python_function's "Python id"
    # and "Python parent id" are not read: the Session nests frames by their times.)
    # Ids, devices, streams and counts may be text: ROCm's profiler writes a stream as hex
    # ("0x0"), other writers ids as digits. Declared here, text costs that field a
    # conversion (_Columns._ints) instead of sending every event down the careful path.
    correlation: int | str | None = -1
    external_id: int | str | None = msgspec.field(default=-1, name="External id")
    external_id_lower: int | str | None = msgspec.field(default=-1, name="external id")
    device: int | str | None = -1
    stream: int | str | None = -1
    nbytes: int | str | None = msgspec.field(default=-1, name="bytes")
    registers: int | str | None = msgspec.field(default=-1, name="registers per thread")
    shared_memory: int | str | None = msgspec.field(default=-1, name="shared memory")
    flops: float | None = _NAN
    sequence: int | str | None = msgspec.field(default=-1, name="Sequence number")
    call_stack: str | None = msgspec.field(default="", name="Call stack")
    # Shapes, types and launch geometry stay raw JSON text: they become columns of text,
    # converted once per distinct value rather than built as lists per event.
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    input_strides: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Strides")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW
    # A collective's record_param_comms: its process group and message (joined into the
    # comm column, for the job's collectives table).
    pg_name: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Name")
    pg_desc: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Description")
    msg_nelems: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In msg nelems")
    msg_dtype: msgspec.Raw = msgspec.field(default=_NO_RAW, name="dtype")


_NO_ARGS = _Args()


def _comm_raw(args: _Args) -> Any:
    """[group name, group description, elements, dtype] as JSON where the event is a
    collective's record (record_param_comms), else absent."""
    if args.msg_nelems is _NO_RAW and args.pg_name is _NO_RAW:
        return _NO_RAW
    return b"[" + b",".join(b"null" if r is _NO_RAW else bytes(r)
                            for r in (args.pg_name, args.pg_desc, args.msg_nelems, args.msg_dtype)) + b"]"


def _all_absent(raws: list[Any]) -> bool:
    """Whether none of these raw fields was written. Judged by identity in C where the
    first is absent (a field a trace does not record is absent throughout); a field
    written on the first row is taken as present without a pass."""
    return not raws or (raws[0] is _NO_RAW and raws.count(_NO_RAW) == len(raws))


class _Complete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event ('X'): the only phase that becomes a row."""

    name: str = ""
    cat: str = ""
    ts: float | None = None
    dur: float | None = math.nan  # missing: counted (_Damage.count_durations), then 0
    pid: int | str | None = -1
    tid: int | str | None = -1
    args: _Args = _NO_ARGS


class _Meta(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    """A metadata event ('M'): process and thread names."""

    name: Any = None
    pid: Any = None
    tid: Any = None
    args: Any = None


# The other phases of the Trace Event Format are read past without building anything; a
# phase outside this list sends its chunk down the careful path, where it is counted.
_READ_PAST = frozenset("BEiIbneSTpFstfPOND(Cc)RvV")
_OTHER_PHASES = [msgspec.defstruct(f"_Phase{ord(ph)}", [], tag_field="ph", tag=ph, gc=False)
                 for ph in sorted(_READ_PAST)]
_EVENT = reduce(or_, (_Complete, _Meta, *_OTHER_PHASES))  # the union of them all, tagged by "ph"
_DECODER = msgspec.json.Decoder(list[_EVENT])  # type: ignore[valid-type]

# A chunk in which an arg the Session reads has a type the structs above do not take (a
# list where a number belongs): decoded again with those args of any type, each field
# then converted or counted by itself (_Columns.add, ``loose``), so one odd field costs
# that field a conversion, not its events the careful path.
_LooseArgs = msgspec.defstruct(
    "_LooseArgs",
    [(f.name, f.type if f.type is msgspec.Raw else Any, msgspec.field(default=f.default, name=f.encode_name))
     for f in msgspec.structs.fields(_Args)],
    frozen=True, gc=False)


class _LooseComplete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event whose args may be of any type (see _LooseArgs)."""

    name: str = ""
    cat: str = ""
    ts: float | None = None
    dur: float | None = math.nan
    pid: int | str | None = -1
    tid: int | str | None = -1
    args: _LooseArgs = _LooseArgs()  # type: ignore[valid-type]


_LOOSE_DECODER = msgspec.json.Decoder(list[reduce(or_, (_LooseComplete, _Meta, *_OTHER_PHASES))])  # type: ignore[misc]
# A chunk that is JSON but of other types still (a time as text, args that are a list):
# decoded as plain values, then judged event by event (EventReader._checked), before any
# bisecting.
_PLAIN_DECODER = msgspec.json.Decoder(list)
_DECODE_ERRORS = (msgspec.MsgspecError, ValueError, RecursionError)
# (attribute, key in the file, type) of the args read, for the field-by-field check.
_ARG_FIELDS = [(f.name, f.encode_name, getattr(f.type, "__args__", (f.type,))[0])
               for f in msgspec.structs.fields(_Args)]

# A place to cut the event array: the end of an event, a comma, the start of the next.
EVENT_CUT = re.compile(rb"\}\s*,\s*\{")
# The end of the event array: the last event's brace (or the opening bracket) and ']'.
_ARRAY_END = re.compile(r"(?:\}|\A)\s*\]")
_ANY_CLOSE = re.compile(r"\]")
# What follows the last whole event of a file that was cut off: more of the array.
_MORE_EVENTS = re.compile(rb"\s*(?:,|\Z)")
_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPACE = re.compile(r"\s*")
_ONLY_SPACE = re.compile(r"\s*\Z")
_DECODER_PY = json.JSONDecoder()


class _Damage:
    """What was skipped or repaired, by reason, and whether the file ended early.

    ``skipped``: damaged events, or events whose loss changes what the GPU did (the
    Collection Summary marks the profile incomplete for them); ``dropped``: events left out
    that the Session has no place for (no category, an unknown category or phase);
    ``ignored``: events of categories that hold nothing the Session uses (the profiler's
    own span); ``duplicates``: copies of an event read once. ``lost_threads``: the (pid, tid)
    of each event dropped for want of a category, so that those on a GPU's threads are
    counted as lost GPU activity once the rows are known."""

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()
        self.repaired: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.lost_threads: Counter[tuple[int, int]] = Counter()
        self.duplicates = 0
        self.near_copies = 0
        self.truncated = False
        self.durations = {"events": 0, "missing": 0, "zero": 0}

    def drop_unknown_category(self, category: str) -> None:
        """Count an event of a category no kind is read for, by its name (a bounded
        number of names: a hostile trace may write a new one on every event)."""
        if category.lower() in _INERT_CATEGORIES:
            self.ignored[category] += 1
            return
        cause = f"category {category[:40]!r}"
        if cause not in self.dropped and sum(c.startswith("category ") for c in self.dropped) >= _MAX_NAMED:
            cause = "other categories"
        self.dropped[cause] += 1

    def lost_on_gpu(self, frame: pd.DataFrame) -> int:
        """Events dropped for want of a category that sat on a thread of the GPU's own
        (where the frame's kernels, copies and sets are): GPU activity lost, which changes
        what the GPU did, so skipped rather than dropped. Returns how many."""
        if not self.lost_threads or not len(frame):
            return 0
        category = frame["category"]
        on_gpu = np.array([CATEGORY_KIND.get(str(c).lower()) in _GPU_KINDS for c in category.cat.categories] + [False])
        codes = category.cat.codes.to_numpy()
        rows = on_gpu[np.where(codes >= 0, codes, len(on_gpu) - 1)]
        if not rows.any():
            return 0
        threads = pd.DataFrame({"pid": frame["pid"].to_numpy()[rows], "tid": frame["tid"].to_numpy()[rows]})
        gpu_threads = set(threads.drop_duplicates().itertuples(index=False, name=None))
        lost = sum(n for thread, n in self.lost_threads.items() if thread in gpu_threads)
        if lost:
            self.dropped["no category"] -= lost
            if self.dropped["no category"] <= 0:
                del self.dropped["no category"]
            self.skipped["GPU activity without a category"] += lost
        return lost

    def count_durations(self, frame: pd.DataFrame) -> None:
        """Count the complete events whose duration is missing (then taken as 0) or 0: a
        trace without durations cannot say where time went, and the report must say so."""
        if "dur" not in frame.columns or not len(frame):
            return
        dur = frame["dur"].to_numpy()
        missing = np.isnan(dur)
        self.durations = {"events": len(dur), "missing": int(missing.sum()), "zero": int((dur == 0).sum())}
        if missing.any():
            frame["dur"] = np.where(missing, 0.0, dur)

    def as_dict(self, bytes_read: int, bytes_total: int | None) -> dict[str, Any]:
        record = {
            "durations": dict(self.durations),
            "skipped": dict(sorted(self.skipped.items())),
            "repaired": dict(sorted(self.repaired.items())),
            "truncated": self.truncated,
            "bytes_read": bytes_read,
            "bytes_total": bytes_total,
        }
        # Events left out as having no kind, read past, or read once of several copies:
        # where there are any.
        for key, value in (("dropped", dict(sorted(self.dropped.items()))),
                           ("ignored", dict(sorted(self.ignored.items()))), ("duplicates", self.duplicates),
                           ("near_copies", self.near_copies)):
            if value:
                record[key] = value
        return record


# Categories of complete events that hold nothing the Session uses (the profiler's span of
# the whole trace): read past, counted, not worth a note.
_INERT_CATEGORIES = frozenset({"trace"})
# How many unknown categories are counted by name before the rest are counted together,
# and how many threads of events without a category are told apart.
_MAX_NAMED = 8
_MAX_THREADS = 4096
# GPU activity written without a category is read by its name as a copy, a set or a
# synchronisation (CUPTI's names for them), else as a kernel.
_SYNC_NAMES = frozenset({"Event Sync", "Stream Sync", "Context Sync", "Stream Wait Event", "Device Sync"})
REPAIRED_GPU = "GPU activity without a category, recognised by its device and stream"


def _gpu_category(name: str, args: _Args) -> str | None:
    """The category of an event written without one, where its args say it ran on the
    GPU: a device and a stream, which every kernel, copy, set and GPU synchronisation
    carries and no host event does; None otherwise."""
    if args.device in (-1, None) or args.stream in (-1, None):
        return None
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    return "cuda_sync" if name in _SYNC_NAMES else "kernel"


def _without_duplicates(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows with each event that appears more than once, identical in every field
    read, kept once (a trace written twice, or two copies joined), and how many copies
    were let go. Only rows that share a start time with another are compared, so a trace
    without copies costs one sort of its start times; the rows that do are grouped by a
    hash of all their fields and compared field by field. (numpy, not pandas' duplicated:
    its hash tables take seconds on millions of rows.)"""
    if len(frame) < 2:
        return frame, 0
    ts = frame["ts"].to_numpy()
    ordered = np.sort(ts)
    shared = ordered[1:] == ordered[:-1]
    if not shared.any():
        return frame, 0
    rows = np.flatnonzero(np.isin(ts, ordered[1:][shared]))
    del ordered, shared
    digest = np.zeros(len(rows), dtype=np.uint64)
    for name in frame.columns:
        digest ^= _field_bits(frame[name], rows)
        digest *= _MIX  # (wraps around, as a hash should)
    order = np.argsort(digest, kind="stable")  # stable: the first of equal rows is the first in the file
    digest = digest[order]
    same = digest[1:] == digest[:-1]
    for name in frame.columns:
        if not same.any():
            return frame, 0
        bits = _field_bits(frame[name], rows)[order]
        same &= bits[1:] == bits[:-1]
    if not same.any():
        return frame, 0
    keep = np.ones(len(frame), dtype=bool)
    keep[rows[order[1:][same]]] = False
    return frame[keep].reset_index(drop=True), int(same.sum())


def _near_copies(frame: pd.DataFrame) -> int:
    """Events that repeat another of the same name, category and thread, of the same
    duration, a few nanoseconds later (advisor.session.copies.near_copies)."""
    if len(frame) < 2:
        return 0
    from advisor.session.copies import near_copies  # noqa: PLC0415

    ts = frame["ts"].to_numpy(dtype=np.float64)
    dur = frame["dur"].to_numpy(dtype=np.float64)
    usable = np.isfinite(ts) & np.isfinite(dur)
    start = np.round(ts[usable] * 1000).astype(np.int64)
    end = start + np.round(dur[usable] * 1000).astype(np.int64)
    keys = [frame[c].to_numpy()[usable] for c in ("name", "category", "pid", "tid")]
    return near_copies(start, end, *keys)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _field_bits(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """A column's values at ``rows`` as 64-bit patterns, equal where the values are (text
    by its code, a float by its bits, so that two missing values are alike)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy()[rows].astype(np.int64).view(np.uint64)
    values = column.to_numpy()[rows]
    return values.astype(np.float64 if values.dtype.kind == "f" else np.int64, copy=False).view(np.uint64)


def unlinked_gpu_events(events: pd.DataFrame) -> dict[str, int]:
    """GPU activity (kernels, copies, sets) of attributed events (advisor.session.attribute)
    that is tied to no launch, by cause: no correlation id, or one that no runtime or
    driver call of the trace carries. Such work counts as GPU time, but no launch charges
    it to a step, a phase or the op that queued it."""
    from advisor.session import GPU_KINDS, one_of

    if not len(events) or "launch" not in events.columns:
        return {}
    gpu = one_of(events["kind"], GPU_KINDS)
    correlation = events["correlation"].to_numpy()
    launch = events["launch"].to_numpy()
    counts = {"no correlation id": int((gpu & (correlation < 0)).sum()),
              "a correlation id no launch carries": int((gpu & (correlation >= 0) & (launch < 0)).sum())}
    return {cause: n for cause, n in counts.items() if n}


def _counted(counts: Any) -> list[tuple[str, int]]:
    """(cause, count) of a damage record's {cause: count}, largest first; what is not a
    count (a saved session edited by hand) is left out."""
    if not isinstance(counts, dict):
        return []
    pairs = [(str(cause), int(n)) for cause, n in counts.items()
             if isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) and n > 0]
    return sorted(pairs, key=lambda pair: -pair[1])


def _listed(pairs: list[tuple[str, int]]) -> str:
    return ", ".join(f"{n:,} {cause}" for cause, n in pairs)


def reading_notes(damage: Any, unlinked: dict[str, int] | None = None) -> list[str]:
    """What the reader of a trace left out, repaired, read once of several copies or
    could not link to a launch, by cause, as the report's notes say it. ``damage``: the
    reader's record (``metadata["_damage"]`` of read_events); ``unlinked``: what
    unlinked_gpu_events counted."""
    if not isinstance(damage, dict):
        damage = {}
    notes = []
    skipped = _counted(damage.get("skipped"))
    if skipped:
        notes.append(f"The trace reader skipped {sum(n for _, n in skipped):,} damaged events ({_listed(skipped)}): "
                     "what they recorded is missing from every figure.")
    dropped = _counted(damage.get("dropped"))
    if dropped:
        notes.append(f"The trace reader left out {sum(n for _, n in dropped):,} events it has no kind for "
                     f"({_listed(dropped)}): what they recorded is missing from every figure.")
    repaired = _counted(damage.get("repaired"))
    if repaired:
        notes.append(f"The trace reader repaired {sum(n for _, n in repaired):,} events and read them "
                     f"({_listed(repaired)}).")
    copies = damage.get("duplicates")
    if isinstance(copies, int) and not isinstance(copies, bool) and copies > 0:
        notes.append(f"{copies:,} events of the trace are copies of another, identical in every field (a trace "
                     "written twice, or two copies joined?): each was read once.")
    near = damage.get("near_copies")
    if isinstance(near, int) and not isinstance(near, bool) and near > 0:
        notes.append(f"{near:,} events are near-copies of another: the same name, thread and duration, starting "
                     "within a few ns (a trace joined with a shifted copy of itself?); no profiler writes such pairs, "
                     "and the figures count both.")
    links = _counted(unlinked)
    if links:
        notes.append(f"{sum(n for _, n in links):,} GPU activities are tied to no launch ({_listed(links)}): their "
                     "time counts as the GPU's, but not to the step, phase or op that queued them.")
    return notes


def open_trace(path: Path) -> BinaryIO:
    """Open a trace file, gzipped or not, after checking it looks like JSON at all."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise TraceError(f"cannot open {path}: {exc.strerror or exc}") from None
    magic = raw.read(2)
    raw.seek(0)
    stream: BinaryIO = raw
    if magic == b"\x1f\x8b":
        # gzip.open owns the file it opens, so closing the stream closes the file too.
        raw.close()
        stream = raw = gzip.open(path, "rb")  # type: ignore[assignment]
    try:
        first = _first_char(stream)
    except EOFError:
        raw.close()
        raise TraceError(f"{path} is a truncated gzip file: it ends before any of its trace") from None
    except (OSError, zlib.error) as exc:
        raw.close()
        raise TraceError(f"{path} is not a readable gzip file ({exc})") from None
    if first is None:
        raw.close()
        raise TraceError(f"{path} is empty: there is no trace in it")
    if first not in "{[":
        raw.close()
        raise TraceError(
            f"{path} is not a trace advisor can read: expected PyTorch profiler / Kineto JSON (.json or .json.gz)"
        )
    stream.seek(0)
    return stream


def _first_char(stream: BinaryIO) -> str | None:
    read = getattr(stream, "read1", stream.read)
    while True:
        block = read(4096)
        if not block:
            return None
        text = block.lstrip()
        if text:
            return chr(text[0])


def _tid_number(value: Any, names: dict[str, int]) -> int:
    """Thread ids come as ints, digit strings or labels such as 'stream 7'."""
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    if isinstance(value, float) and math.isfinite(value) and abs(value) < 2**63:
        return int(value)
    text = str(value)
    if text.lstrip("-").isdigit() and _INT64_MIN <= int(text) <= _INT64_MAX:
        return int(text)
    digits = re.search(r"(\d+)$", text)
    if digits and int(digits.group(1)) <= _INT64_MAX:
        return int(digits.group(1))
    # A label with no number (or one past int64): give it a stable negative id of its own.
    return names.setdefault(text, -2 - len(names))


class _ThreadNumbers(dict):
    """A pid or tid that is not an int -> its number, worked out once per distinct value."""

    def __init__(self, names: dict[str, int]):
        super().__init__()
        self.names = names

    def __missing__(self, value: Any) -> int:
        number = self[value] = _tid_number(value, self.names)
        return number


class _Codes(dict):
    """Text -> a small integer, numbered in order of first sight; ``values`` lists the
    texts by code. Interning while reading keeps one copy of each name."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[str] = []

    def __missing__(self, text: str) -> int:
        code = self[text] = len(self.values)
        self.values.append(text)
        return code


class _RawCodes(dict):
    """Raw JSON of a field -> the code of its compact JSON text ('' where the field counts
    as absent), the conversion made once per distinct value."""

    def __init__(self, codes: _Codes, present: Callable[[Any], bool]):
        super().__init__()
        self.codes = codes
        self.present = present

    def __missing__(self, raw: bytes) -> int:
        try:
            value = json.loads(raw)
            text = json.dumps(value, separators=(",", ":")) if self.present(value) else ""
        except (ValueError, TypeError, RecursionError):
            text = raw.decode("utf-8", "replace")
        code = self[raw] = self.codes[text]
        return code


def _any_true(value: Any) -> bool:
    try:
        return bool(value) and any(value)
    except TypeError:
        return bool(value)


class EventReader:
    """One pass over a trace: the top-level keys, then the event array chunk by chunk.

    Its public face serves the reader in parts (advisor.importers.parts): ``read_array``
    from a point, ``stop_at`` an offset, a reader of one part of the file (:meth:`part`),
    that part's rows and counts as plain data (:meth:`part_result`), and ``absorb`` to
    append a part's result in file order; ``path``, ``stream``, ``gzipped``,
    ``file_size``, ``progress`` and ``careful_used`` are read-only facts to it.
    """

    def __init__(self, stream: BinaryIO, path: Path, progress: Callable[[int, int], None] | None,
                 read_rest: Callable[..., dict[str, Any]] | None = None):
        self.stream = stream
        self.read1 = getattr(stream, "read1", stream.read)
        self.path = path
        self.progress = progress
        # A progress callable that takes ``events=`` hears the events parsed so far too.
        self.progress_events = progress is not None and _takes_events(progress)
        # A GzipFile reads its file through .fileobj: its position is the compressed bytes.
        self.raw_file = getattr(stream, "fileobj", None) or stream
        self.gzipped = isinstance(stream, gzip.GzipFile)
        self.file_size = path.stat().st_size
        self.bytes_read = 0
        self.eof = False
        self.cut_reason: str | None = None  # why a gzip stream stopped early, if it did
        self.damage = _Damage()
        self.not_read = 0  # complete events of a category the Session has no kind for
        self.events_seen = 0
        self.process_names: dict[str, Any] = {}
        self.tid_names: dict[str, int] = {}
        self.big_ids: dict[int, int] = {}
        self.columns = _Columns(self)
        # Reading in parts: the reader of the event array in parts its caller gave
        # (advisor.importers.parts.read_in_parts), where the file may be; where its part's
        # bytes start and where reading stops (None: the file's end), whether a chunk took
        # the careful path (damage, or a part cut inside an event), and a progress slot.
        self.read_rest = read_rest
        self.offset = 0
        self.limit: int | None = None
        self.careful_used = False
        self.report_part: Callable[[int, int], None] | None = None

    # -- bytes ------------------------------------------------------------------------

    def read(self, size: int) -> bytes:
        if self.eof:
            return b""
        if self.limit is not None:
            size = min(size, self.limit - self.offset - self.bytes_read)
            if size <= 0:
                self.eof = True
                return b""
        try:
            # read1: read() would gather more from a gzip stream before returning and
            # lose what it had gathered when the stream then turns out to be cut off.
            data = self.read1(size)
        except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
            # Everything decompressed before the damage has been returned already.
            self.cut_reason = str(exc) or type(exc).__name__
            data = b""
        if not data:
            self.eof = True
        self.bytes_read += len(data)
        if self.report_part is not None:
            self.report_part(self.bytes_read, self.events_seen)
        if self.progress is not None:
            done = self.raw_file.tell() if not self.eof else self.file_size
            if self.progress_events:
                self.progress(done, self.file_size, events=self.events_seen)
            else:
                self.progress(done, self.file_size)
        return data

    # -- reading in parts ---------------------------------------------------------------

    @classmethod
    def part(cls, path: Path, start: int, end: int | None,
             report: Callable[[int, int], None] | None = None) -> "EventReader":
        """A reader of the bytes [start, end) of the plain file at ``path`` (to its end:
        None), ``start`` being an event's first byte; ``report(bytes, events)`` hears its
        progress."""
        stream = open(path, "rb")  # noqa: SIM115  (the part's process ends with it)
        stream.seek(start)
        reader = cls(stream, path, None)
        reader.offset, reader.limit = start, end
        reader.report_part = report
        return reader

    def stop_at(self, offset: int | None) -> None:
        """Stop reading the event array at ``offset`` of the file (None: at its end)."""
        self.limit = offset

    def part_result(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """This reader's rows, text tables and counts as plain data, to send to the
        reader of the whole file; ``metadata``: what ``read_array`` returned."""
        columns = self.columns
        return {
            "careful_used": self.careful_used,
            "numbered": bool(self.tid_names or self.big_ids),
            "columns": {field: np.concatenate(chunks) if chunks else None for field, chunks in columns.parts.items()},
            "texts": {field: codes.values for field, codes in columns.codes.items()},
            "skipped": self.damage.skipped,
            "repaired": self.damage.repaired,
            "dropped": self.damage.dropped,
            "ignored": self.damage.ignored,
            "lost_threads": self.damage.lost_threads,
            "truncated": self.damage.truncated,
            "not_read": self.not_read,
            "events_seen": self.events_seen,
            "bytes_read": self.bytes_read,
            "process_names": self.process_names,
            "metadata": metadata,
        }

    def absorb(self, part: dict[str, Any]) -> None:
        """A part's rows (``part_result``) after the ones read so far, its text codes
        renumbered into this reader's tables."""
        columns = self.columns
        renumber = {}
        for field, values in part["texts"].items():
            codes = columns.codes[field]
            renumber[field] = np.array([codes[v] for v in values], dtype="int32")
        for field, values in part["columns"].items():
            if values is None:
                continue
            if field in renumber and len(values):
                values = renumber[field][values]
            columns.parts[field].append(values)
        self.damage.skipped.update(part["skipped"])
        self.damage.repaired.update(part["repaired"])
        self.damage.dropped.update(part["dropped"])
        self.damage.ignored.update(part["ignored"])
        self.damage.lost_threads.update(part["lost_threads"])
        self.damage.truncated |= part["truncated"]
        self.not_read += part["not_read"]
        self.events_seen += part["events_seen"]
        self.bytes_read += part["bytes_read"]
        self.process_names.update(part["process_names"])

    def _without_far_times(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows whose times lie within MAX_SPREAD_NS of the trace's middle start; the
        others are damage (one event 150 years after the rest would make every span of
        the profile that long), skipped and counted."""
        if len(frame) < 2:
            return frame
        ts = frame["ts"].to_numpy(dtype=np.float64)
        end = ts + np.nan_to_num(frame["dur"].to_numpy(dtype=np.float64))
        middle = float(np.median(ts))
        reach = MAX_SPREAD_NS / 1e3  # in the trace's microseconds
        far = (np.abs(ts - middle) > reach) | (np.abs(end - middle) > reach)
        if not far.any():
            return frame
        self.damage.skipped[f"times more than {MAX_SPREAD_NS // DAY_NS} days from the rest"] += int(far.sum())
        return frame[~far].reset_index(drop=True)

    # -- the document -------------------------------------------------------------------

    def run(self) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any]]:
        buffer, start, metadata, array_form = self._head()
        if self.read_rest is not None:
            metadata.update(self.read_rest(self, buffer, start, array_form))
        else:
            metadata.update(self.read_array(buffer, start, array_form))
        if self.progress_events:  # the last blocks' events, parsed after their bytes were counted
            self.progress(self.file_size, self.file_size, events=self.events_seen)
        if self.cut_reason is not None:
            self.damage.truncated = True
        frame, self.damage.duplicates = _without_duplicates(self.columns.frame())
        frame = self._without_far_times(frame)
        self.not_read -= self.damage.lost_on_gpu(frame)  # (counted as damage instead)
        self.damage.count_durations(frame)
        self.damage.near_copies = _near_copies(frame)
        damaged = sum(self.damage.skipped.values())
        if self.damage.truncated and self.events_seen == 0:
            raise TraceError(f"{self.path} is truncated or corrupt: it ends after {self.bytes_read} bytes, "
                             f"before its first whole event")
        if len(frame) == 0 and damaged and not self.damage.truncated:
            reasons = ", ".join(f"{n} {r}" for r, n in self.damage.skipped.most_common())
            raise TraceError(f"{self.path} is not a Kineto trace advisor can read: none of its events could be "
                             f"read ({reasons})")
        metadata["_skipped_events"] = self.not_read + damaged
        # The JSON text's size: the file's, or what the gzip stream held where it ended
        # whole; a gzip stream cut off does not say how much it would have held.
        if self.gzipped:
            total = None if self.cut_reason is not None else self.bytes_read
        else:
            total = self.file_size
        metadata["_damage"] = self.damage.as_dict(self.bytes_read, total)
        return frame, metadata, self.process_names

    def _head(self) -> tuple[bytes, int, dict[str, Any], bool]:
        """Parse the top-level keys up to the event array. Returns the bytes read so far,
        where the first event starts in them, the keys, and whether the document is a bare
        array of events."""
        buffer = b""
        want = 1 << 16
        while True:
            while not self.eof and len(buffer) < want:
                buffer += self.read(want - len(buffer))
            # latin-1 maps each byte to one character, so positions in the text are
            # positions in the bytes; JSON's structure is ASCII, whatever the encoding.
            text = buffer.decode("latin-1")
            index = _SPACE.match(text).end()
            if text[index:index + 1] == "[":
                return buffer, index + 1, {}, True
            found = self._members_before_events(text, index + 1)
            if found is not None:
                start, spans = found
                return buffer, start, self._member_values(buffer, spans), False
            if self.eof or len(buffer) >= _HEAD_LIMIT:
                return self._head_resync(buffer)
            want = len(buffer) * 2

    def _members_before_events(self, text: str, index: int) -> tuple[int, list[tuple[str, int, int]]] | None:
        """Where traceEvents' array starts and the (key, start, end) of the keys before it,
        or None where the bytes so far do not reach it."""
        spans: list[tuple[str, int, int]] = []
        while True:
            index = _SPACE.match(text, index).end()
            if self.eof and text[index:index + 1] == "}" and _ONLY_SPACE.match(text, index + 1):
                raise TraceError(f"{self.path} is JSON but not a Kineto trace: it has no traceEvents")
            try:
                key, index = _DECODER_PY.raw_decode(text, index)
            except (ValueError, RecursionError):
                return None
            index = _SPACE.match(text, index).end()
            if not isinstance(key, str) or text[index:index + 1] != ":":
                return None
            index = _SPACE.match(text, index + 1).end()
            if key == "traceEvents" and text[index:index + 1] == "[":
                return index + 1, spans
            try:
                value, end = _DECODER_PY.raw_decode(text, index)
            except (ValueError, RecursionError):
                return None
            if key == "traceEvents":
                raise TraceError(f"{self.path} is not a Kineto trace: its traceEvents is a "
                                 f"{type(value).__name__}, not a list of events")
            spans.append((key, index, end))
            index = _SPACE.match(text, end).end()
            if text[index:index + 1] != ",":
                if self.eof and text[index:index + 1] == "}" and _ONLY_SPACE.match(text, index + 1):
                    raise TraceError(f"{self.path} is JSON but not a Kineto trace: it has no traceEvents")
                return None
            index += 1

    def _head_resync(self, buffer: bytes) -> tuple[bytes, int, dict[str, Any], bool]:
        """The keys before the events do not parse: find the event array by its key and
        read on from there, the damaged keys skipped."""
        found = _TRACE_EVENTS_KEY.search(buffer)
        if found is None:
            if len(buffer) >= _HEAD_LIMIT:
                raise TraceError(f"{self.path} is not a Kineto trace: no traceEvents in its first "
                                 f"{len(buffer)} bytes")
            raise TraceError(f"{self.path} is truncated or corrupt JSON: no event list in its {len(buffer)} bytes")
        self.damage.skipped["top-level key"] += 1
        return buffer, found.end(), {}, False

    def _member_values(self, data: bytes, spans: list[tuple[str, int, int]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, start, end in spans:
            try:
                out[key] = self._value(data[start:end])
            except (ValueError, RecursionError):
                self.damage.skipped["top-level key"] += 1
        return out

    def _value(self, data: bytes) -> Any:
        """A top-level value, parsed leniently: NaN and Infinity become None, invalid
        UTF-8 is replaced."""
        text = self._text(data)

        def constant(word: str) -> None:
            self.damage.repaired["NaN or Infinity"] += 1

        return json.loads(text, parse_constant=constant)

    def _text(self, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.damage.repaired["invalid UTF-8"] += 1
            return data.decode("utf-8", "replace")

    # -- the event array ----------------------------------------------------------------

    def read_array(self, buffer: bytes, pos: int, array_form: bool) -> dict[str, Any]:
        """Decode the event array from buffer[pos] on, chunk by chunk, up to the reader's
        limit (:meth:`stop_at`) or the file's end; returns the top-level keys after it."""
        want = BLOCK
        while True:
            while not self.eof and len(buffer) - pos < want:
                buffer = buffer[pos:] + self.read(max(BLOCK, want - (len(buffer) - pos)))
                pos = 0
            if self.eof:
                if self.limit is not None and self.cut_reason is None:
                    return self._stop(buffer, pos)
                return self._finish(buffer[pos:], array_form)
            # The last cut within ``want`` bytes: chunks stay near BLOCK whatever the buffer.
            cut = _last_cut(buffer, pos, min(len(buffer), pos + want))
            if cut is None:
                if want < _MAX_EVENT_BYTES:
                    want *= 2
                    continue
                # Hundreds of MB without the end of an event: damage, read past it.
                self.damage.skipped["unparseable"] += 1
                pos, want = pos + want, BLOCK
                continue
            end, following = cut
            used = self._decode(buffer, pos, end, final=end - pos >= _MAX_EVENT_BYTES)
            if used == end - pos:
                pos = following
                want = BLOCK
            else:
                # The chunk's last events did not decode: the cut before them may have
                # been inside one (a '},{' in a string). Read them again with more after.
                pos += used
                want = 2 * (len(buffer) - pos)

    def _stop(self, buffer: bytes, pos: int) -> dict[str, Any]:
        """The part's limit is reached: decode the events before it (all of them, where
        the limit falls between two events; otherwise the careful path says so)."""
        piece = _strip_events(buffer[pos:])
        if piece.strip():
            self._decode(piece, 0, len(piece), final=True)
        return {}

    def _finish(self, rest: bytes, array_form: bool) -> dict[str, Any]:
        """The last bytes of the file: the last events, the end of the array, and the
        top-level keys after it."""
        text = rest.decode("latin-1")
        closes = [m.end() for m in _ARRAY_END.finditer(text)]
        # The array ends at the first ']' after which the document ends properly. A ']'
        # that follows no event's brace is tried only for arrays of something else.
        # Most candidates are inside events (an args list of objects ends '}]') and are
        # rejected at the next character; the text parsed past candidates is bounded, so
        # a damaged end cannot cost a parse of the rest per bracket.
        budget = max(_PARSE_BUDGET, 4 * len(text))
        failed: set[int] = set()  # ends of values that a failed parse went through
        for candidates in (closes, [m.end() for m in _ANY_CLOSE.finditer(text)]):
            for close in candidates:
                if close in failed:
                    continue  # the parse from here is the rest of one that failed
                if budget < 0:
                    break
                spans, complete = _members_after_events(text, close, array_form)
                budget -= 1 + (spans[-1][2] - close if spans else 0)
                # A ']' inside the last event (a file cut off just after that event's
                # args) can be followed by what looks like the end of the document; the
                # braces since the last cut then do not balance.
                if complete and _balanced(rest, close - 1):
                    self._decode(rest, 0, len(_strip_events(rest[:close - 1])), final=True)
                    return self._member_values(rest, spans)
                if not complete:
                    failed.update(end for _, _, end in spans)
        # The array ended all the same where a ']' follows a whole event; what comes
        # after it is cut off (it does not end as a document does) or damaged.
        for close in closes[:_MAX_TRIES]:
            if self._ends_an_event(rest, close - 1):
                self._decode(rest, 0, len(_strip_events(rest[:close - 1])), final=True)
                spans, _ = _members_after_events(text, close, array_form)
                if text.rstrip().endswith("]" if array_form else "}"):
                    self.damage.skipped["end of the document"] += 1
                else:
                    self.damage.truncated = True
                return self._member_values(rest, spans)
        # The file ends inside the event array: keep every whole event. Where more of
        # the array follows the last one (a partial event, or nothing) the file was cut
        # off; the event the cut went through is not counted as damage.
        end = self._last_event_end(rest)
        self._decode(rest, 0, end, final=True)
        if _MORE_EVENTS.match(rest, end):
            self.damage.truncated = True
        else:
            self.damage.skipped["end of the document"] += 1
        return {}

    def _last_event_end(self, data: bytes) -> int:
        """Where the last whole event in data ends: at a '}' after the last cut, or else
        at the last cut."""
        cut = _last_cut(data, 0, len(data))
        floor = cut[0] if cut is not None else 0
        brace = data.rfind(b"}")
        for _ in range(64):  # braces inside the event the cut went through
            if brace < floor or brace < 0:
                break
            if self._ends_an_event(data, brace + 1):
                return brace + 1
            brace = data.rfind(b"}", 0, brace)
        return floor

    def _ends_an_event(self, data: bytes, close: int) -> bool:
        """Whether the bytes before data[close] end with a whole event."""
        cut = _last_cut(data, 0, close)
        start = cut[1] if cut is not None else 0
        piece = _strip_events(data[start:close]).lstrip(b" \t\r\n")
        if not piece.startswith(b"{"):
            return False
        for decoder in (_DECODER, _PLAIN_DECODER):  # an event of unexpected types is still whole
            try:
                decoder.decode(b"[" + piece + b"]")
            except _DECODE_ERRORS:
                continue
            return True
        return False

    # -- decoding -----------------------------------------------------------------------

    def _decode(self, buffer: bytes, start: int, end: int, *, final: bool) -> int:
        """Decode the events in buffer[start:end]; returns how many of those bytes were
        used. That is all of them, except where this is not the file's last chunk and its
        last events do not decode: the cut before them may have been inside one, so the
        caller reads them again with what follows."""
        view = memoryview(buffer)[start:end]
        # One copy, with the brackets that make the chunk a JSON array.
        array = b"".join((b"[", view, b"]"))
        try:
            self._add(_DECODER.decode(array))
            return end - start
        except _DECODE_ERRORS:
            pass
        try:
            self._add(_LOOSE_DECODER.decode(array), loose=True)
            return end - start
        except _DECODE_ERRORS:
            pass
        if self._plain(array):
            return end - start
        del array
        self.careful_used = True
        chunk = bytes(view)
        if not chunk.strip():
            return end - start
        return self._careful(chunk, final=final)

    def _plain(self, array: bytes) -> bool:
        """A chunk that is JSON but holds a field of a type the typed decoder does not take
        (an args list where a number belongs, a time as text): each event judged alone, field
        by field, so one odd field costs its events a check rather than the careful path's
        bisecting. False where the chunk is no JSON (damage, or a cut inside an event)."""
        try:
            values = _PLAIN_DECODER.decode(array)
        except _DECODE_ERRORS:
            return False
        events = []
        for value in values:
            if not isinstance(value, dict):
                self.damage.skipped["not an object"] += 1
                continue
            event = self._checked(value)
            if event is not None:
                events.append(event)
        self.events_seen += len(values) - len(events)  # the rest: read past, as the typed decoder does
        self._add(events)
        return True

    def _careful(self, chunk: bytes, *, final: bool) -> int:
        """Bisect a chunk that failed to decode until the pieces (between candidate cuts)
        that fail alone are found; join, repair or skip those."""
        cuts = list(EVENT_CUT.finditer(chunk))
        starts = [0] + [m.end() - 1 for m in cuts]
        ends = [m.start() + 1 for m in cuts] + [len(chunk)]
        results: list[tuple[int, list[Any] | None]] = []
        self._bisect(chunk, starts, ends, 0, len(starts), results)
        i = 0
        while i < len(results):
            first, events = results[i]
            if events is not None:
                self._add(events)
                i += 1
                continue
            run = i
            while run < len(results) and results[run][1] is None:
                run += 1
            last = results[run - 1][0]
            at_end = last == len(starts) - 1
            if at_end and not final:
                return starts[first]
            self._bad_run(chunk, starts, ends, first, last)
            i = run
        return len(chunk)

    def _bisect(self, chunk: bytes, starts: list[int], ends: list[int], lo: int, hi: int,
                out: list[tuple[int, list[Any] | None]]) -> None:
        if hi - lo == 1:
            out.append((lo, None))
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            try:
                out.append((a, _DECODER.decode(b"[" + chunk[starts[a]:ends[b - 1]] + b"]")))
            except _DECODE_ERRORS:
                self._bisect(chunk, starts, ends, a, b, out)

    def _bad_run(self, chunk: bytes, starts: list[int], ends: list[int], first: int, last: int) -> None:
        """Pieces first..last each failed alone. A piece may be part of an event that a
        false cut (a '},{' inside a string) split: try it joined with the next ones
        first; otherwise repair it alone or skip it."""
        k = first
        while k <= last:
            for m in range(k + 1, min(last, k + _MAX_JOIN) + 1):
                try:
                    events = _DECODER.decode(b"[" + chunk[starts[k]:ends[m]] + b"]")
                except _DECODE_ERRORS:
                    continue
                self._add(events)
                k = m + 1
                break
            else:
                self._add(self._salvage(chunk[starts[k]:ends[k]]))
                k += 1

    def _salvage(self, piece: bytes) -> list[Any]:
        """Bytes between two cuts that msgspec would not decode, read leniently value by
        value (a non-object in the array leaves no cut around it) and checked field by
        field. Returns the events kept; the others are counted, or ignored where they are
        of a phase that is not read anyway."""
        damage = self.damage
        constants = 0

        def constant(word: str) -> float:
            nonlocal constants
            constants += 1
            return float(word)

        decoder = json.JSONDecoder(parse_constant=constant)
        try:
            text, bad_utf8 = piece.decode("utf-8"), False
        except UnicodeDecodeError:
            text, bad_utf8 = piece.decode("utf-8", "replace"), True
        events = []
        index = _SPACE.match(text).end()
        while index < len(text):
            repaired = False
            try:
                value, index = decoder.raw_decode(text, index)
            except RecursionError:
                damage.skipped["nested too deep"] += 1
                break
            except ValueError:
                # The rest does not parse: one event, perhaps with torch's unescaped quotes.
                value = _repair_quotes(text[index:], constant)
                if value is None:
                    damage.skipped["unparseable"] += 1
                    break
                repaired, index = True, len(text)
            if not isinstance(value, dict):
                damage.skipped["not an object"] += 1
            else:
                event = self._checked(value)
                if event is not None:
                    events.append(event)
                    if repaired:
                        damage.repaired["unescaped quotes"] += 1
            index = _SPACE.match(text, index).end()
            if text[index:index + 1] == ",":
                index = _SPACE.match(text, index + 1).end()
        if events and constants:
            damage.repaired["NaN or Infinity"] += 1
        if events and bad_utf8:
            damage.repaired["invalid UTF-8"] += 1
        return events

    def _checked(self, event: dict[str, Any]) -> Any:
        """An event as a Python dict to the decoded struct, field by field."""
        damage = self.damage
        ph = event.get("ph")
        if ph == "M":
            args = event.get("args")
            if args is not None and not isinstance(args, dict):
                damage.repaired["wrong type"] += 1
                args = None
            return _Meta(name=event.get("name"), pid=event.get("pid"), tid=event.get("tid"), args=args)
        if ph != "X":
            if ph is not None and not isinstance(ph, str):
                damage.skipped["wrong type"] += 1
            elif ph is None or ph not in _READ_PAST:
                self._unknown_phase(event)
            return None  # another phase: not a row
        name, cat, ts, dur = event.get("name") or "", event.get("cat") or "", event.get("ts"), event.get("dur")
        if _is_number(name):
            name = str(name)
        pid, tid = event.get("pid", -1), event.get("tid", -1)
        if not isinstance(name, str) or not isinstance(cat, str) or not _is_id(pid) or not _is_id(tid):
            damage.skipped["wrong type"] += 1
            return None
        if ts is None:
            damage.skipped["missing ts"] += 1
            return None
        missing_dur = dur is None  # counted, not guessed: kept as NaN until the frame is read
        if missing_dur:
            dur = 0
        if not _is_number(ts) or not _is_number(dur):
            damage.skipped["wrong type"] += 1
            return None
        try:
            ts, dur = float(ts), float(dur)
        except OverflowError:  # an integer past what a float holds
            damage.skipped["time out of range"] += 1
            return None
        if not (math.isfinite(ts) and math.isfinite(dur)):
            damage.skipped["NaN or Infinity"] += 1
            return None
        if isinstance(pid, float):
            pid = _tid_number(pid, self.tid_names)
        if isinstance(tid, float):
            tid = _tid_number(tid, self.tid_names)
        args = event.get("args")
        if args is not None and not isinstance(args, dict):
            damage.repaired["wrong type"] += 1
            args = None
        return _Complete(name=name, cat=cat, ts=ts, dur=math.nan if missing_dur else dur, pid=pid, tid=tid,
                         args=self._checked_args(args) if args else _NO_ARGS)

    def _unknown_phase(self, event: dict[str, Any]) -> None:
        """Count an event of no phase, or of one outside the Trace Event Format: GPU
        activity by its category is lost work on the GPU (skipped); any other is dropped."""
        ph, cat = event.get("ph"), event.get("cat")
        if isinstance(cat, str) and CATEGORY_KIND.get(cat.lower()) in _GPU_KINDS:
            self.damage.skipped["GPU activity without a phase" if ph is None else "GPU activity of an unknown phase"] += 1
        else:
            self.damage.dropped["no phase" if ph is None else "unknown phase"] += 1

    def _checked_args(self, args: dict[str, Any]) -> _Args:
        fields: dict[str, Any] = {}
        wrong = 0
        for name, key, kind in _ARG_FIELDS:
            if key not in args:
                continue
            value = args[key]
            if value is None and kind is not msgspec.Raw:
                continue
            if kind is msgspec.Raw:
                try:
                    fields[name] = msgspec.Raw(json.dumps(value).encode())
                except (ValueError, TypeError, RecursionError):
                    wrong += 1
            elif kind is int:
                # Ints past int64, and text, are kept here; the columns deal with them.
                if type(value) is int or isinstance(value, str):
                    fields[name] = value
                elif not (isinstance(value, float) and not math.isfinite(value)):
                    wrong += 1  # (NaN and Infinity are counted as such where the text is read)
            elif kind is float:
                number = _as_float(value)
                if number is None:
                    wrong += 1
                else:
                    fields[name] = number
            elif isinstance(value, str):
                fields[name] = value
            else:
                wrong += 1
        if wrong:
            self.damage.repaired["wrong type"] += 1
        return _Args(**fields)

    # -- rows -------------------------------------------------------------------------

    def _add(self, events: list[Any], *, loose: bool = False) -> None:
        self.events_seen += len(events)
        complete = [e for e in events if type(e) is (_LooseComplete if loose else _Complete)]
        self.columns.add(complete, loose=loose)
        if len(complete) != len(events):
            for e in [e for e in events if type(e) is _Meta]:
                args = e.args if isinstance(e.args, dict) else {}
                self.process_names[f"{e.name}:{e.pid}:{e.tid}"] = args.get("name", args)


class _Columns:
    """The rows read so far. Each decoded chunk becomes arrays at once, while its structs
    are still in cache (reading them later, cold, costs several times more); text becomes
    codes into one table per column, so no chunk keeps a string of its own."""

    INTS = ("pid", "tid", "device", "stream", "correlation", "external_id", "bytes", "registers", "shared_memory",
            "sequence")
    TEXTS = ("name", "category", "call_stack", "input_dims", "input_types", "input_strides", "concrete_inputs",
             "grid", "block", "comm")
    FIELDS = (
        "name", "category", "ts", "dur", "pid", "tid", "device", "stream", "correlation", "external_id", "bytes",
        "registers", "shared_memory", "flops", "sequence", "input_dims", "input_types",
        "input_strides", "concrete_inputs", "call_stack", "grid", "block", "comm",
    )

    def __init__(self, reader: EventReader):
        self.reader = reader
        self.parts: dict[str, list[np.ndarray]] = {field: [] for field in self.FIELDS}
        self.parts.update({"@" + group: [] for group in _CARRIERS})  # which rows carry those fields
        self.codes = {field: _Codes() for field in self.TEXTS}
        self.raw_codes = {
            field: _RawCodes(self.codes[field], present)
            for field, present in (("input_dims", bool), ("input_types", bool), ("input_strides", bool),
                                   ("concrete_inputs", _any_true), ("grid", lambda v: v is not None),
                                   ("block", lambda v: v is not None), ("comm", bool))
        }
        self.empty = {field: self.codes[field][""] for field in self.raw_codes}
        self.carrier = np.zeros(0, dtype="int8")  # by category code: a _CARRIERS code, 0, or -1 for no kind
        self.thread_numbers = _ThreadNumbers(reader.tid_names)

    def add(self, events: list[_Complete], *, loose: bool = False) -> None:
        """One chunk's complete events to arrays; events of no known kind, or with no
        usable time, are counted and left out. ``loose``: the events' args may be of any
        type (_LooseComplete); each field's values are checked, and the wrong ones read as
        absent and counted."""
        if not events:
            return
        reader, codes = self.reader, self.codes
        category = np.array([codes["category"][e.cat] for e in events], dtype="int32")
        carrier = self._carriers()[category]
        known = carrier >= 0
        if not known.all():
            category = self._of_no_kind(events, category, known)
            carrier = self._carriers()[category]
            known = carrier >= 0
        ts = np.array([e.ts for e in events], dtype="float64")  # a missing ts is NaN here
        dur = np.array([e.dur for e in events], dtype="float64")
        # Times past what int64 nanoseconds hold cannot be placed on the timeline.
        usable = (np.abs(ts) < _MAX_US) & ~(np.abs(dur) >= _MAX_US)
        if not known.all() or not usable.all():
            reader.not_read += int((~known).sum())
            for reason, rows in (("missing ts", known & np.isnan(ts)),
                                 ("time out of range", known & ~np.isnan(ts) & ~usable)):
                if rows.any():
                    reader.damage.skipped[reason] += int(rows.sum())
            keep = known & usable
            events = list(compress(events, keep.tolist()))
            category, carrier, ts, dur = category[keep], carrier[keep], ts[keep], dur[keep]
            if not events:
                return
        args = [e.args for e in events]
        ints = self._loose_ints if loose else self._ints
        numbers = self.thread_numbers
        parts = self.parts
        parts["category"].append(category)
        parts["ts"].append(ts)
        parts["dur"].append(dur)  # NaN where missing or null: counted when the frame is read
        parts["name"].append(np.array([codes["name"][e.name] for e in events], dtype="int32"))
        # Below, a field that no event of the chunk carries (most traces record no call
        # stacks, strides or collectives) is seen by an identity count, in C, and skipped.
        stacks = [a.call_stack for a in args]
        if loose:
            stacks = [s if type(s) is str else "" if s is None else self._wrong("") for s in stacks]
        if stacks.count("") == len(stacks):
            parts["call_stack"].append(np.full(len(stacks), codes["call_stack"][""], dtype="int32"))
        else:
            parts["call_stack"].append(np.array([codes["call_stack"][s or ""] for s in stacks], dtype="int32"))
        parts["pid"].append(self._thread_ids([e.pid for e in events]))
        parts["tid"].append(self._thread_ids([e.tid for e in events]))
        parts["correlation"].append(ints([a.correlation for a in args], self._big_id))
        # "external id" (lower case) is an older spelling, read where the other is absent.
        external = [a.external_id for a in args]
        if external.count(-1):
            lower = [a.external_id_lower for a in args]
            if lower.count(-1) != len(lower):
                external = [e if e != -1 else e_lower for e, e_lower in zip(external, lower)]
        parts["external_id"].append(ints(external, self._big_id))
        # Fields that only some kinds carry are read for the rows of those kinds alone.
        carried = {}
        for group, code in _CARRIERS.items():
            rows = carrier == code
            parts["@" + group].append(rows)
            carried[group] = args if rows.all() else list(compress(args, rows.tolist()))
        gpu, op = carried["gpu"], carried["op"]
        parts["device"].append(ints([a.device for a in gpu]))
        parts["stream"].append(ints([a.stream for a in gpu]))
        parts["bytes"].append(ints([a.nbytes for a in gpu]))
        parts["registers"].append(ints([a.registers for a in gpu]))
        parts["shared_memory"].append(ints([a.shared_memory for a in gpu]))
        flops = [a.flops for a in op]
        if loose:
            flops = [v if type(v) in (float, int) else _NAN if v is None else self._wrong(_NAN) for v in flops]
        parts["flops"].append(np.array(flops, dtype="float64"))
        parts["sequence"].append(ints([a.sequence for a in op]))
        absent, raw_bytes = _NO_RAW, bytes
        groups, messages = [a.pg_name for a in op], [a.msg_nelems for a in op]
        if _all_absent(groups) and _all_absent(messages):
            comm = groups
        else:
            comm = [_comm_raw(a) for a in op]
        for field, raws in (("input_dims", [a.input_dims for a in op]),
                            ("input_types", [a.input_types for a in op]),
                            ("input_strides", [a.input_strides for a in op]),
                            ("concrete_inputs", [a.concrete_inputs for a in op]),
                            ("grid", [a.grid for a in gpu]),
                            ("block", [a.block for a in gpu]),
                            ("comm", comm)):
            table, empty = self.raw_codes[field], self.empty[field]
            if _all_absent(raws):
                parts[field].append(np.full(len(raws), empty, dtype="int32"))
            else:
                parts[field].append(np.array([empty if r is absent else table[raw_bytes(r)] for r in raws],
                                             dtype="int32"))

    def _carriers(self) -> np.ndarray:
        """By category code: its _CARRIERS code, 0, or -1 for a category of no kind."""
        values = self.codes["category"].values
        if len(self.carrier) < len(values):  # a category not seen before
            kinds = [CATEGORY_KIND.get(c.lower()) for c in values]
            self.carrier = np.array([-1 if k is None else _CARRIER_OF_KIND.get(k, 0) for k in kinds], dtype="int8")
        return self.carrier

    def _of_no_kind(self, events: list[_Complete], category: np.ndarray, known: np.ndarray) -> np.ndarray:
        """The chunk's categories, with GPU activity written without one given the category
        its args and name show (a repair, counted); the other events of no kind are counted
        by cause, to be left out. Real traces hold one such event (the profiler's span)."""
        damage = self.reader.damage
        codes = self.codes["category"]
        category = category.copy()
        lost = []
        for row in np.flatnonzero(~known).tolist():
            event = events[row]
            if event.cat:
                damage.drop_unknown_category(event.cat)
                continue
            guessed = _gpu_category(event.name, event.args)
            if guessed is not None:
                category[row] = codes[guessed]
                damage.repaired[REPAIRED_GPU] += 1
            else:
                damage.dropped["no category"] += 1
                lost.append(event)
        if lost:  # where they ran: GPU activity is told apart once the GPU's threads are known
            threads = zip(self._thread_ids([e.pid for e in lost]).tolist(), self._thread_ids([e.tid for e in lost]).tolist())
            for thread in threads:
                if thread in damage.lost_threads or len(damage.lost_threads) < _MAX_THREADS:
                    damage.lost_threads[thread] += 1
        return category

    def _thread_ids(self, values: list[Any]) -> np.ndarray:
        """pids or tids: ints as they are; digit strings and labels by their number."""
        array = np.array(values)
        if array.dtype.kind == "i":  # every one an int within int64
            return array.astype("int64", copy=False)
        numbers = self.thread_numbers
        return self._ints([v if type(v) is int else numbers[v] for v in values], self._label)

    def _ints(self, values: list[int | str | None], big: Callable[[int], int] | None = None) -> np.ndarray:
        try:  # (decimal text is converted here too, as int() reads it)
            return np.array(values, dtype="int64")
        except (TypeError, OverflowError, ValueError):  # a null, an int past int64, other text
            big = big or self._big_count
        if any(type(v) is str for v in values):
            values = [v if type(v) is not str else self._text_int(v) for v in values]
        return np.array([-1 if v is None else v if _INT64_MIN <= v <= _INT64_MAX else big(v) for v in values],
                        dtype="int64")

    def _loose_ints(self, values: list[Any], big: Callable[[int], int] | None = None) -> np.ndarray:
        """``_ints`` of values that may be of any type: what is no integer nor text (a
        boolean, a float, a list) is of the wrong type, read as absent."""
        values = [v if type(v) in (int, str) or v is None else self._wrong(None) for v in values]
        return self._ints(values, big)

    def _wrong(self, absent: Any) -> Any:
        """Count a field of the wrong type; ``absent`` is what it reads as."""
        self.reader.damage.repaired["wrong type"] += 1
        return absent

    def _text_int(self, text: str) -> int | None:
        """An id, device, stream or count written as text: hex ("0x1f", as ROCm writes
        streams) or decimal digits; other text is of the wrong type, read as absent (a
        repair)."""
        digits = text.strip()
        if _HEX.fullmatch(digits):
            return int(digits, 16)
        if _DECIMAL.fullmatch(digits):
            return int(digits)
        return self._wrong(None)

    def _label(self, value: int) -> int:
        """A pid or tid past int64: a label of its own."""
        self.reader.damage.repaired["integer past int64"] += 1
        return _tid_number(value, self.reader.tid_names)

    def _big_count(self, value: int) -> int:
        """A count or size past int64: unknown."""
        self.reader.damage.repaired["integer past int64"] += 1
        return -1

    def _big_id(self, value: int) -> int:
        """An id past int64 keeps its links: each distinct one gets a number of its own,
        above the ids traces write in practice."""
        self.reader.damage.repaired["integer past int64"] += 1
        big_ids = self.reader.big_ids
        return big_ids.setdefault(value, (1 << 62) + len(big_ids))

    def frame(self) -> pd.DataFrame:
        """All rows as one frame. A field that a kind does not carry is blank (-1, NaN or
        '') on the rows of other kinds, as if absent. The chunks' arrays are let go as
        each column is joined, so the rows are held about once, not twice; the reader is
        spent after this."""
        parts = self.parts

        def joined(field: str, dtype: str) -> np.ndarray:
            chunks = parts.pop(field)
            return np.concatenate(chunks) if chunks else np.array([], dtype=dtype)

        columns: dict[str, Any] = {}
        rows = sum(len(part) for part in parts["ts"])
        carried = {group: joined("@" + group, "bool") for group in _CARRIERS}
        for field in self.FIELDS:
            dtype = "int32" if field in self.TEXTS else "int64" if field in self.INTS else "float64"
            values = joined(field, dtype)
            group = _CARRIED_BY.get(field)
            if group is not None and len(values) < rows:  # read for that group's rows only
                full = np.full(rows, _NAN if dtype == "float64" else -1, dtype=dtype)
                full[carried[group]] = values
                values = full
            columns[field] = values
        for field in self.TEXTS:
            values = self.codes[field].values
            codes = columns[field]
            columns[field] = _spread_text(values + [""], np.where(codes >= 0, codes, len(values)))
        return pd.DataFrame(columns, copy=False)  # fresh arrays: kept as they are, not consolidated


def _last_cut(buffer: bytes, start: int, end: int) -> tuple[int, int] | None:
    """The last candidate cut in buffer[start:end]: (end of the event before it, start
    of the event after it), or None."""
    brace = buffer.rfind(b"}", start, end)
    while brace >= start:
        match = EVENT_CUT.match(buffer, brace, end)
        if match is not None:
            return brace + 1, match.end() - 1
        brace = buffer.rfind(b"}", start, brace)
    return None


def _balanced(data: bytes, close: int) -> bool:
    """Whether the braces and brackets between the last cut before data[close] and it
    balance (strings are not told apart: this only weeds out candidates)."""
    cut = _last_cut(data, 0, close)
    piece = data[cut[1] if cut is not None else 0:close]
    return piece.count(b"{") == piece.count(b"}") and piece.count(b"[") == piece.count(b"]")


def _members_after_events(text: str, index: int, array_form: bool) -> tuple[list[tuple[str, int, int]], bool]:
    """The (key, start, end) of the top-level keys from text[index] on (just after the
    event array's ']'), and whether the document then ends properly."""
    spans: list[tuple[str, int, int]] = []
    if array_form:
        return spans, _ONLY_SPACE.match(text, index) is not None
    index = _SPACE.match(text, index).end()
    while True:
        if text[index:index + 1] == "}":
            return spans, _ONLY_SPACE.match(text, index + 1) is not None
        if text[index:index + 1] != ",":
            return spans, False
        index = _SPACE.match(text, index + 1).end()
        if text[index:index + 1] != '"':
            return spans, False
        try:
            key, index = _DECODER_PY.raw_decode(text, index)
            index = _SPACE.match(text, index).end()
            if text[index:index + 1] != ":":
                return spans, False
            index = _SPACE.match(text, index + 1).end()
            _, end = _DECODER_PY.raw_decode(text, index)
        except (ValueError, RecursionError):
            return spans, False
        spans.append((key, index, end))
        index = _SPACE.match(text, end).end()


def _strip_events(data: bytes) -> bytes:
    """The event bytes before the closing bracket, without the trailing comma some
    writers leave."""
    return data.rstrip().rstrip(b",")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: Any) -> float | None:
    """A JSON number as a float, or None where it is no number or too large for one."""
    if not _is_number(value):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _is_id(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


# Keys of a Chrome-trace event object, which follow an event's name on the same line.
_NAME_END = re.compile(r'"(?=\s*(?:,\s*"(?:ph|cat|pid|tid|ts|dur|args|id|bp|s|cname|tts)"\s*:|\}))')
_NAME_START = re.compile(r'"name"\s*:\s*"')
_UNESCAPED_QUOTE = re.compile(r'(?<!\\)"')
_EVENT_KEY = re.compile(r'"ph"\s*:|\n')


def _repair_quotes(text: str, constant: Callable[[str], float]) -> dict[str, Any] | None:
    """torch writes some names without escaping their quotes (pytorch#146900):
    ``"name": "{"device": "cpu"}(12): run"``. The name's true end is a quote followed by
    the event's next key (or its closing brace); escape the quotes before it and parse
    again, trying the shortest such name first. A name that would swallow another event's
    keys is no name."""
    start = _NAME_START.search(text)
    if start is None:
        return None
    for end in [m.start() for m in _NAME_END.finditer(text, start.end())][:64]:
        name = text[start.end():end]
        if _EVENT_KEY.search(name):
            break
        try:
            value = json.loads(text[:start.end()] + _UNESCAPED_QUOTE.sub(r'\\"', name) + text[end:],
                               parse_constant=constant)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


class ReadAgain(Exception):
    """Reading in parts would not give exactly what one process reads: read the file
    again, from the start, in one process (advisor.importers.parts)."""


def read_events(stream: BinaryIO, path: Path, *, progress: Callable[[int, int], None] | None = None,
                in_parts: Callable[..., dict[str, Any]] | None = None
                ) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any]]:
    """Read the events of a Kineto trace.

    Returns the raw event columns (timestamps still in the file's microseconds; shapes,
    types and launch geometry as compact JSON text), the top-level metadata, and
    process/thread names from the 'M' events. The metadata also holds
    ``_skipped_events`` (complete events not read: of a category the Session has no kind
    for, or damaged) and ``_damage`` ({"skipped": {reason: n}, "repaired": {reason: n},
    "truncated": bool, "bytes_read": int, "bytes_total": int, or None where a gzip stream
    was cut off}; bytes are those of the JSON text, after gunzip). ``progress(done, total)``, where given, hears how many
    bytes of the file have been read; one that takes an ``events`` keyword hears how many
    events were parsed so far as well. ``in_parts``: how to read the event array in parts
    where the file allows (advisor.importers.parts.read_in_parts, given by the loader);
    None reads it in this process.
    """
    try:
        return EventReader(stream, path, progress, read_rest=in_parts).run()
    except ReadAgain:
        stream.seek(0)
        return EventReader(stream, path, progress).run()


def _takes_events(progress: Callable[..., None]) -> bool:
    import inspect

    try:
        parameters = inspect.signature(progress).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "events" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _ns(values: np.ndarray) -> np.ndarray:
    """Microseconds (as the file wrote them) to integer nanoseconds, without rounding
    the whole value through a float product: the integer part is scaled exactly and
    only the fraction is rounded (to the nearest ns)."""
    whole = np.floor(values)
    return whole.astype("int64") * 1000 + np.rint((values - whole) * 1000).astype("int64")


def events_from_raw(raw: pd.DataFrame) -> pd.DataFrame:
    """Raw Kineto columns to the Session's event schema (before attribution). Each lookup
    is made once per distinct category or name, then spread over the rows by code."""
    category = raw["category"].astype("category")
    categories = [str(c) for c in category.cat.categories]
    category_codes = category.cat.codes.to_numpy()
    known = category_codes >= 0
    codes = np.where(known, category_codes, len(categories))  # a missing category: the last slot
    kinds = [CATEGORY_KIND.get(c.lower(), "") for c in categories] + [""]
    kind = _spread_text(kinds, codes)
    is_gpu = np.array([k in _GPU_KINDS for k in kinds])[codes]
    is_memcpy = np.array([k == "memcpy" for k in kinds])[codes]
    start = _ns(raw["ts"].to_numpy(dtype="float64"))
    duration = np.maximum(_ns(raw["dur"].to_numpy(dtype="float64")), 0)
    device = raw["device"].to_numpy(copy=True)
    device = np.where(is_gpu & (device < 0), raw["pid"].to_numpy(), device)
    device = np.where(is_gpu, device, -1)
    stream = raw["stream"].to_numpy(copy=True)
    stream = np.where(is_gpu & (stream < 0), raw["tid"].to_numpy(), stream)
    events = pd.DataFrame({
        "name": raw["name"],
        "kind": kind,
        "category": category,
        "start_ns": start,
        "end_ns": start + duration,
        "pid": raw["pid"],
        "tid": raw["tid"],
        "device": device,
        "stream": stream,
        "correlation": raw["correlation"],
        "external_id": raw["external_id"],
        "input_dims": _text_categories(raw["input_dims"]),
        "input_types": _text_categories(raw["input_types"]),
        "input_strides": _text_categories(raw["input_strides"]),
        "concrete_inputs": _text_categories(raw["concrete_inputs"]),
        "comm": _text_categories(raw["comm"]),
        "call_stack": raw["call_stack"],
        "bytes": raw["bytes"],
        "grid": _text_categories(raw["grid"]),
        "block": _text_categories(raw["block"]),
        "registers": raw["registers"],
        "shared_memory": raw["shared_memory"],
        "flops": raw["flops"],
        "sequence": raw["sequence"],
    }, copy=False)  # raw's columns are shared (copy-on-write), not copied and consolidated
    # Copy direction and memory kinds are spelled in the copy's name; parse each
    # distinct name once.
    names = events["name"].astype("category")
    parsed = [_COPY_NAME.search(str(n)) for n in names.cat.categories]
    name_codes = names.cat.codes.to_numpy()
    name_codes = np.where(is_memcpy & (name_codes >= 0), name_codes, len(parsed))  # not a copy: the last slot
    for column, group in (("copy_kind", 1), ("src_memory", 2), ("dst_memory", 3)):
        events[column] = _spread_text([m.group(group) if m else "" for m in parsed] + [""], name_codes)
    return events


def _spread_text(values: list[str], codes: np.ndarray) -> pd.Categorical:
    """values[codes] as a categorical of the values used, sorted (as pd.Categorical of
    the same strings would have them), without building a string per row."""
    joined = "\0".join(values)
    if valid_text(joined) is not joined:  # a lone surrogate in a name: replaced, as every writer needs
        values = [valid_text(v) for v in values]
    used = np.bincount(codes, minlength=len(values)) > 0 if len(codes) else np.zeros(len(values), dtype=bool)
    present = sorted({v for v, u in zip(values, used) if u})
    position = {v: i for i, v in enumerate(present)}
    # Codes in the smallest type that holds them, as pandas would keep them: one pass, no recast.
    small = np.int8 if len(present) < 127 else np.int16 if len(present) < 32_767 else np.int32
    remap = np.array([position.get(v, -1) for v in values], dtype=small)
    return pd.Categorical.from_codes(remap[codes], categories=pd.Index(present, dtype=object).astype(str))


def _text_categories(column: pd.Series) -> pd.Categorical:
    """A raw text column (compact JSON already) as a categorical of str, '' for missing."""
    values = column.astype("category")
    categories = [str(c) for c in values.cat.categories]
    codes = values.cat.codes.to_numpy()
    return _spread_text(categories + [""], np.where(codes >= 0, codes, len(categories)))
