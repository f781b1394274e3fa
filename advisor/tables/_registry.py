"""The table registry: each table's compute function with its documentation.

A table module declares its table with ``@table(name, title=..., description=...,
key=..., columns={column: meaning})``. The declared columns are the contract: ``finish``
gives every frame exactly those columns in that order, an index named "key" of unique
strings, and the documentation in ``frame.attrs``, so a report can describe any table,
empty or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from advisor.session import Session
from advisor.step.facts import Facts


class TableDoc(NamedTuple):
    """What a table is, for people: title, description, {column: meaning}, what a row key is."""

    title: str
    description: str
    columns: dict[str, str]
    key: str


@dataclass(frozen=True)
class TableSpec:
    name: str
    doc: TableDoc
    compute: Callable[[Facts], pd.DataFrame | None]

    def __call__(self, session: Session, *, facts: Facts | None = None) -> pd.DataFrame:
        """The table for ``session`` (``facts`` shares work between tables of one session)."""
        if facts is None:
            from advisor.step import build_step_model

            facts = build_step_model(session).facts
        frame = self.compute(facts)
        return finish(frame, self)


SPECS: dict[str, TableSpec] = {}


def table(name: str, *, title: str, description: str, key: str, columns: dict[str, str]):
    """Register the decorated ``compute(facts) -> DataFrame | None`` as table ``name``."""

    def register(compute: Callable[[Facts], pd.DataFrame | None]):
        if name in SPECS:
            raise ValueError(f"table {name!r} is registered twice")
        SPECS[name] = TableSpec(name, TableDoc(title, description, dict(columns), key), compute)
        return compute

    return register


def empty_frame(spec: TableSpec) -> pd.DataFrame:
    columns = list(spec.doc.columns)
    # One empty object block: half the time of pandas filling each column in.
    return pd.DataFrame(np.empty((0, len(columns)), dtype=object), index=pd.Index([], dtype=object),
                        columns=pd.Index(columns))


def finish(frame: pd.DataFrame | None, spec: TableSpec) -> pd.DataFrame:
    """Give ``frame`` the declared columns, the "key" index and the documentation attrs."""
    notes = list(frame.attrs.get("notes", [])) if frame is not None else []
    if frame is None or not len(frame):
        out = empty_frame(spec)
    else:
        missing = [c for c in spec.doc.columns if c not in frame.columns]
        if missing:
            raise RuntimeError(f"table {spec.name!r} did not compute columns {missing}")
        # Copy-on-write makes this a frame of its own; reindex selects the columns in half
        # the time .loc takes.
        out = frame.reindex(columns=list(spec.doc.columns))
        out.index = pd.Index([str(k) for k in frame.index], dtype=object)
        if not out.index.is_unique:
            dupes = out.index[out.index.duplicated()].unique().tolist()[:5]
            raise RuntimeError(f"table {spec.name!r} has repeated row keys: {dupes}")
    out.index.name = "key"
    out.attrs = {
        "table": spec.name,
        "title": spec.doc.title,
        "description": spec.doc.description,
        "key": spec.doc.key,
        "columns": dict(spec.doc.columns),
        "notes": notes,
    }
    return out


def with_notes(frame: pd.DataFrame | None, *notes: str) -> pd.DataFrame:
    """Attach notes (what was not measured and why) to a table frame."""
    frame = frame if frame is not None else pd.DataFrame()
    frame.attrs["notes"] = [*frame.attrs.get("notes", []), *(n for n in notes if n)]
    return frame
