"""`advisor summary`: the summary tables themselves, in the terminal, as CSV or as JSON.

Like every report it only renders: the frames come from advisor.tables, already computed;
choosing, sorting and cutting rows is presentation.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import pandas as pd
from rich.console import Console
from rich.text import Text

from advisor.errors import UsageError
from advisor.reports._common import cell_text, compact_columns
from advisor.reports._terminal import KEY_MIN, MAX_CELL, _table
from advisor.reports.build import doc_for, table_from_frame, to_python

TERMINAL_COLUMNS = 7


def _fitting_columns(table, width: int, limit: int) -> list[str]:
    """The most main columns (up to TERMINAL_COLUMNS) whose cells fit ``width`` beside a
    readable key column."""
    rows = table.rows[:limit] if limit and limit > 0 else table.rows
    for count in range(TERMINAL_COLUMNS, 0, -1):
        columns = compact_columns(table, count)
        needed = KEY_MIN + sum(
            3 + max([len(c)] + [len(cell_text(r, c, max_chars=MAX_CELL)) for r in rows]) for c in columns
        )
        if needed <= width:
            return columns
    return compact_columns(table, 1)


def _view(frame: pd.DataFrame, sort: str | None, limit: int) -> pd.DataFrame:
    if sort:
        if sort not in frame.columns:
            return frame  # the caller checks that some table has the column
        frame = frame.sort_values(sort, ascending=False, kind="stable", na_position="last")
    return frame.head(limit) if limit and limit > 0 else frame


def shown_safely(table: Any) -> Any:
    """A rendered table's texts with their control characters escaped (advisor.units)."""
    from advisor.units import safe_strings

    dumped = table.model_dump()
    cleaned = safe_strings(dumped)
    return table if cleaned == dumped else type(table).model_validate(cleaned)


def _csv_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell, the key included, as advisor.units.csv_cell writes
    it: no control character, no cell a spreadsheet would run as a formula."""
    from advisor.units import csv_cell

    def cell(value: Any) -> Any:
        return csv_cell(value) if isinstance(value, str) else value

    out = frame.copy()
    for column in out.columns:
        if not pd.api.types.is_numeric_dtype(out[column]) and not pd.api.types.is_bool_dtype(out[column]):
            out[column] = out[column].astype(object).map(cell)
    out.index = out.index.map(cell)
    out.columns = [cell(str(c)) for c in out.columns]
    return out


def render_tables(tables: Mapping[str, pd.DataFrame], *, table_docs: Mapping[str, Any] | None = None,
                  sort: str | None = None, limit: int = 20, fmt: str = "terminal",
                  console: Console | None = None) -> str | None:
    """Print (terminal) or return (csv, json) the given tables, in the order given."""
    if sort and not any(sort in frame.columns for frame in tables.values()):
        columns = sorted({c for frame in tables.values() for c in frame.columns})
        raise UsageError(f"no table shown has a column {sort!r}; columns: {', '.join(columns)}")
    if fmt == "terminal":
        console = console or Console()
        for name, frame in tables.items():
            table = table_from_frame(name, _view(frame, sort, 0), doc_for(name, frame, table_docs))
            table = shown_safely(table)  # names from the trace reach a terminal: no control characters
            if not table.rows:
                console.print(Text(f"{table.title or name}: no rows", style="bold"))
                for note in table.notes:
                    console.print(Text(f"  {note}"))
                console.print()
                continue
            # The terminal shows the main columns; csv and json carry them all.
            console.print(_table(table, columns=_fitting_columns(table, console.width, limit),
                                 rows=limit if limit and limit > 0 else None, width=console.width))
            console.print()
        return None
    if fmt == "csv":
        parts = []
        for name, frame in tables.items():
            parts.append(f"# {name}\n" + _csv_safe(_view(frame, sort, limit)).to_csv())
        return "\n".join(parts)
    if fmt == "json":
        out = {}
        for name, frame in tables.items():
            view = _view(frame, sort, limit)
            out[name] = [{"key": str(k), **{str(c): to_python(v) for c, v in row.items()}}
                         for k, row in view.iterrows()]
        return json.dumps(out, indent=2)
    raise UsageError(f"unknown summary format {fmt!r}: use terminal, csv or json")
