"""Fuzz advisor's inputs: mutated traces and special files through `advisor diagnose`.

Each input is a real trace (../shared/traces/bert_small_infer_h100.json.gz where it
exists, else a synthetic one from benchmarks/synth.py) with one mutation, of three
families:

- bytes, as a damaged file shows: cut off (plain or gzipped), a byte flipped, a key
  deleted, a value of the wrong type, a NaN or Infinity literal, an id past int64,
  invalid UTF-8 in a name, torch's unescaped quotes, nesting 100 000 deep, garbage after;
- JSON-aware: one event's field (name, cat, ph, ts, dur, pid, tid, args and the args
  advisor reads) missing, null, or of another type or value (text, a list, an object, a
  boolean, negative, past int64, a float, NaN, Infinity, empty or a megabyte of text); and
  the whole document reshaped: durations removed or zero, a lone surrogate, a NUL, control
  or right-to-left characters in names, ProfilerStep numbers past int64, no events,
  events not a list, a byte-order mark, UTF-16, double or empty gzip, distributedInfo and
  deviceProperties of the wrong types or sizes;
- special files named like a trace: a FIFO, a folder, links to /dev/zero and /dev/null, a
  dangling link, a file name that is not UTF-8;
- what the reader must say or read as it is (LOSS_KINDS): events it leaves out, repairs or
  cannot tie to a launch (kernels or events without a category, an unknown category or
  phase, kernels without args, correlations that match nothing), fields of the types other
  writers use (streams as hex text, devices and ids as text, an arg of the wrong type in
  every event), and events written twice (all of them, or some).

Every input goes through `advisor diagnose FILE --format json` (the command line's own
entry point, in a pool of worker processes, 60 s each) and ends as one of:

    full report      exit 0, a report valid against its schema that notes no damage
    salvaged report  exit 0, a valid report that says what was skipped, repaired or cut off
    clean error      a non-zero exit with one `advisor:` line
    silent drop      a report that says nothing of what its input lost (a loss kind whose
                     report notes nothing), or one whose findings moved where its input
                     only spelled the same profile another way (or twice)
    internal error   `advisor: internal error` on stderr
    traceback        an exception escaped, or more than one line of error
    hang             no answer in 60 s

A rule that failed (one `advisor: rule ... failed` line, a note in the report) is listed
below the table; the run goes on.

    python benchmarks/fuzz.py --n 2000
    python benchmarks/fuzz.py --each 1 --events 1500      # every kind once (the test suite's run)
    python benchmarks/fuzz.py --n 200 --seed 3 --base trace.json.gz
    python benchmarks/fuzz.py --each 40 --loss-kinds     # what the reader must say, 40 of each
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import io
import json
import math
import multiprocessing
import os
import random
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "traces" / "bert_small_infer_h100.json.gz"
OUTCOMES = ("full report", "salvaged report", "clean error", "silent drop", "internal error", "traceback", "hang")
BAD = ("silent drop", "internal error", "traceback", "hang")
TIMEOUT_S = 60
_KEY = re.compile(rb'"(dur|ts|pid|tid|cat|name|args|External id|correlation|Input Dims|ph)": ?')
_NUMBER = re.compile(rb'(?<=": )-?\d+(\.\d+)?')
_NAME = re.compile(rb'"name": ?"([^"\\]{2,40})"')


def _at(rng: random.Random, data: bytes, pattern: re.Pattern) -> re.Match | None:
    matches = list(pattern.finditer(data, 0, min(len(data), 400_000)))
    return rng.choice(matches) if matches else None


def _value_end(data: bytes, start: int) -> int:
    """Where the JSON value starting at ``start`` ends (the next , } or ] at its depth)."""
    depth, i = 0, start
    while i < len(data):
        c = data[i]
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            if depth == 0:
                return i
            depth -= 1
        elif c == ord(",") and depth == 0:
            return i
        elif c == ord('"'):
            i += 1
            while i < len(data) and data[i] != ord('"'):
                i += 2 if data[i] == ord("\\") else 1
        i += 1
    return i


def _replace_value(data: bytes, match: re.Match, new: bytes) -> bytes:
    """Replace the value that follows a "key": match."""
    return data[:match.end()] + new + data[_value_end(data, match.end()):]


BYTE_KINDS = ("truncated", "truncated gzip", "byte flip", "deleted key", "wrong type", "NaN literal", "64-bit id",
              "invalid UTF-8", "unescaped quote", "category list", "deep nesting", "garbage after")


def mutate(rng: random.Random, data: bytes, kind: str | None = None) -> tuple[str, bytes, bool]:
    """(mutation kind, the file's bytes, whether they are gzipped): one byte-level mutation."""
    kind = kind or rng.choice(BYTE_KINDS)
    if kind == "truncated":
        return kind, data[:rng.randrange(1, len(data))], False
    if kind == "truncated gzip":  # the whole trace gzipped, the gzip stream cut
        packed = gzip.compress(data)
        return kind, packed[:rng.randrange(20, len(packed))], True
    if kind == "byte flip":
        at = rng.randrange(len(data))
        return kind, data[:at] + bytes([rng.choice(b'{}[]",:\\ 0aN\xff\x00')]) + data[at + 1:], False
    if kind == "deleted key":
        match = _at(rng, data, _KEY)
        if match is None:
            return kind, data, False
        end = _value_end(data, match.end())
        end += 1 if data[end:end + 1] == b"," else 0
        return kind, data[:match.start()] + data[end:], False
    if kind == "wrong type":
        match = _at(rng, data, _KEY)
        new = rng.choice([b"[1, 2]", b'{"a": 1}', b'"x"', b"true", b"null", b"-1e999"])
        return kind, _replace_value(data, match, new) if match else data, False
    if kind in ("NaN literal", "64-bit id"):
        match = _at(rng, data, _NUMBER)
        new = rng.choice([b"NaN", b"Infinity", b"-Infinity"]) if kind == "NaN literal" else \
            rng.choice([b"18446744073709551615", b"1180591620717411303424", b"-9223372036854775809"])
        return kind, data[:match.start()] + new + data[match.end():] if match else data, False
    if kind in ("invalid UTF-8", "unescaped quote"):
        match = _at(rng, data, _NAME)
        if match is None:
            return kind, data, False
        inner = match.group(1)
        middle = len(inner) // 2
        new = inner[:middle] + (b"\xff\xfe" if kind == "invalid UTF-8" else b'"quoted"') + inner[middle:]
        return kind, data[:match.start(1)] + new + data[match.end(1):], False
    if kind == "category list":
        return kind, data.replace(b'"cat": "', b'"cat": ["', 1).replace(b'", "name"', b'"], "name"', 1), False
    if kind == "deep nesting":
        at = data.find(b'"traceEvents": [') + len(b'"traceEvents": [')
        return kind, data[:at] + b"[" * 100_000 + b"]" * 100_000 + b"," + data[at:], False
    return kind, data + rng.choice([b"garbage", b"\x00\x00\x00", b"]}]}", b"{"]), False


# -- JSON-aware: one event's field given another type or value -------------------------------------

EVENT_FIELDS = ("name", "cat", "ph", "ts", "dur", "pid", "tid", "args")
ARG_FIELDS = ("External id", "correlation", "Input Dims", "stream", "device")
VALUES = {
    "missing": None, "null": lambda: None, "text": lambda: "x", "list": lambda: [1, [2]], "object": lambda: {"a": 1},
    "boolean": lambda: True, "negative": lambda: -5, "past int64": lambda: 2**64 + 7, "float": lambda: 3.75,
    "NaN": lambda: math.nan, "Infinity": lambda: math.inf, "empty text": lambda: "",
    "megabyte of text": lambda: "y" * 1_000_000,
}
# Each field with the values a damaged or hand-written trace gives it: a kind each.
FIELD_KINDS = tuple(f"{field}: {value}" for field in EVENT_FIELDS for value in VALUES) + tuple(
    f"args.{field}: {value}" for field in ARG_FIELDS for value in ("missing", "text", "list", "negative",
                                                                   "past int64", "NaN"))


def _field_mutation(kind: str, rng: random.Random, doc: dict) -> dict:
    field, _, value = kind.partition(": ")
    events = list(doc["traceEvents"])
    candidates = [i for i, e in enumerate(events) if isinstance(e, dict) and e.get("ph") == "X"
                  and (not field.startswith("args.") or field[5:] in (e.get("args") or {}))] or [0]
    at = rng.choice(candidates)
    event = dict(events[at])
    if field.startswith("args."):
        args = dict(event.get("args") or {})
        target, key = args, field[5:]
    else:
        target, key = event, field
    if value == "missing":
        target.pop(key, None)
    else:
        target[key] = VALUES[value]()
    if target is not event:
        event["args"] = target
    events[at] = event
    return {**doc, "traceEvents": events}


# -- JSON-aware: the whole document reshaped ---------------------------------------------------------


def _each_x(doc: dict, change) -> dict:
    events = []
    for i, event in enumerate(doc["traceEvents"]):
        if isinstance(event, dict) and event.get("ph") == "X":
            event = change(dict(event), i)
        events.append(event)
    return {**doc, "traceEvents": events}


def _renamed(doc: dict, rng: random.Random, insert: str) -> dict:
    names = [i for i, e in enumerate(doc["traceEvents"]) if isinstance(e, dict) and isinstance(e.get("name"), str)]
    chosen = set(rng.sample(names, min(len(names), 20)))
    return _each_x(doc, lambda e, i: {**e, "name": e["name"][:3] + insert + e["name"][3:]} if i in chosen else e)


def _without(event: dict, key: str) -> dict:
    event.pop(key, None)
    return event


DOCUMENT_KINDS = {
    "durations removed": lambda rng, doc: _each_x(doc, lambda e, i: _without(e, "dur")),
    "durations zero": lambda rng, doc: _each_x(doc, lambda e, i: {**e, "dur": 0}),
    "one duration in ten removed": lambda rng, doc: _each_x(doc, lambda e, i: _without(e, "dur") if i % 10 == 3 else e),
    "negative durations": lambda rng, doc: _each_x(doc, lambda e, i: {**e, "dur": -abs(e.get("dur") or 1)}),
    "lone surrogate in names": lambda rng, doc: _renamed(doc, rng, "\ud800"),
    "NUL in names": lambda rng, doc: _renamed(doc, rng, "\x00"),
    "control characters in names": lambda rng, doc: _renamed(doc, rng, "\x1b[2J\x07\r"),
    "right-to-left override in names": lambda rng, doc: _renamed(doc, rng, "\u202egnp.exe"),
    "HTML in names": lambda rng, doc: _renamed(doc, rng, "<script>alert(1)</script>"),
    "step numbers past int64": lambda rng, doc: _each_x(doc, lambda e, i: {**e, "name": "ProfilerStep#" + "9" * 23}
                                                        if str(e.get("name", "")).startswith("ProfilerStep") else e),
    "repeated step numbers": lambda rng, doc: _each_x(doc, lambda e, i: {**e, "name": "ProfilerStep#1"}
                                                      if str(e.get("name", "")).startswith("ProfilerStep") else e),
    "timestamps past int64 ns": lambda rng, doc: _each_x(doc, lambda e, i: {**e, "ts": 2.0**70} if i % 7 == 0 else e),
    "no events": lambda rng, doc: {**doc, "traceEvents": []},
    "events not a list": lambda rng, doc: {**doc, "traceEvents": {"a": 1}},
    "top-level list": lambda rng, doc: doc["traceEvents"],
    "top-level number": lambda rng, doc: 7,
    "deviceProperties wrong types": lambda rng, doc: {**doc, "deviceProperties": [{"id": "zero", "name": 5,
                                                                                   "numSms": "many"}]},
    "deviceProperties not a list": lambda rng, doc: {**doc, "deviceProperties": "gpu"},
    "distributedInfo a trillion ranks": lambda rng, doc: {**doc, "distributedInfo": {"rank": 2**64,
                                                                                     "world_size": 10**12}},
    "distributedInfo wrong types": lambda rng, doc: {**doc, "distributedInfo": ["nccl"]},
    "metadata a megabyte deep": lambda rng, doc: {**doc, "traceName": "z" * 1_000_000},
}
# Whole-file encodings: (kind, the JSON text's bytes -> the file's bytes).
ENCODING_KINDS = {
    "byte-order mark": lambda data: b"\xef\xbb\xbf" + data,
    "UTF-16": lambda data: data.decode("utf-8", "surrogatepass").encode("utf-16"),
    "gzip twice": lambda data: gzip.compress(gzip.compress(data)),
    "empty gzip": lambda data: gzip.compress(b""),
    "gzip of garbage": lambda data: gzip.compress(bytes(range(256)) * 64),
}


# -- what the reader must say, or read as it is ---------------------------------------------------


def _some_x(doc: dict, rng: random.Random, change, share: float = 0.1, where=lambda e: True) -> dict:
    """``change`` applied to a share of the complete events (at least one) that ``where`` picks."""
    chosen = [i for i, e in enumerate(doc["traceEvents"]) if isinstance(e, dict) and e.get("ph") == "X" and where(e)]
    picked = set(rng.sample(chosen, max(1, int(len(chosen) * share)))) if chosen else set()
    return _each_x(doc, lambda e, i: change(e) if i in picked else e)


def _of(category: str):
    return lambda e: e.get("cat") == category


def _args_changed(doc: dict, change) -> dict:
    """Every complete event's args through ``change`` (a dict -> the dict's new items)."""
    return _each_x(doc, lambda e, i: {**e, "args": {**e["args"], **change(e["args"])}}
                   if isinstance(e.get("args"), dict) else e)


def _as_text(args: dict, key: str, spell) -> dict:
    value = args.get(key)
    return {key: spell(value)} if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else {}


def _unmatched(doc: dict, rng: random.Random) -> dict:
    """Half the kernels given correlation ids that no launch carries."""
    def moved(event: dict) -> dict:
        args = event.get("args")
        if not isinstance(args, dict) or not isinstance(args.get("correlation"), int):
            return event
        return {**event, "args": {**args, "correlation": args["correlation"] + 10**12}}

    return _some_x(doc, rng, moved, 0.5, _of("kernel"))


def _twice(doc: dict, rng: random.Random, share: float) -> dict:
    events = doc["traceEvents"]
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    again = complete if share >= 1 else rng.sample(complete, max(1, int(len(complete) * share)))
    return {**doc, "traceEvents": events + json.loads(json.dumps(again))}


def _shifted_copy(doc: dict) -> dict:
    """Every complete event written again 1 ns later (a trace joined with a shifted copy)."""
    events = doc["traceEvents"]
    again = [{**e, "ts": e["ts"] + 0.001} for e in events
             if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    return {**doc, "traceEvents": events + again}


def _marked_as_ranks(doc: dict, rng: random.Random) -> dict:
    """Two instant events and two complete ones carrying a rank and a pid's original, as a
    merged trace's events do."""
    first = next((e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"), {})
    ts = first.get("ts", 0)
    marks = [{"ph": "i", "s": "t", "name": "mark", "pid": 1, "tid": 1, "ts": ts, "args": {"rank": r, "pid_raw": 1}}
             for r in (0, 1)]
    return {**doc, "traceEvents": marks + doc["traceEvents"]}


# Each: (the change, what the report must do). "said": its notes (or profile-incomplete)
# say what was lost or repaired; "same": its findings are the unchanged trace's (rule and
# severity); both where both hold.
LOSS_KINDS = {
    "kernels without a category": (lambda rng, doc: _each_x(doc, lambda e, i: _without(e, "cat")
                                                           if e.get("cat") == "kernel" else e), {"said"}),
    "events without a category": (lambda rng, doc: _some_x(doc, rng, lambda e: _without(e, "cat")), {"said"}),
    "events of an unknown category": (lambda rng, doc: _some_x(doc, rng, lambda e: {**e, "cat": "my_counter"}),
                                      {"said"}),
    "kernels without args": (lambda rng, doc: _some_x(doc, rng, lambda e: _without(e, "args"), 0.5, _of("kernel")),
                             {"said"}),
    "correlations that match nothing": (lambda rng, doc: _unmatched(doc, rng), {"said"}),
    "events of an unknown phase": (lambda rng, doc: _some_x(doc, rng, lambda e: {**e, "ph": "Z"}), {"said"}),
    "events without a phase": (lambda rng, doc: _some_x(doc, rng, lambda e: _without(e, "ph")), {"said"}),
    "streams as hex text": (lambda rng, doc: _args_changed(doc, lambda a: _as_text(a, "stream", hex)), {"same"}),
    "devices as text": (lambda rng, doc: _args_changed(doc, lambda a: _as_text(a, "device", str)), {"same"}),
    "ids as text": (lambda rng, doc: _args_changed(doc, lambda a: {**_as_text(a, "correlation", hex),
                                                                   **_as_text(a, "External id", str)}), {"same"}),
    "an arg of the wrong type in every kernel": (lambda rng, doc: _each_x(
        doc, lambda e, i: {**e, "args": {**e["args"], "registers per thread": [e["args"]["registers per thread"]]}}
        if e.get("cat") == "kernel" and "registers per thread" in (e.get("args") or {}) else e), {"said"}),
    "every event twice": (lambda rng, doc: _twice(doc, rng, 1.0), {"said", "same"}),
    "every event again 1 ns later": (lambda rng, doc: _shifted_copy(doc), {"said"}),
    "one event 150 years later": (lambda rng, doc: _some_x(doc, rng, lambda e: {**e, "ts": e["ts"] + 4.7e15}, 0.0),
                                  {"said"}),
    # A merged trace's marks where there is no merge: read as the one trace it is.
    "two events marked as ranks": (lambda rng, doc: _marked_as_ranks(doc, rng), {"same"}),
    "every event its own rank": (lambda rng, doc: _each_x(doc, lambda e, i: {
        **e, "args": {**(e.get("args") if isinstance(e.get("args"), dict) else {}), "rank": i,
                      "pid_raw": e.get("pid")}}), {"same"}),
    "some events twice": (lambda rng, doc: _twice(doc, rng, 0.1), {"said", "same"}),
}

# Not a trace at all, named like one.
SPECIAL_KINDS = ("FIFO", "folder", "link to /dev/zero", "link to /dev/null", "dangling link", "file name not UTF-8")

ALL_KINDS = (*BYTE_KINDS, *FIELD_KINDS, *DOCUMENT_KINDS, *ENCODING_KINDS, *SPECIAL_KINDS, *LOSS_KINDS)


def make_input(kind: str, rng: random.Random, data: bytes, doc: dict, folder: Path, i: int) -> str:
    """The path of one input of ``kind``, written in ``folder``."""
    path = folder / f"t{i}.json"
    if kind in BYTE_KINDS:
        _, mutated, gz = mutate(rng, data, kind)
        path = path.with_name(path.name + (".gz" if gz else ""))
        path.write_bytes(mutated)
    elif kind in FIELD_KINDS or kind in DOCUMENT_KINDS or kind in LOSS_KINDS:
        changed = (_field_mutation(kind, rng, doc) if kind in FIELD_KINDS else DOCUMENT_KINDS[kind](rng, doc)
                   if kind in DOCUMENT_KINDS else LOSS_KINDS[kind][0](rng, doc))
        path.write_bytes(json.dumps(changed, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass"))
    elif kind in ENCODING_KINDS:
        path = path.with_name(path.name + (".gz" if "gzip" in kind else ""))
        path.write_bytes(ENCODING_KINDS[kind](data))
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind.startswith("link to "):
        path.symlink_to(kind[len("link to "):])
    elif kind == "dangling link":
        path.symlink_to(folder / "nowhere.json")
    elif kind == "file name not UTF-8":
        path = folder / os.fsdecode(f"t{i}-\xe9".encode("latin-1") + b".json")
        path.write_bytes(data)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return str(path)


def findings_of(report: dict) -> list[tuple[str, str]]:
    return [(f["rule"], f["severity"]) for f in report["findings"]]


def run_one(path: str, expects: frozenset[str] = frozenset(), base: list | None = None
            ) -> tuple[str, str, list[str], list | None]:
    """(outcome, detail, rules that failed, findings) of `advisor diagnose PATH --format
    json` in this process. ``expects``: "said" where the input lost something its report
    must say, "same" where its findings must be ``base``'s."""
    from advisor.cli import main
    from advisor.reports.schema import validate_report

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["diagnose", path, "--format", "json"])
    except BaseException as exc:  # noqa: BLE001  (what the fuzz looks for)
        return "traceback", f"{type(exc).__name__}: {exc}"[:200], [], None
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    failed = [line[:200] for line in lines if re.match(r"advisor: rule \S+ failed", line)]
    if any("internal error" in line for line in lines):
        return "internal error", next(line for line in lines if "internal error" in line)[:200], failed, None
    if code != 0:
        ok = len(lines) == 1 and lines[0].startswith("advisor: ")
        return ("clean error" if ok else "traceback"), (lines[-1] if lines else "")[:200], failed, None
    if any("Traceback" in line for line in lines):
        return "traceback", lines[-1][:200], failed, None
    try:
        report = json.loads(out.getvalue())
        validate_report(report)
    except Exception as exc:  # noqa: BLE001
        return "traceback", f"invalid report: {exc}"[:200], failed, None
    damaged = any(re.search(r"skipped|repaired|cut off|damaged|could not|left out|copies|tied to no launch", n)
                  for n in report["notes"]) or any(f["rule"] == "profile-incomplete" for f in report["findings"])
    found = findings_of(report)
    if "said" in expects and not damaged:
        return "silent drop", "the report says nothing of what the input lost", failed, found
    if "same" in expects and base is not None and found != base:
        return "silent drop", f"findings {found} where the trace as written gives {base}"[:200], failed, found
    return ("salvaged report" if damaged else "full report"), "", failed, found


def base_trace(events: int = 20_000) -> bytes:
    if SHARED.is_file() and events >= 20_000:
        return gzip.decompress(SHARED.read_bytes())
    sys.path.insert(0, str(HERE))
    from synth import generate

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "base.json"
        generate(path, events, ops_per_step=max(10, min(400, events // 30)))
        return path.read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="inputs, each of a kind drawn at random")
    parser.add_argument("--each", type=int, help="instead: this many inputs of every kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--events", type=int, default=20_000,
                        help="events of the synthetic base trace (below 20 000 it is used even where the shared "
                             "trace exists)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds an input may take")
    parser.add_argument("--base", type=Path, help="the trace to mutate (default: the shared BERT trace)")
    parser.add_argument("--loss-kinds", action="store_true",
                        help="only the kinds whose report must say what was lost or find the same (LOSS_KINDS)")
    args = parser.parse_args(argv)
    os.environ["ADVISOR_NO_CACHE"] = "1"
    os.environ["ADVISOR_NO_PROGRESS"] = "1"
    data = (gzip.decompress(args.base.read_bytes()) if args.base and args.base.suffix == ".gz"
            else args.base.read_bytes() if args.base else base_trace(args.events))
    doc = json.loads(data)
    rng = random.Random(args.seed)
    drawn = tuple(LOSS_KINDS) if args.loss_kinds else ALL_KINDS
    kinds = [k for k in drawn for _ in range(args.each)] if args.each else [rng.choice(drawn) for _ in range(args.n)]
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[tuple[str, str], str] = {}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as folder:
        # The trace as written: what a loss kind that only spells it another way must give.
        unchanged = Path(folder) / "unchanged.json"
        unchanged.write_bytes(data)
        base = run_one(str(unchanged))[3]
        jobs = [(kind, make_input(kind, rng, data, doc, Path(folder), i)) for i, kind in enumerate(kinds)]
        context = multiprocessing.get_context("spawn")
        pool = context.Pool(args.workers)

        def submit(kind: str, path: str):
            expects = frozenset(LOSS_KINDS[kind][1]) if kind in LOSS_KINDS else frozenset()
            return pool.apply_async(run_one, (path, expects, base))

        try:
            pending = [(kind, path, submit(kind, path)) for kind, path in jobs]
            for done, (kind, path, result) in enumerate(pending, 1):
                try:
                    outcome, detail, failed, _ = result.get(timeout=args.timeout)
                except multiprocessing.TimeoutError:
                    outcome, detail, failed = "hang", "", []
                    pool.terminate()
                    pool = context.Pool(args.workers)
                    # the rest are resubmitted to the new pool
                    pending[done:] = [(k, p, submit(k, p)) for k, p, _ in pending[done:]]
                counts[kind][outcome] += 1
                examples.setdefault((kind, outcome), detail)
                for line in failed:
                    failures.setdefault(kind, line)
                if done % 100 == 0:
                    print(f"fuzz: {done} of {len(pending)}", file=sys.stderr, flush=True)
        finally:
            pool.terminate()
    total = collections.Counter()
    width = max(len(k) for k in counts) + 2
    print(f"fuzz: {len(kinds)} inputs of {len(counts)} kinds (seed {args.seed}), "
          f"`advisor diagnose FILE --format json`, {args.timeout:g} s each")
    print(f"{'kind':{width}}" + "".join(f"{o:>17}" for o in OUTCOMES))
    for kind in sorted(counts):
        print(f"{kind:{width}}" + "".join(f"{counts[kind][o]:>17}" for o in OUTCOMES))
        total.update(counts[kind])
    print(f"{'all':{width}}" + "".join(f"{total[o]:>17}" for o in OUTCOMES))
    bad = [(k, o, d) for (k, o), d in examples.items() if o in BAD]
    for kind, outcome, detail in bad:
        print(f"  {outcome} on {kind}: {detail}")
    for kind, line in sorted(failures.items()):
        print(f"  a rule failed (said in the report) on {kind}: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
