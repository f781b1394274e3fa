"""Where advisor's data folders (rules/, knowledge/, cases/) are, installed or not.

A wheel carries rules/ and knowledge/ inside the package as advisor/_data/...; a checkout
(and an editable install) has all three at the top of the repository, beside the package.
cases/ is test data and stays in the repository.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder ``name`` (``rules``, ``knowledge`` or ``cases``)."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"advisor's {name}/ folder is missing from this installation")


def rules_dir() -> Path:
    return data_dir("rules")


def knowledge_dir() -> Path:
    return data_dir("knowledge")


def cases_dir() -> Path:
    return data_dir("cases")


def table_columns_file() -> Path:
    """The summary tables' columns as a file (advisor/schemas/table_columns.json), written
    by ``python -m advisor.tables.columns``: rule packs are checked against it without
    importing the tables (and pandas)."""
    return _PACKAGE / "schemas" / "table_columns.json"
