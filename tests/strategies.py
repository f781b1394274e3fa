"""Shared Hypothesis strategies: small Kineto traces, and the ways a trace file is damaged.

A trace is a list of event dicts written by ``render`` either in Kineto's own layout (one
event per object, a comma and a newline between them, the top-level keys before and after
the event array) or on one line as ``json.dumps`` writes it. ``render`` records where each
event's bytes are, so a test knows which events a mutation touched and which it did not:

    trace = draw(traces())                   # a RenderedTrace
    data, cut = draw(truncations(trace))     # the file cut off at some byte
    data, at = draw(byte_flips(trace))       # one byte changed
    events, i, key = draw(deleted_keys(trace.events))
    events, i, key, value = draw(wrong_types(trace.events))

Every complete event ('X') has a name and a ts no other event has, so the events read
back can be matched to the events written (``expected_rows``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st

# Complete-event categories of today's schema, each with the args Kineto writes for it.
CATEGORIES = ("cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "python_function", "user_annotation")
READ_CATEGORIES = frozenset(CATEGORIES)  # all have a Session kind

HEAD = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB", "numSms": 108,
                                                  "computeMajor": 8, "computeMinor": 0}]}
TAIL = {"traceName": "trace.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000}


def complete_event(index: int, category: str, ts: float) -> dict:
    """A complete event of a category, with the args its kind carries."""
    event = {"ph": "X", "cat": category, "name": f"{category}#{index}", "pid": 10, "tid": 10 + index % 2,
             "ts": ts, "dur": 1.5}
    corr = 1000 + index
    if category == "cpu_op":
        event["args"] = {"External id": index, "Input Dims": [[8, index % 5 + 1], [index % 5 + 1, 8]],
                         "Input type": ["float", "float"], "Sequence number": index}
    elif category == "cuda_runtime":
        event["args"] = {"External id": index, "correlation": corr, "cbid": 211}
    elif category == "kernel":
        event.update(pid=0, tid=7)
        event["args"] = {"External id": index, "device": 0, "stream": 7, "correlation": corr,
                         "registers per thread": 32, "shared memory": 0, "grid": [4, 1, 1], "block": [128, 1, 1]}
    elif category == "gpu_memcpy":
        event.update(pid=0, tid=7)
        event["args"] = {"device": 0, "stream": 7, "correlation": corr, "bytes": 4096}
    elif category == "python_function":
        event["args"] = {"Python id": index, "Python parent id": None if index % 3 == 0 else index - 1}
    return event


def small_trace(steps: int = 3) -> list[dict]:
    """A deterministic, real-looking trace: per step a ProfilerStep range, an op that
    launches a kernel, a copy, Python frames; flow events and process names besides."""
    events: list[dict] = []
    index = 0
    for step in range(steps):
        t0 = 1_700_000_000_000.125 + step * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 10, "tid": 10,
                       "ts": t0, "dur": 900.0, "args": {"External id": 10_000 + step}})
        for offset, category in enumerate(("python_function", "cpu_op", "cuda_runtime", "kernel", "gpu_memcpy")):
            index += 1
            events.append(complete_event(index, category, t0 + 10 + offset * 7.25))
        events.append({"ph": "s", "id": 1000 + index, "pid": 10, "tid": 10, "ts": t0 + 24.5, "cat": "ac2g",
                       "name": "ac2g"})
        events.append({"ph": "f", "id": 1000 + index, "pid": 0, "tid": 7, "ts": t0 + 31.75, "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})
    events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": 10, "tid": 0, "args": {"name": "python3"}})
    events.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 1.0})
    return events


@dataclass
class RenderedTrace:
    """A trace file's bytes, the events in it, and where each event's object starts and ends."""

    data: bytes
    events: list[dict]
    spans: list[tuple[int, int]]
    layout: str
    array: tuple[int, int]  # where the event array's '[' and ']' are


def _kineto_event(event: dict) -> str:
    """One event as Kineto's ChromeTraceLogger lays it out."""
    plain = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in event.items() if k != "args")
    text = "{\n    " + plain
    if isinstance(event.get("args"), dict):
        args = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in event["args"].items())
        text += ",\n    \"args\": {\n      " + args + "\n    }"
    elif "args" in event:
        text += ",\n    \"args\": " + json.dumps(event["args"])
    return text + "\n  }"


def render(events: list[dict], layout: str = "kineto", *, head: dict | None = None, tail: dict | None = None,
           array: bool = False) -> RenderedTrace:
    """Write events as a trace file: the object form with the top-level keys ``head``
    before the event array and ``tail`` after it, or (``array``) a bare array of events."""
    head = HEAD if head is None else head
    tail = TAIL if tail is None else tail
    if layout == "kineto":
        texts = [_kineto_event(e) for e in events]
        separator = ",\n  "
        before = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()) + \
            '  "traceEvents": [\n  '
        after = "\n]" + "".join(f",\n  {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items()) + "\n}\n"
    else:
        texts = [json.dumps(e) for e in events]
        separator = ", "
        before = "{" + "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in head.items()) + '"traceEvents": ['
        after = "]" + "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items()) + "}"
    if array:
        before, after = "[" if layout != "kineto" else "[\n  ", "]" if layout != "kineto" else "\n]\n"
    spans = []
    position = len(before.encode())
    for i, text in enumerate(texts):
        size = len(text.encode())
        spans.append((position, position + size))
        position += size + (len(separator) if i < len(texts) - 1 else 0)
    data = (before + separator.join(texts) + after).encode()
    array_start = len(before.encode()) - 1 - (len(before) - len(before.rstrip()))
    return RenderedTrace(data, events, spans, layout, (array_start, position + after.index("]")))


