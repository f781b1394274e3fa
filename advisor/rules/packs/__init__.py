"""Rule packs: rules written as data (YAML), checked, and run beside the built-in rules.

    spec         the format, as pydantic models (the JSON Schema is generated from them)
    yamlsource   YAML read with the line of every key, for FILE:LINE messages
    expressions  conditions and savings: a whitelist over Python's ast, evaluated by pandas
    templates    {placeholders} in messages and recommendations
    validate     every problem of a pack, with its file and line
    evaluate     a data rule's findings on the tables
    catalog      built-in rules + plugins (entry point group ``advisor.rules``) + the user's
                 packs, with the configuration applied
    config       advisor.toml / pyproject.toml [tool.advisor]
    schema       rules/rulepack.schema.json

A user's test of their own pack needs only::

    from advisor.rules import load_pack, run_rules
    run_rules(session, tables, load_pack("rules/team.yaml").rules)

The names below are imported on first use, so that building the command line's parser
(:mod:`advisor.cli.rules` names this package) does not load pandas and pydantic.
"""

from __future__ import annotations

from advisor._lazy import lazy_exports

_EXPORTS = {
    "ENTRY_POINT_GROUP": "catalog",
    "RuleSet": "catalog",
    "Selection": "catalog",
    "builtin_pack": "catalog",
    "load_pack": "catalog",
    "load_rules": "catalog",
    "plugin_packs": "catalog",
    "AdvisorConfig": "config",
    "ConfigInvalid": "config",
    "find_config": "config",
    "load_config": "config",
    "ExpressionError": "expressions",
    "check_expression": "expressions",
    "FACTS": "spec",
    "Lifecycle": "spec",
    "RuleDocs": "spec",
    "RulePack": "spec",
    "RuleSpec": "spec",
    "PackError": "validate",
    "PackInvalid": "validate",
    "validate_file": "validate",
    "validate_text": "validate",
}

__all__ = [
    "ENTRY_POINT_GROUP",
    "FACTS",
    "AdvisorConfig",
    "ConfigInvalid",
    "ExpressionError",
    "Lifecycle",
    "PackError",
    "PackInvalid",
    "RuleDocs",
    "RulePack",
    "RuleSet",
    "RuleSpec",
    "Selection",
    "builtin_pack",
    "check_expression",
    "find_config",
    "load_config",
    "load_pack",
    "load_rules",
    "plugin_packs",
    "validate_file",
    "validate_text",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
