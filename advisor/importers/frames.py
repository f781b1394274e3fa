"""Summary tables as JSON data, so the cache keeps them without running code to read them.

A table is a DataFrame with string row keys, a few column types (float64, int64, bool,
pandas' str, and object columns of text, numbers and lists of them) and its
documentation in ``attrs``. ``dumps`` writes each column with its dtype and ``loads``
rebuilds it exactly: floats are written as Python writes them (exact, NaN and infinity
included), so a table read back equals the one computed, dtype for dtype. A table with
anything else in it is not kept (``NotData``): the cache then computes it again, which is
slower but never wrong.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["NotData", "dumps", "loads"]

FORMAT = "advisor-tables/1"
_NUMERIC = ("float64", "int64", "bool")
_SCALARS = (str, int, float, bool, type(None))


class NotData(ValueError):
    """A table holds something that is not plain data (the cache does not keep it)."""


def dumps(tables: dict[str, pd.DataFrame]) -> str:
    """The tables as one JSON text; NotData where one of them cannot be written exactly."""
    out = {}
    for name, frame in tables.items():
        if not isinstance(frame, pd.DataFrame):
            raise NotData(f"{name}: not a table")
        out[name] = _frame(name, frame)
    return json.dumps({"format": FORMAT, "tables": out}, allow_nan=True, separators=(",", ":"))


def loads(text: str) -> dict[str, pd.DataFrame]:
    """The tables ``dumps`` wrote; ValueError where the text is not such a record."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("tables"), dict):
        raise ValueError("not a tables record")
    return {str(name): _rebuilt(table) for name, table in raw["tables"].items()}


def _frame(name: str, frame: pd.DataFrame) -> dict[str, Any]:
    if not frame.columns.is_unique or not all(isinstance(c, str) for c in frame.columns):
        raise NotData(f"{name}: column names repeat or are not text")
    if frame.index.dtype != object or not all(isinstance(k, str) for k in frame.index):
        raise NotData(f"{name}: row keys are not text")
    attrs = dict(frame.attrs)
    if json.loads(json.dumps(attrs)) != attrs:  # tuples, numpy scalars: would not come back as they were
        raise NotData(f"{name}: its documentation is not plain data")
    return {"index": list(frame.index), "index_name": frame.index.name, "attrs": attrs,
            "columns": [[column, *_column(name, frame[column])] for column in frame.columns]}


def _column(name: str, series: pd.Series) -> tuple[str, list[Any]]:
    dtype = str(series.dtype)
    if dtype in _NUMERIC:
        return dtype, series.tolist()
    if dtype == "str":  # pandas' text dtype: its missing values are NaN, written as null
        return dtype, [None if not isinstance(v, str) else v for v in series.tolist()]
    if dtype == "object":
        values = series.tolist()
        for value in values:
            if not (type(value) in _SCALARS or (type(value) is list and all(type(v) in _SCALARS for v in value))):
                raise NotData(f"{name}.{series.name}: holds a {type(value).__name__}")
        return dtype, values
    raise NotData(f"{name}.{series.name}: dtype {dtype}")


def _rebuilt(table: dict[str, Any]) -> pd.DataFrame:
    index = pd.Index(table["index"], dtype=object, name=table.get("index_name"))
    data = {}
    for column, dtype, values in table["columns"]:
        if dtype in _NUMERIC:
            data[column] = pd.Series(np.asarray(values, dtype=dtype), index=index)
        elif dtype == "str":
            data[column] = pd.Series([math.nan if v is None else v for v in values], index=index, dtype="str")
        elif dtype == "object":
            data[column] = pd.Series(values, index=index, dtype=object)
        else:
            raise ValueError(f"not a tables record: dtype {dtype!r}")
    frame = pd.DataFrame(data, index=index, columns=[c for c, _d, _v in table["columns"]])
    frame.attrs = dict(table.get("attrs") or {})
    return frame
