"""A saved session folder checked as it is read back: its layout, its metadata's nesting,
its events' column types and the ranges of their values.

A session folder is data that may have been edited, copied from elsewhere or damaged.
What is read back is the profile that was saved, or it is refused in one line that names
what is wrong: a column of the wrong type is never coerced (start times written as text
would read as 0, a profile of other times), a row that points at a row not there is never
followed, a time past what 64-bit arithmetic can take never reaches the tables.

The event schema is the Session's (advisor.session.session, which reads a folder through
this module and passes it as ``Schema``): this module knows how a column is checked, not
which columns there are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advisor.errors import SessionError
from advisor.paths import special_file
from advisor.session.layout import DAY_NS, EVENTS_FILE, MAX_SPREAD_NS, META_FILE

__all__ = ["MAX_META_DEPTH", "MAX_TIME_NS", "Schema", "check_events", "read_events", "read_meta", "session_files"]

# How deep session.json may nest: advisor writes seven levels; a trace's own metadata,
# kept in trace_metadata, a few more. Far deeper is not a profile, and parsing it
# recurses until the interpreter's stack runs out.
MAX_META_DEPTH = 64

# Times a session may hold, either side of its clock's zero: those the trace reader keeps
# (advisor.importers.kineto, 9e15 us: as nanoseconds, just inside int64), so a session
# advisor saved reads back; int64's own extremes, which no reader makes and which the
# tables' arithmetic overflows on, are refused.
MAX_TIME_NS = 9 * 10**18

# Columns the session format has gained since it was first written: a session saved before
# holds none of them, and they read as not recorded. ``id`` is the row's position and is
# set again on reading. Every other column must be there: a session without ``kind`` or
# ``device`` would be read as another profile.
_ADDED_SINCE = frozenset({"id", "concrete_inputs", "comm", "value", "system_value", "sequence"})

# Columns whose missing value is -1 and that never hold less.
_NONE_IS_MINUS_ONE = ("step", "device", "bytes", "registers", "shared_memory")

_WHAT_IT_HOLDS = {"int64": "whole numbers", "float64": "numbers", "category": "text"}


@dataclass(frozen=True)
class Schema:
    """The events' schema: each column's (dtype, missing value), the kinds of event, and
    the columns that hold row ids."""

    columns: Mapping[str, tuple[str, Any]]
    kinds: tuple[str, ...]
    relations: tuple[str, ...]


def session_files(folder: Path) -> tuple[Path, Path]:
    """The folder's session.json and events.parquet, each a regular file; SessionError
    naming the one that is not. A folder named events.parquet is refused, not read as a
    dataset of the files in it (which pyarrow would, every copy in it adding its events)."""
    found = []
    for name in (META_FILE, EVENTS_FILE):
        path = folder / name
        special = special_file(path)
        if special is not None:
            raise SessionError(f"{path} is {special}, not a saved session's {name}")
        if path.is_dir():
            raise SessionError(f"{path} is a folder; a saved session's {name} is one file")
        if not path.is_file():
            raise SessionError(f"{folder} is not a whole advisor session (it has no {name})")
        found.append(path)
    return found[0], found[1]


def read_meta(path: Path) -> Any:
    """session.json parsed, refused where it is not JSON or nests deeper than a session does."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise SessionError(f"{path} is damaged: values nested more than {MAX_META_DEPTH} deep") from None
    except (OSError, ValueError) as exc:
        raise SessionError(f"{path} is damaged: {' '.join(str(exc).split())[:200]}") from None
    stack = [(raw, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_META_DEPTH:
            raise SessionError(f"{path} is damaged: values nested more than {MAX_META_DEPTH} deep")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
    return raw


def read_events(path: Path, schema: Schema) -> pd.DataFrame:
    """events.parquet read and checked (``check_events``). Read through one open file, so
    what is read is the file checked, never a folder put in its place meanwhile."""
    import pyarrow.parquet as pq

    try:
        with path.open("rb") as handle:
            _check_types(pq.read_schema(handle), path, schema)
            handle.seek(0)
            events = pd.read_parquet(handle)
    except SessionError:
        raise
    except Exception as exc:  # noqa: BLE001  (pyarrow raises several unrelated types here)
        raise SessionError(f"{path} cannot be read: {' '.join(str(exc).split())[:200]}") from None
    check_events(events, path, schema)
    return events


def _type_name(arrow_type: Any) -> str:
    """What an Arrow column type holds, in the words of _WHAT_IT_HOLDS."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        value = arrow_type.value_type
        if pa.types.is_string(value) or pa.types.is_large_string(value):
            return "text"
        return f"coded {_type_name(value)}"
    if pa.types.is_integer(arrow_type):
        return "whole numbers"
    if pa.types.is_floating(arrow_type):
        return "numbers with fractions"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "text"
    if pa.types.is_null(arrow_type):
        return "nothing"
    return str(arrow_type)


def _check_types(arrow: Any, path: Path, schema: Schema) -> None:
    """Every column the format requires is there, and each column the format knows holds
    its type: whole numbers (never text, never fractions), numbers, or text."""
    names = set(arrow.names)
    missing = [c for c in schema.columns if c not in names and c not in _ADDED_SINCE]
    if missing:
        raise SessionError(f"{path} is not a saved session's events: it has no {', '.join(repr(c) for c in missing)} "
                           "column")
    for column, (dtype, _missing) in schema.columns.items():
        if column not in names:
            continue
        held = _type_name(arrow.field(column).type)
        fits = {"int64": held == "whole numbers",
                "float64": held in ("whole numbers", "numbers with fractions", "nothing"),
                "category": held in ("text", "nothing")}[dtype]
        if not fits:
            raise SessionError(f"{path}: column {column!r} holds {held}, not {_WHAT_IT_HOLDS[dtype]}")


def check_events(events: pd.DataFrame, path: Path | str, schema: Schema) -> None:
    """Refuse (SessionError) events whose values are not a profile's: a missing value in a
    column of whole numbers, a time out of range, a range that ends before it starts (a
    stack sample aside: its span is the sampler's weight, which its clocks have made
    negative in real recordings), an unknown kind, a row pointing at no row."""
    n = len(events)
    if not n:
        return
    ints: dict[str, np.ndarray] = {}
    for column, (dtype, _missing) in schema.columns.items():
        if dtype != "int64" or column not in events.columns or column == "id":
            continue
        series = events[column]
        # (A numpy integer column cannot hold a missing value; pandas' nullable one can.)
        if not pd.api.types.is_integer_dtype(series.dtype) or (
                not isinstance(series.dtype, np.dtype) and series.isna().any()):
            raise SessionError(f"{path}: column {column!r} has missing values; it holds whole numbers")
        values = series.to_numpy()
        if values.dtype.kind == "u" and values.max() > np.iinfo(np.int64).max:
            row = int(np.argmax(values > np.iinfo(np.int64).max))
            raise SessionError(f"{path}: row {row}: {column} {values[row]} is past the largest 64-bit integer")
        ints[column] = values.astype(np.int64, copy=False)
    for column in ("start_ns", "end_ns"):
        values = ints[column]
        if -MAX_TIME_NS <= values.min() and values.max() <= MAX_TIME_NS:
            continue
        out = (values < -MAX_TIME_NS) | (values > MAX_TIME_NS)
        if out.any():
            row = int(np.argmax(out))
            raise SessionError(f"{path}: row {row}: {column} {values[row]} is out of range (a session's times "
                               "lie within 9e18 ns of its clock's zero)")
    # A profile covers a run: hours, days at most. A time far from the rest (an end 146
    # years after the start) is damage, and every figure would be built on it.
    starts, ends = ints["start_ns"].astype(np.float64), ints["end_ns"].astype(np.float64)  # (no int64 overflow)
    middle = float(np.median(starts))
    far = (np.abs(starts - middle) > MAX_SPREAD_NS) | (np.abs(ends - middle) > MAX_SPREAD_NS)
    if far.any():
        row = int(np.argmax(far))
        raise SessionError(f"{path}: row {row}: its times (start_ns {ints['start_ns'][row]}, end_ns "
                           f"{ints['end_ns'][row]}) lie more than {MAX_SPREAD_NS // DAY_NS} days from the rest of the "
                           "session's")
    kind = events["kind"]
    backwards = ints["end_ns"] < ints["start_ns"]
    if backwards.any():
        backwards &= ~_one_of(kind, ["stack"])
        if backwards.any():
            row = int(np.argmax(backwards))
            raise SessionError(f"{path}: row {row} ({_text_at(kind, row) or 'an event'}) ends before it "
                               f"starts (start_ns {ints['start_ns'][row]}, end_ns {ints['end_ns'][row]})")
    allowed = {*schema.kinds, ""}
    # Told by the categories where they are all known, before any row is looked at.
    if not (isinstance(kind.dtype, pd.CategoricalDtype) and {str(c) for c in kind.cat.categories} <= allowed):
        known = _one_of(kind, allowed)
        if not known.all():
            row = int(np.argmax(~known))
            raise SessionError(f"{path}: row {row}: kind {_text_at(kind, row)[:60]!r} is not a kind of "
                               f"event ({', '.join(schema.kinds)})")
    for column in schema.relations:
        values = ints[column]
        if -1 <= values.min() and values.max() < n:  # (a reduction: far faster than a mask of the rows)
            continue
        nowhere = (values < -1) | (values >= n)
        if nowhere.any():
            row = int(np.argmax(nowhere))
            raise SessionError(f"{path}: row {row}: {column} {values[row]} points at no row (the session has "
                               f"{n} rows; -1 is none)")
    for column in _NONE_IS_MINUS_ONE:
        values = ints[column]
        if values.min() >= -1:
            continue
        below = values < -1
        if below.any():
            row = int(np.argmax(below))
            raise SessionError(f"{path}: row {row}: {column} {values[row]} is below -1 (none)")
    for column in ("flops", "value", "system_value"):
        if column not in events.columns:
            continue
        values = events[column].to_numpy(dtype="float64", na_value=np.nan)
        if not (np.nanmin(values, initial=0) < 0 or np.nanmax(values, initial=0) == np.inf):
            continue
        wrong = np.isinf(values) | (values < 0)
        if wrong.any():
            row = int(np.argmax(wrong))
            raise SessionError(f"{path}: row {row}: {column} {values[row]} is not a count (finite, not negative)")


def _one_of(column: pd.Series, values: Iterable[str]) -> np.ndarray:
    """Mask of the rows whose text is one of ``values`` (a missing value reads as ""),
    compared per category, not per row."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype("category")
    wanted = set(values)
    hit = np.asarray([str(c) in wanted for c in column.cat.categories] + ["" in wanted], dtype=bool)
    codes = column.cat.codes.to_numpy()
    return hit[np.where(codes >= 0, codes, len(hit) - 1)]


def _text_at(column: pd.Series, row: int) -> str:
    value = column.iloc[row]
    return "" if pd.isna(value) else str(value)
