"""The summary tables' columns as a committed file, advisor/schemas/table_columns.json.

Checking a rule pack needs every table's columns, and the tables' modules import pandas,
which costs more than everything else `advisor rules list` or the start of `advisor
diagnose` does. The file holds what the registry declares (a session's tables and a job's
cross-rank ones, ``key`` first); a test checks it equals :func:`table_columns`. After
changing a table's columns, regenerate it:

    python -m advisor.tables.columns
"""

from __future__ import annotations

import json
from pathlib import Path

from advisor.paths import table_columns_file
from advisor.tables import JOB_TABLE_DOCS, TABLE_DOCS

__all__ = ["columns_text", "table_columns", "write_table_columns"]


def table_columns() -> dict[str, list[str]]:
    """Each table's columns as rule expressions see them, from the registry now."""
    return {name: ["key", *doc.columns] for name, doc in {**TABLE_DOCS, **JOB_TABLE_DOCS}.items()}


def columns_text() -> str:
    """The file as it is committed."""
    return json.dumps(table_columns(), indent=1) + "\n"


def write_table_columns(path: str | Path | None = None) -> Path:
    target = Path(path) if path is not None else table_columns_file()
    target.write_text(columns_text(), encoding="utf-8")
    return target


if __name__ == "__main__":
    print(write_table_columns())
