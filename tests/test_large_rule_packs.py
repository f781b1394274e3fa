"""A large honest rule pack is read; a YAML bomb is not (advisor.rules.packs.yamlsource):
what is bounded is what aliases repeat, and the text's size, not the number of rules."""

from __future__ import annotations

import pytest

from advisor.cli import main

RULE = """  - id: rule-{i}
    title: Rule {i}
    severity: low
    table: operator
    condition: calls > @min_calls
    thresholds: {{min_calls: {i}, high_share: 0.5, min_saving_ms: 0.1}}
    saving:
      ns_per_step: cpu_total_ns / @steps
      basis: the op's time
    message: "{{key}} past {{high_share}} and {{min_saving_ms}}"
    recommendation: Nothing.
    evidence: [calls]
    docs: {{what: w, why: y, example: e, instead: i}}
"""


def test_a_pack_of_5000_rules_is_read_not_refused_as_a_bomb():
    from advisor.rules.packs.yamlsource import read_yaml

    text = "pack: large\nversion: 1\nrules:\n" + "".join(RULE.format(i=i) for i in range(5000))
    located = read_yaml(text)
    assert len(located.data["rules"]) == 5000 and located.line(("rules", 4999, "id")) == 3 + 4999 * 13 + 1


def test_aliases_are_bounded_by_what_they_repeat_and_text_by_its_size():
    from advisor.rules.packs.yamlsource import MAX_ALIAS_VALUES, MAX_PACK_CHARS, YamlSourceError, read_yaml

    shared = "common: &common {ratio: 1.0, min_saving_ms: 0.5}\nrules:\n" + "".join(
        f"  - {{id: r{i}, thresholds: *common}}\n" for i in range(1000))
    assert len(read_yaml(shared).data["rules"]) == 1000  # a few aliases, honestly used
    many = "a: &a x\nb: [" + ", ".join(["*a"] * (MAX_ALIAS_VALUES + 1)) + "]\n"
    with pytest.raises(YamlSourceError, match="anchors and aliases expand to more than"):
        read_yaml(many)
    with pytest.raises(YamlSourceError, match="larger than a rule pack may be"):
        read_yaml("pack: x\n#" + "x" * MAX_PACK_CHARS + "\n")


def test_a_pack_file_past_the_size_limit_is_refused(tmp_path, monkeypatch):
    from advisor.rules.packs import validate

    pack = tmp_path / "large.yaml"
    pack.write_text("pack: large\nversion: 1\nrules: []\n" + "#" * 2048 + "\n")
    monkeypatch.setattr(validate, "MAX_PACK_CHARS", 1024)
    pack_read, errors = validate.validate_file(pack)
    assert pack_read is None and [e.message for e in errors] == [
        "is 2,082 bytes: larger than a rule pack may be (1,024 bytes)"]


def test_validate_names_some_of_a_large_pack_s_rules(tmp_path, capsys):
    pack = tmp_path / "many.yaml"
    pack.write_text("pack: many\nversion: 1\nrules:\n" + "".join(RULE.format(i=i) for i in range(30)))
    assert main(["rules", "validate", str(pack)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith("ok, 30 rules (rule-0, rule-1, rule-2, rule-3, rule-4, rule-5, rule-6, rule-7, rule-8, "
                         "rule-9, rule-10, rule-11, rule-12, rule-13, rule-14, rule-15, rule-16, rule-17, rule-18, "
                         "rule-19 and 10 more)"), line
