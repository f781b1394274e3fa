"""The code of the built-in rules, one module per rule, named after its id; importing this
package registers them with the engine. Each check reads the tables and the step model
through its RuleContext and returns findings, in three parts where the rule has them:
measure (the figures), decide (whether it fires, and which fix holds) and word (the
finding); thresholds come from the rule's spec in rules/builtin/<id>.yaml. ``common`` holds the
helpers they share."""

import importlib
import pkgutil

# Every module here but the helpers is a rule's check: found, not listed, so a new rule's
# module cannot be left out (a module that registers nothing is caught by
# tests/test_rules_registry.py).
HELPERS = frozenset({"common"})
CHECK_MODULES = tuple(sorted(info.name for info in pkgutil.iter_modules(__path__)
                             if info.name not in HELPERS and not info.name.startswith("_")))
for _name in CHECK_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
