"""Every built-in rule documents itself the same way and is exercised by a case: the
sections `advisor rules show ID` prints, and a recorded case (cases/*/case.yaml) whose
`must` names it, or, for a rule only a GPU can make fire, a GPU case drafted in
cases/draft_gpu_cases.py that records it on the first GPU the project is lent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from advisor.rules import builtin_specs

CASES = Path(__file__).resolve().parent.parent / "cases"
SECTIONS = ("what", "why", "example", "instead")


def _recorded_musts() -> set[str]:
    musts: set[str] = set()
    for path in CASES.glob("*/case.yaml"):
        musts |= set(yaml.safe_load(path.read_text()).get("must") or [])
    return musts


def _drafted_musts() -> set[str]:
    spec = importlib.util.spec_from_file_location("draft_gpu_cases", CASES / "draft_gpu_cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return {rule for case in module.CASES for rule in case.must}


@pytest.mark.parametrize("rule", builtin_specs(), ids=lambda s: s.id)
def test_every_rule_has_every_section_of_its_docs(rule):
    for section in SECTIONS:
        text = getattr(rule.docs, section, "") or ""
        assert len(text.strip()) >= 20, f"{rule.id}: docs.{section} is missing or a stub"
    assert rule.title and rule.title[0].isupper() and not rule.title.endswith(".")


@pytest.mark.parametrize("rule", builtin_specs(), ids=lambda s: s.id)
def test_every_rule_has_a_case(rule):
    assert rule.id in _recorded_musts() | _drafted_musts(), (
        f"{rule.id}: no case must fire it; record one (cases/record.py) or, for a GPU-only rule, draft one "
        "in cases/draft_gpu_cases.py")
