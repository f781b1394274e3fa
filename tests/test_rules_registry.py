"""A rule is found wherever it must be, and one left out of any list is caught: every check
module registers the rule it is named after, every built-in spec has a check, docs/rules.md
has a row for each rule, and cases/README.md one for each recorded case."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from advisor.rules import builtin_specs, checks
from advisor.rules.registry import registered

REPO = Path(__file__).resolve().parents[1]


def _rows(path: Path, pattern: str) -> list[str]:
    return re.findall(pattern, path.read_text(), re.MULTILINE)


def test_every_check_module_is_found_and_registers_its_rule():
    found = set(registered())
    for name in checks.CHECK_MODULES:
        assert name.replace("_", "-") in found, f"advisor/rules/checks/{name}.py registers no rule of its name"
    assert len(found) == len(checks.CHECK_MODULES), "a check module registers more than its own rule"


def test_every_built_in_rule_has_its_check_and_no_check_is_without_a_rule():
    ids = {spec.id for spec in builtin_specs()}
    assert ids == set(registered()), (f"specs without a check: {sorted(ids - set(registered()))}; checks without "
                                      f"a spec in rules/builtin/: {sorted(set(registered()) - ids)}")

    from advisor.rules.packs.catalog import builtin_dir

    for file in sorted(builtin_dir().glob("*.yaml")):
        module = file.stem.replace("-", "_")
        assert (REPO / "advisor" / "rules" / "checks" / f"{module}.py").is_file(), \
            f"{file.name}: no advisor/rules/checks/{module}.py of its name"
        assert [spec.id for spec in builtin_specs() if Path(spec.source.rsplit(":", 1)[0]).name == file.name] == [file.stem], \
            f"{file.name} holds other rules than {file.stem}, its name"


def test_docs_rules_has_a_row_for_every_rule_and_no_other():
    rows = _rows(REPO / "docs" / "rules.md", r"^\| `([a-z0-9-]+)` \|")
    ids = {spec.id for spec in builtin_specs()}
    assert len(rows) == len(set(rows)), "a rule has two rows in docs/rules.md"
    assert set(rows) == ids, f"missing: {sorted(ids - set(rows))}; unknown: {sorted(set(rows) - ids)}"


def test_cases_readme_has_a_row_for_every_recorded_case_and_no_other():
    rows = _rows(REPO / "cases" / "README.md", r"^\| `((?:cpu|gpu|synth)_[a-z0-9_]+)` \|")
    cases = {p.parent.name for p in (REPO / "cases").glob("*/case.yaml")}
    assert len(rows) == len(set(rows)), "a case has two rows in cases/README.md"
    assert set(rows) == cases, f"missing: {sorted(cases - set(rows))}; unknown: {sorted(set(rows) - cases)}"


@pytest.mark.parametrize("case", sorted(p.parent.name for p in (REPO / "cases").glob("*/case.yaml")))
def test_a_case_row_says_what_its_case_yaml_says_must_fire(case):
    """The README's 'must' column opens with the case's must list (its words may follow)."""
    spec = yaml.safe_load((REPO / "cases" / case / "case.yaml").read_text())
    row = next(line for line in (REPO / "cases" / "README.md").read_text().splitlines()
               if line.startswith(f"| `{case}` |"))
    must_cell = row.split(" | ")[2]
    for rule in spec.get("must") or []:
        assert rule in must_cell, f"{case}: the README's must column does not name {rule}"

