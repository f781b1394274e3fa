"""The rule-pack JSON Schema, generated from the pydantic models.

The schema is committed as ``rules/rulepack.schema.json`` (it ships with the rules) so an
editor can check a pack as it is written; a test checks the committed file equals what
:func:`rulepack_schema` generates. After changing :mod:`advisor.rules.packs.spec`:

    python -m advisor.rules.packs.schema

The schema says what the models say (fields, types, ids, enums). What needs the table
catalogue (table and column names, expressions, placeholders) only ``advisor rules
validate`` checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.paths import rules_dir
from advisor.rules.packs.spec import RulePack

__all__ = ["SCHEMA_NAME", "load_rulepack_schema", "rulepack_schema", "schema_path", "schema_text",
           "write_rulepack_schema"]

SCHEMA_NAME = "rulepack.schema.json"


def schema_path() -> Path:
    return rules_dir() / SCHEMA_NAME


def _close_pattern_objects(node: Any) -> None:
    """pydantic writes a dict with constrained keys as ``patternProperties`` only, which
    lets any other key through; the models refuse such keys, so the schema does too."""
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close_pattern_objects(value)
    elif isinstance(node, list):
        for value in node:
            _close_pattern_objects(value)


def rulepack_schema() -> dict[str, Any]:
    """The rule pack's JSON Schema (draft 2020-12), generated from the models now."""
    generated = RulePack.model_json_schema()
    _close_pattern_objects(generated)
    schema: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    schema.update(generated)
    schema["title"] = "advisor rule pack"
    schema["description"] = (
        "A pack of advisor rules: each names the summary table it reads, a condition over the "
        "table's columns, thresholds users can override, the message, recommendation, estimated "
        "saving and evidence of its findings, and its documentation. `advisor rules validate PACK` "
        "also checks table and column names, expressions and placeholders."
    )
    return schema


def schema_text(schema: dict[str, Any] | None = None) -> str:
    """The schema as the committed file spells it."""
    return json.dumps(rulepack_schema() if schema is None else schema, indent=2, ensure_ascii=False) + "\n"


def write_rulepack_schema(path: str | Path | None = None) -> Path:
    """Regenerate the committed schema file (or write it to ``path``)."""
    target = Path(path) if path is not None else schema_path()
    target.write_text(schema_text(), encoding="utf-8")
    return target


def load_rulepack_schema() -> dict[str, Any]:
    """The committed schema file."""
    return json.loads(schema_path().read_text(encoding="utf-8"))


if __name__ == "__main__":
    print(write_rulepack_schema())
