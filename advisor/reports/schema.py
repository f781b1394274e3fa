"""The JSON Schema of the JSON report, generated from the :class:`Report` model.

The schema is committed as ``advisor/schemas/report.schema.json`` (it ships in the wheel)
so tools can validate a report without importing advisor; a test checks the committed file
equals what :func:`report_schema` generates. After changing the report models, regenerate:

    python -m advisor.reports.schema
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.reports.report import Report

__all__ = [
    "SCHEMA_PATH",
    "load_report_schema",
    "report_schema",
    "schema_text",
    "validate_report",
    "write_report_schema",
]

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "report.schema.json"


def report_schema() -> dict[str, Any]:
    """The report's JSON Schema (draft 2020-12), generated from the models now."""
    generated = Report.model_json_schema()
    schema: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    schema.update(generated)
    schema["title"] = "advisor report"
    schema["description"] = (
        "The JSON report of `advisor diagnose --format json`: session metadata, ranked findings "
        "with their evidence, and every summary table with its rows' stable keys."
    )
    return schema


def schema_text(schema: dict[str, Any] | None = None) -> str:
    """The schema as the committed file spells it."""
    return json.dumps(report_schema() if schema is None else schema, indent=2, ensure_ascii=False) + "\n"


def write_report_schema(path: str | Path = SCHEMA_PATH) -> Path:
    """Regenerate the committed schema file (or write it to ``path``)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(schema_text(), encoding="utf-8")
    return target


def load_report_schema() -> dict[str, Any]:
    """The committed schema file."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validate_report(data: dict[str, Any] | str) -> None:
    """Validate a JSON report (parsed, or its text) against the committed schema;
    raises ``jsonschema.ValidationError`` on the first error."""
    import jsonschema

    if isinstance(data, str):
        data = json.loads(data)
    # The committed schema's own validity is the tests' to check (tests/test_reports.py),
    # not every call's: checking it costs more than validating a report against it.
    jsonschema.Draft202012Validator(load_report_schema()).validate(data)


if __name__ == "__main__":
    print(write_report_schema())