def expected_rows(events: list[dict]) -> set[tuple[str, float]]:
    """(name, ts) of the events a reader must turn into rows: complete events of a
    category the Session knows, with a ts."""
    return {(e.get("name") or "", e["ts"]) for e in events
            if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in READ_CATEGORIES
            and isinstance(e.get("ts"), float)}


def touched_by(trace: RenderedTrace, position: int) -> set[int]:
    """The events a change of the byte at ``position`` can damage: the one it falls in;
    both neighbours where it is the brace that opens or closes an event, or between two."""
    touched = set()
    after_key = trace.data.rfind(b":", 0, trace.array[0])  # a bracket that moves changes the first event
    if after_key < position < trace.spans[0][0]:
        touched.add(0)
    if trace.spans[-1][1] <= position < trace.array[1]:
        touched.add(len(trace.spans) - 1)
    for i, (start, end) in enumerate(trace.spans):
        if start < position < end - 1:
            return {i}
        if position == start:
            touched |= {i - 1, i}
        if position == end - 1:
            touched |= {i, i + 1}
        if i + 1 < len(trace.spans) and end <= position < trace.spans[i + 1][0]:
            touched |= {i, i + 1}
    return {i for i in touched if 0 <= i < len(trace.spans)}


@st.composite
def traces(draw, min_steps: int = 1, max_steps: int = 4) -> RenderedTrace:
    """A small trace in either layout, its events in a drawn order."""
    events = small_trace(draw(st.integers(min_steps, max_steps)))
    events = draw(st.permutations(events))
    return render(list(events), draw(st.sampled_from(["kineto", "line"])))


@st.composite
def truncations(draw, trace: RenderedTrace) -> tuple[bytes, int]:
    """The file cut off at some byte (never at its very end)."""
    cut = draw(st.integers(0, len(trace.data) - 1))
    return trace.data[:cut], cut


@st.composite
def byte_flips(draw, trace: RenderedTrace) -> tuple[bytes, int]:
    """One byte of an event replaced with another (structural characters likelier)."""
    start, end = trace.spans[draw(st.integers(0, len(trace.spans) - 1))]
    at = draw(st.integers(max(0, start - 2), min(len(trace.data) - 1, end + 1)))
    new = draw(st.one_of(st.sampled_from(b'{}[]",:\\ 0aN\xff\x00'), st.integers(0, 255)))
    data = bytearray(trace.data)
    data[at] = new
    return bytes(data), at


@st.composite
def deleted_keys(draw, events: list[dict]) -> tuple[list[dict], int, str]:
    """One key of one event removed (of its args where ``key`` has an 'args.' prefix)."""
    i = draw(st.integers(0, len(events) - 1))
    event = json.loads(json.dumps(events[i]))
    keys = [k for k in event] + [f"args.{k}" for k in event.get("args", {})]
    key = draw(st.sampled_from(keys))
    if key.startswith("args."):
        del event["args"][key[5:]]
    else:
        del event[key]
    return events[:i] + [event] + events[i + 1:], i, key


WRONG_VALUES = st.one_of(
    st.lists(st.integers(-3, 3), max_size=2), st.dictionaries(st.sampled_from("ab"), st.integers(0, 3), max_size=2),
    st.text(max_size=4), st.booleans(), st.none(), st.floats(allow_nan=False, allow_infinity=False),
    st.integers(2**63, 2**70), st.integers(-(2**70), -(2**63) - 1), st.sampled_from([10**400, -(10**400)]),
)


@st.composite
def wrong_types(draw, events: list[dict]) -> tuple[list[dict], int, str, object]:
    """One value of one event replaced by a value of some other type."""
    i = draw(st.integers(0, len(events) - 1))
    event = json.loads(json.dumps(events[i]))
    keys = [k for k in event] + [f"args.{k}" for k in event.get("args", {})]
    key = draw(st.sampled_from(keys))
    value = draw(WRONG_VALUES)
    if key.startswith("args."):
        event["args"][key[5:]] = value
    else:
        event[key] = value
    return events[:i] + [event] + events[i + 1:], i, key, value


@st.composite
def damaged_bytes(draw, data: bytes) -> tuple[bytes, str]:
    """Any file's bytes damaged one way, for traces whose event spans are not known (the
    real ones): cut off, a byte flipped, a run of bytes deleted or repeated, an event's
    worth of bytes swapped for garbage. Returns the bytes and what was done."""
    how = draw(st.sampled_from(["cut", "flip", "delete", "repeat", "garbage"]))
    at = draw(st.integers(0, len(data) - 1))
    if how == "cut":
        return data[:at], how
    if how == "flip":
        out = bytearray(data)
        out[at] = draw(st.one_of(st.sampled_from(b'{}[]",:\\ 0aN\xff\x00'), st.integers(0, 255)))
        return bytes(out), how
    length = draw(st.integers(1, 400))
    if how == "delete":
        return data[:at] + data[at + length:], how
    if how == "repeat":
        return data[:at + length] + data[at:], how
    return data[:at] + draw(st.binary(min_size=1, max_size=length)) + data[at + length:], how
