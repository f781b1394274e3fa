"""Rules: what turns the summary tables into findings.

    engine      runs the chosen rules over the tables, ranks the findings and nests each
                symptom under the cause that explains it (the cause graph: rules ordered causes first)
    registry    the Python checks by rule id, and RuleContext: what a check may read
    savings     a fix replayed on the step model's graph as a finding's saving, and the
                floors worker processes and cores set
    copy_rates  the rate a copy to or from the host reaches from pinned memory (the
                session, advisor calibrate, or the GPU's PCIe link), for fixes that pin
    kernel_why  a profiled kernel's counters (the kernel_counters table) in words: why
                it is slow, or that it already runs at the hardware's limit
    checks/     the built-in Python checks, one module per rule, named after its id
    packs/      rules as data: the YAML pack format, its validation, data-rule
                evaluation, the built-in rules (rules/builtin/), plugins and config

A new built-in rule is a file rules/builtin/<id>.yaml and, unless its condition is data,
a check checks/<id>.py registered under its id. Rules read tables and the step model (and the
knowledge base), never files, collectors or reports.

A user's test of their own pack needs only::

    from advisor.rules import load_pack, run_rules
    run_rules(session, tables, load_pack("rules/team.yaml").rules)

and a Python rule from another package::

    from advisor.rules import RuleContext, register

    @register("my-rule")
    def my_rule(ctx: RuleContext) -> list: ...
"""

from __future__ import annotations

from advisor._lazy import lazy_exports

_EXPORTS = {
    "EngineResult": "engine",
    "builtin_specs": "engine",
    "run_rules": "engine",
    "run_job_rules": "engine",
    "Check": "registry",
    "RuleContext": "registry",
    "register": "registry",
    "load_pack": "packs",
    "RulePack": "packs",
    "RuleSpec": "packs",
}

__all__ = [
    "Check",
    "EngineResult",
    "RuleContext",
    "RulePack",
    "RuleSpec",
    "builtin_specs",
    "load_pack",
    "register",
    "run_job_rules",
    "run_rules",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
