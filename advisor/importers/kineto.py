"""Read PyTorch profiler / Kineto Chrome-trace JSON (.json or .json.gz) into a Session.

Both schemas are understood: the 2021 one with capitalised categories (Operator, Runtime,
Kernel, Memcpy, Memset) and today's (cpu_op, cuda_runtime, cuda_driver, kernel, gpu_memcpy,
gpu_memset, cuda_sync, user_annotation, gpu_user_annotation, python_function).

Traces reach gigabytes, so the file is streamed: ijson's C parser yields one event at a
time, plain fields are appended to column lists, and every ``CHUNK`` events the lists are
packed into typed arrays (names interned as categoricals). Peak memory is the packed
columns plus one chunk, never the whole JSON document.

The few top-level keys besides ``traceEvents`` (deviceProperties, distributedInfo,
baseTimeNanoseconds...) sit before or after the event array. Rather than parse the file a
second time for them, the reader keeps the first and last bytes it streams and parses the
metadata out of those; only if that fails does it make a second, slower pass.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import pandas as pd

from advisor.errors import TraceError

CHUNK = 200_000
_HEAD_BYTES = 1 << 20
_TAIL_BYTES = 1 << 20

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
_NAN = float("nan")
_COPY_NAME = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")


class _RecordingStream(io.RawIOBase):
    """A read-only stream that remembers the first and the last bytes read through it."""

    def __init__(self, inner: BinaryIO, on_read: Callable[[], None] | None = None):
        self._inner = inner
        self.head = bytearray()
        self.tail = bytearray()
        self.bytes_read = 0
        self.on_read = on_read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.bytes_read += n
        if len(self.head) < _HEAD_BYTES:
            self.head += data[: _HEAD_BYTES - len(self.head)]
        self.tail += data
        if len(self.tail) > 2 * _TAIL_BYTES:
            del self.tail[: len(self.tail) - _TAIL_BYTES]
        if self.on_read is not None:
            self.on_read()
        return n


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
    except (OSError, EOFError, zlib.error) as exc:
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
    while True:
        block = stream.read(4096)
        if not block:
            return None
        text = block.lstrip()
        if text:
            return chr(text[0])


def _tid_number(value: Any, names: dict[str, int]) -> int:
    """Thread ids come as ints, digit strings or labels such as 'stream 7'."""
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    text = str(value)
    if text.lstrip("-").isdigit():
        return int(text)
    digits = re.search(r"(\d+)$", text)
    if digits:
        return int(digits.group(1))
    # A label with no number: give it a stable negative id of its own.
    return names.setdefault(text, -2 - len(names))


class _Columns:
    """Column lists for one chunk of events, packed into arrays when full."""

    FIELDS = (
        "name", "category", "ts", "dur", "pid", "tid", "device", "stream", "correlation",
        "external_id", "input_dims", "input_types", "input_strides", "concrete_inputs", "call_stack", "bytes",
        "grid", "block", "registers", "shared_memory", "flops", "python_id", "python_parent",
    )

    def __init__(self) -> None:
        self.reset()
        self.packed: list[pd.DataFrame] = []

    def reset(self) -> None:
        # Clear in place: the reader holds bound ``append`` methods of these lists.
        for field in self.FIELDS:
            if hasattr(self, field):
                getattr(self, field).clear()
            else:
                setattr(self, field, [])

    def __len__(self) -> int:
        return len(self.name)  # type: ignore[attr-defined]

    def pack(self) -> None:
        if not len(self):
            return
        frame = {
            "name": pd.Categorical(self.name),  # type: ignore[attr-defined]
            "category": pd.Categorical(self.category),  # type: ignore[attr-defined]
            "ts": np.asarray(self.ts, dtype="float64"),  # type: ignore[attr-defined]
            "dur": np.asarray(self.dur, dtype="float64"),  # type: ignore[attr-defined]
        }
        for field in ("pid", "tid", "device", "stream", "correlation", "external_id", "bytes",
                      "registers", "shared_memory", "python_id", "python_parent"):
            frame[field] = np.asarray(getattr(self, field), dtype="int64")
        frame["flops"] = np.asarray(self.flops, dtype="float64")  # type: ignore[attr-defined]
        for field in ("input_dims", "input_types", "input_strides", "concrete_inputs", "call_stack", "grid", "block"):
            frame[field] = pd.Categorical(getattr(self, field))
        self.packed.append(pd.DataFrame(frame))
        self.reset()

    def frame(self) -> pd.DataFrame:
        self.pack()
        if not self.packed:
            return pd.DataFrame({f: [] for f in self.FIELDS})
        if len(self.packed) == 1:
            return self.packed[0]
        # union_categoricals keeps names interned across chunks.
        from pandas.api.types import union_categoricals

        out = {}
        for column in self.packed[0].columns:
            parts = [p[column] for p in self.packed]
            if isinstance(parts[0].dtype, pd.CategoricalDtype):
                out[column] = union_categoricals([p.array for p in parts])
            else:
                out[column] = np.concatenate([p.to_numpy() for p in parts])
        self.packed = []
        return pd.DataFrame(out)


def _as_json_text(text: str) -> str:
    """A Python repr of a list of numbers and strings (as read) to compact JSON text."""
    if not text:
        return ""
    try:
        return json.dumps(ast.literal_eval(text), separators=(",", ":"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _json_categories(column: pd.Series) -> pd.Categorical:
    values = column.astype("category")
    categories = [_as_json_text(str(c)) for c in values.cat.categories]
    codes = values.cat.codes.to_numpy()
    lookup = np.array(categories + [""], dtype=object)
    return pd.Categorical(lookup[np.where(codes >= 0, codes, len(categories))].astype(str))


def read_events(stream: BinaryIO, path: Path, *, progress: Callable[[int, int], None] | None = None
                ) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any]]:
    """Stream the events of a Kineto trace.

    Returns the raw event columns (timestamps still in the file's microseconds), the
    top-level metadata, and process/thread names from the 'M' events. ``progress(done,
    total)``, where given, hears how many bytes of the file have been read.
    """
    import ijson

    on_read = None
    if progress is not None:
        # A GzipFile reads its file through .fileobj: its position is the compressed bytes.
        raw = getattr(stream, "fileobj", None) or stream
        total = path.stat().st_size

        def on_read() -> None:
            progress(raw.tell(), total)

    recorder = _RecordingStream(stream, on_read)
    buffered = io.BufferedReader(recorder, buffer_size=1 << 16)
    first = _first_char(stream)
    stream.seek(0)
    prefix = "item" if first == "[" else "traceEvents.item"

    cols = _Columns()
    # Bound appends, looked up once: this loop runs once per event.
    append_name = cols.name.append  # type: ignore[attr-defined]
    a_category, a_ts, a_dur = cols.category.append, cols.ts.append, cols.dur.append  # type: ignore[attr-defined]
    a_pid, a_tid = cols.pid.append, cols.tid.append  # type: ignore[attr-defined]
    a_correlation, a_external = cols.correlation.append, cols.external_id.append  # type: ignore[attr-defined]
    a_device, a_stream, a_bytes = cols.device.append, cols.stream.append, cols.bytes.append  # type: ignore[attr-defined]
    a_grid, a_block = cols.grid.append, cols.block.append  # type: ignore[attr-defined]
    a_registers, a_shared = cols.registers.append, cols.shared_memory.append  # type: ignore[attr-defined]
    a_dims, a_types, a_strides = cols.input_dims.append, cols.input_types.append, cols.input_strides.append  # type: ignore[attr-defined]
    a_concrete = cols.concrete_inputs.append  # type: ignore[attr-defined]
    a_stack, a_flops = cols.call_stack.append, cols.flops.append  # type: ignore[attr-defined]
    a_pyid, a_pyparent = cols.python_id.append, cols.python_parent.append  # type: ignore[attr-defined]
    process_names: dict[str, Any] = {}
    tid_names: dict[str, int] = {}
    seen_any = False
    skipped = 0
    try:
        for event in ijson.items(buffered, prefix, use_float=True):
            seen_any = True
            if not isinstance(event, dict):
                raise TraceError(f"{path} is not a Kineto trace: its traceEvents hold a {type(event).__name__}, not events")
            ph = event.get("ph")
            if ph != "X":
                if ph == "M":
                    args = event.get("args") or {}
                    process_names[f"{event.get('name')}:{event.get('pid')}:{event.get('tid')}"] = args.get("name", args)
                continue
            cat = event.get("cat") or ""
            kind = CATEGORY_KIND.get(cat.lower())
            if kind is None:
                skipped += 1
                continue
            args = event.get("args") or {}
            ts = event.get("ts")
            if ts is None:
                skipped += 1
                continue
            dur = event.get("dur") or 0
            if type(ts) not in (int, float) or type(dur) not in (int, float):
                raise TraceError(f"{path} has an event of the wrong shape: ts and dur must be numbers, "
                                 f"got ts={ts!r} dur={dur!r} in {str(event.get('name', ''))[:60]!r}")
            get = args.get
            append_name(str(event.get("name", "")))
            a_category(cat)
            a_ts(ts)
            a_dur(dur)
            pid = event.get("pid", -1)
            a_pid(pid if type(pid) is int else _tid_number(pid, tid_names))
            tid = event.get("tid", -1)
            a_tid(tid if type(tid) is int else _tid_number(tid, tid_names))
            correlation = get("correlation")
            a_correlation(correlation if type(correlation) is int else -1)
            external = get("External id", get("external id"))
            a_external(external if type(external) is int else -1)
            if kind in _GPU_KINDS:
                device = get("device")
                a_device(device if type(device) is int else -1)
                stream_id = get("stream")
                a_stream(stream_id if type(stream_id) is int else -1)
                nbytes = get("bytes")
                a_bytes(nbytes if type(nbytes) is int else -1)
                grid = get("grid")
                a_grid(str(grid) if grid is not None else "")
                block = get("block")
                a_block(str(block) if block is not None else "")
                registers = get("registers per thread")
                a_registers(registers if type(registers) is int else -1)
                shared = get("shared memory")
                a_shared(shared if type(shared) is int else -1)
            else:
                a_device(-1)
                a_stream(-1)
                a_bytes(-1)
                a_grid("")
                a_block("")
                a_registers(-1)
                a_shared(-1)
            if kind == "op":
                # str() now, JSON later: converting each distinct value once (in
                # events_from_raw) is far cheaper than json.dumps on every row.
                dims = get("Input Dims")
                a_dims(str(dims) if dims else "")
                types = get("Input type")
                a_types(str(types) if types else "")
                strides = get("Input Strides")
                a_strides(str(strides) if strides else "")
                concrete = get("Concrete Inputs")
                a_concrete(str(concrete) if concrete and any(concrete) else "")
                a_stack(get("Call stack") or "")
                flops = get("flops")
                a_flops(flops if type(flops) in (int, float) else _NAN)
            else:
                a_dims("")
                a_types("")
                a_strides("")
                a_concrete("")
                a_stack(get("Call stack") or "")
                a_flops(_NAN)
            if kind == "python":
                python_id = get("Python id")
                a_pyid(python_id if type(python_id) is int else -1)
                python_parent = get("Python parent id")
                a_pyparent(python_parent if type(python_parent) is int else -1)
            else:
                a_pyid(-1)
                a_pyparent(-1)
            if len(cols) >= CHUNK:
                cols.pack()
    except TraceError:
        raise
    except ijson.common.IncompleteJSONError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "unexpected end of data"
        raise TraceError(f"{path} is truncated or corrupt JSON ({reason}) after {recorder.bytes_read} bytes") from None
    except ijson.common.JSONError as exc:
        raise TraceError(f"{path} is not valid JSON ({exc})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path} is a truncated or corrupt gzip file ({exc or 'unexpected end'})") from None
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{path} has an event of the wrong shape ({exc})") from None
    metadata = _metadata(recorder, stream, path, seen_any) if first == "{" else {}
    if first == "{" and "traceEvents" not in metadata:
        raise TraceError(f"{path} is JSON but not a Kineto trace: it has no traceEvents")
    if metadata.get("traceEvents") == "not a list":
        raise TraceError(f"{path} is not a Kineto trace: its traceEvents is not a list of events")
    metadata.pop("traceEvents", None)
    metadata["_skipped_events"] = skipped
    return cols.frame(), metadata, process_names


def _metadata(recorder: _RecordingStream, stream: BinaryIO, path: Path, seen_any: bool) -> dict[str, Any]:
    """The top-level keys other than traceEvents, from the bytes kept while streaming.
    ``traceEvents`` in the result is True where the file has an event list."""
    head = bytes(recorder.head)
    meta: dict[str, Any] = {}
    key = head.find(b'"traceEvents"')
    whole_file_in_head = recorder.bytes_read <= len(head)
    if whole_file_in_head:
        try:
            document = json.loads(head)
        except ValueError:
            document = None
        if isinstance(document, dict):
            if "traceEvents" in document:
                document["traceEvents"] = True if isinstance(document["traceEvents"], list) else "not a list"
            return document
    if key < 0:
        return _metadata_second_pass(stream, path, seen_any)
    before = head[:key].rstrip()
    if before.endswith(b","):
        before = before[:-1]
    try:
        parsed = json.loads(before + b"}")
        if isinstance(parsed, dict):
            meta.update(parsed)
    except ValueError:
        return _metadata_second_pass(stream, path, seen_any)
    meta["traceEvents"] = True
    tail = bytes(recorder.tail)
    after = _after_events(tail)
    if after is None:
        return _metadata_second_pass(stream, path, seen_any)
    meta.update(after)
    return meta


_CLOSE_ARRAY = re.compile(r"\]\s*(,|\})")
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _object_rest(text: str, index: int) -> dict[str, Any] | None:
    """Parse ``"key": value, ... }`` from ``index`` to the end of ``text`` (the rest of a
    JSON object whose ``{`` came earlier), or None. raw_decode reads in place, so a wrong
    starting point fails after a few bytes instead of after copying the rest."""
    out: dict[str, Any] = {}
    end = len(text)
    while True:
        index = _SPACE.match(text, index).end()
        if index >= end or text[index] != '"':
            return None
        try:
            key, index = _DECODER.raw_decode(text, index)
            index = _SPACE.match(text, index).end()
            if index >= end or text[index] != ":":
                return None
            index = _SPACE.match(text, index + 1).end()
            value, index = _DECODER.raw_decode(text, index)
        except ValueError:
            return None
        out[key] = value
        index = _SPACE.match(text, index).end()
        if index < end and text[index] == ",":
            index += 1
            continue
        if index < end and text[index] == "}" and not text[index + 1:].strip():
            return out
        return None


def _after_events(tail: bytes) -> dict[str, Any] | None:
    """Parse the keys after the traceEvents array out of the file's last bytes.

    The array's closing bracket is the first ``]`` followed by ``,`` or ``}`` from which
    the rest of the file parses as the remainder of a JSON object.
    """
    text = tail.decode("utf-8", errors="replace")
    for match in _CLOSE_ARRAY.finditer(text):
        if match.group(1) == "}":
            if not text[match.end():].strip():
                return {}
            continue
        parsed = _object_rest(text, match.end())
        if parsed is not None:
            return parsed
    return None


def _metadata_second_pass(stream: BinaryIO, path: Path, seen_any: bool) -> dict[str, Any]:
    """Slow but sure: walk the whole file again, building every top-level value except
    the event array."""
    import ijson

    stream.seek(0)
    meta: dict[str, Any] = {}
    for key in ("schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds", "traceName",
                "displayTimeUnit", "metadata"):
        stream.seek(0)
        try:
            for value in ijson.items(stream, key, use_float=True):
                meta[key] = value
                break
        except ijson.common.JSONError:
            break
    if seen_any:
        meta["traceEvents"] = True
    return meta


def _ns(values: np.ndarray) -> np.ndarray:
    """Microseconds (as the file wrote them) to integer nanoseconds, without rounding
    the whole value through a float product: the integer part is scaled exactly and
    only the fraction is rounded (to the nearest ns)."""
    whole = np.floor(values)
    return whole.astype("int64") * 1000 + np.rint((values - whole) * 1000).astype("int64")


def events_from_raw(raw: pd.DataFrame) -> pd.DataFrame:
    """Raw Kineto columns to the Session's event schema (before attribution)."""
    category = raw["category"].astype("category")
    categories = category.cat.categories
    kind_lookup = np.array([CATEGORY_KIND.get(str(c).lower(), "") for c in categories] + [""], dtype=object)
    category_codes = category.cat.codes.to_numpy()
    kind_text = kind_lookup[np.where(category_codes >= 0, category_codes, len(categories))].astype(str)
    start = _ns(raw["ts"].to_numpy(dtype="float64"))
    duration = np.maximum(_ns(raw["dur"].to_numpy(dtype="float64")), 0)
    is_gpu = np.isin(kind_text, ["kernel", "memcpy", "memset", "gpu_annotation", "sync"])
    device = raw["device"].to_numpy(copy=True)
    device = np.where(is_gpu & (device < 0), raw["pid"].to_numpy(), device)
    device = np.where(is_gpu, device, -1)
    stream = raw["stream"].to_numpy(copy=True)
    stream = np.where(is_gpu & (stream < 0), raw["tid"].to_numpy(), stream)
    events = pd.DataFrame({
        "name": raw["name"],
        "kind": pd.Categorical(kind_text),
        "category": category,
        "start_ns": start,
        "end_ns": start + duration,
        "pid": raw["pid"],
        "tid": raw["tid"],
        "device": device,
        "stream": stream,
        "correlation": raw["correlation"],
        "external_id": raw["external_id"],
        "input_dims": _json_categories(raw["input_dims"]),
        "input_types": _json_categories(raw["input_types"]),
        "input_strides": _json_categories(raw["input_strides"]),
        "concrete_inputs": _json_categories(raw["concrete_inputs"]),
        "call_stack": raw["call_stack"],
        "bytes": raw["bytes"],
        "grid": _json_categories(raw["grid"]),
        "block": _json_categories(raw["block"]),
        "registers": raw["registers"],
        "shared_memory": raw["shared_memory"],
        "flops": raw["flops"],
    })
    # Copy direction and memory kinds are spelled in the copy's name; parse each
    # distinct name once.
    names = events["name"].astype("category")
    parsed = [_COPY_NAME.search(str(n)) for n in names.cat.categories]
    codes = names.cat.codes.to_numpy()
    for column, group in (("copy_kind", 1), ("src_memory", 2), ("dst_memory", 3)):
        lookup = np.array([m.group(group) if m else "" for m in parsed] + [""], dtype=object)
        values = lookup[np.where(codes >= 0, codes, len(parsed))]
        values = np.where(kind_text == "memcpy", values, "")
        events[column] = pd.Categorical(values.astype(str))
    return events
