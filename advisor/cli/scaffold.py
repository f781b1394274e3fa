"""`advisor rules new ID`: the files a new rule starts from.

Three files, under the folder given (the current one by default):

    rules/ID.yaml              a pack with the one rule, valid as written
    cases/ID/case.yaml         the case it must fire on: the command that records it
    tests/test_ID.py           a test: the pack validates, and on every recorded case the
                               rule fires where case.yaml says ``must`` and not ``must_not``

Nothing is overwritten: if any of the three exists, none is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from advisor.errors import UsageError
from advisor.rules.packs.spec import RULE_ID_PATTERN

__all__ = ["Scaffold", "scaffold", "write_scaffold"]

PACK = """\
# Rule pack {rule_id}. Check it with `advisor rules validate rules/{rule_id}.yaml`, read
# it with `advisor rules show {rule_id} --rules rules/{rule_id}.yaml`, run it with
# `advisor diagnose --rules rules/{rule_id}.yaml TARGET`.
#
# A data rule runs `condition` over each row of `table`; every row where it holds is a
# finding. Expressions are pandas eval syntax over the table's columns (`key` is the row's
# key); @name reads a threshold, a value or a fact (@steps, @mean_step_ns, @window_ns...).
# Messages fill {{column}}, {{threshold}} and {{saving_ns}} from the row. See the tables and
# their columns with `advisor summary TARGET --table NAME`.
pack: {rule_id}
version: 1
rules:
  - id: {rule_id}
    title: "TODO: one line naming the smell"
    severity: medium
    lifecycle: stable
    table: model
    condition: key == "Optimization" and cpu_ratio >= @share
    thresholds:
      share: 0.3                  # fire when the phase takes at least this share of the step
    saving:
      ns_per_step: cpu_avg_ns - @share * @mean_step_ns
      basis: the phase's time above the threshold share of the step
    message: >
      {{key}} takes {{cpu_ratio:%}} of each step ({{cpu_avg_ns}} per step over {{step_count}} steps);
      the threshold is {{share:%}}.
    recommendation: >
      TODO: what to change, concretely.
    evidence: [cpu_avg_ns, cpu_ratio]
    docs:
      what: >
        TODO: what the rule measures and when it fires.
      why: >
        TODO: why this costs time.
      example: |
        # TODO: code with the smell
      instead: |
        # TODO: the same code without it
"""

CASE = """\
description: >
  TODO: what the recorded program does and what is wrong with it, so that {rule_id} must
  fire. Add a second case, with the smell fixed, where it must not.
command: >-
  advisor diagnose --rules rules/{rule_id}.yaml --save cases/{rule_id}/session
  TODO_train.py
must: [{rule_id}]
must_not: []
"""

TEST = '''\
"""The rule {rule_id} (rules/{rule_id}.yaml) on the recorded cases in cases/.

A case is a folder with case.yaml (the command that records it, the rule ids it `must`
and `must_not` produce) and the session that command saved. Record one by running its
command from this folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from advisor.diagnosis import diagnose
from advisor.importers import load
from advisor.rules.packs import load_pack

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "rules" / "{rule_id}.yaml"
CASES = sorted(p.parent for p in (ROOT / "cases").glob("*/case.yaml"))


def test_the_pack_is_valid():
    assert "{rule_id}" in [rule.id for rule in load_pack(PACK).rules]


def fired(findings) -> set[str]:
    out = set()
    for finding in findings:
        out.add(finding.rule)
        out |= fired(finding.explains)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_case(case):
    spec = yaml.safe_load((case / "case.yaml").read_text())
    if not (case / "session").is_dir():
        pytest.skip("record the case first: " + " ".join(spec["command"].split()))
    session = load(case / "session")
    rules = load_pack(PACK).rules
    diagnosis = diagnose(session, specs=rules)
    assert diagnosis.result.errors == []
    result = diagnosis.result
    ours = {{rule.id for rule in rules}}
    for rule in set(spec.get("must") or []) & ours:
        assert rule in fired(result.findings), f"{{case.name}} must produce {{rule}}"
    for rule in set(spec.get("must_not") or []) & ours:
        assert rule not in fired(result.findings), f"{{case.name}} must not produce {{rule}}"
'''


@dataclass
class Scaffold:
    pack: Path
    case: Path
    test: Path


def scaffold(rule_id: str, folder: Path) -> tuple[Scaffold, dict[Path, str]]:
    """The three paths and their text, for ``rule_id`` under ``folder``."""
    if not re.match(RULE_ID_PATTERN, rule_id):
        raise UsageError(f"{rule_id!r} is not a rule id: lowercase words and digits joined by '-' "
                         f"(as in slow-optimizer-step)")
    paths = Scaffold(
        pack=folder / "rules" / f"{rule_id}.yaml",
        case=folder / "cases" / rule_id / "case.yaml",
        test=folder / "tests" / f"test_{rule_id.replace('-', '_')}.py",
    )
    texts = {
        paths.pack: PACK.format(rule_id=rule_id),
        paths.case: CASE.format(rule_id=rule_id),
        paths.test: TEST.format(rule_id=rule_id),
    }
    return paths, texts


def write_scaffold(rule_id: str, folder: Path, *, taken: set[str] = frozenset()) -> Scaffold:
    """Write the three files; refuses (writing nothing) where one exists or ``rule_id`` is
    in ``taken`` (the ids of the rules already loaded)."""
    if rule_id in taken:
        raise UsageError(f"{rule_id!r} is already a rule's id; pick another")
    paths, texts = scaffold(rule_id, folder)
    existing = [str(p) for p in texts if p.exists()]
    if existing:
        raise UsageError(f"{existing[0]} already exists; `advisor rules new` overwrites nothing")
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return paths
