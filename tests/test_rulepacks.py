"""Rule packs that users write: the format and its schema, validation with file and line,
expressions that cannot run code, the example pack on its cases, configuration, plugins
through the ``advisor.rules`` entry point, and the `advisor rules` commands.

Schema tests are file pairs in tests/rulepacks/ (as Semgrep's): ``NAME.ok.yaml`` must
validate, and ``NAME.fail.yaml`` must fail with exactly the problems its header lists,

    # schema: valid | invalid | unreadable    what the committed JSON Schema says of it
    # expect: LINE: MESSAGE                    one line per problem, all of them

so a change in any message, line or count shows up here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml

from advisor.cli import FAIL_ON_EXIT, main
from advisor.errors import RulePackError
from advisor.findings import Evidence, Finding, Saving, Severity
from advisor.importers import load
from advisor.rules import RuleContext, engine, register, registry, run_rules
from advisor.rules.packs import catalog
from advisor.rules.packs.catalog import builtin_pack, load_pack, load_rules
from advisor.rules.packs.config import ConfigInvalid, find_config, load_config
from advisor.rules.packs.expressions import (
    ExpressionError,
    check_expression,
    evaluate,
    evaluation_frame,
)
from advisor.rules.packs.spec import RuleDocs, RuleSpec, SavingSpec
from advisor.rules.packs.schema import (
    load_rulepack_schema,
    rulepack_schema,
    schema_text,
)
from advisor.rules.packs.templates import TemplateError, check_template, fill
from advisor.rules.packs.validate import PackInvalid, validate_file, validate_text
from advisor.session import CollectorInfo, Session, SessionMeta, empty_events
from advisor.tables import compute_tables

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "tests" / "rulepacks"
CASES = REPO / "cases"
EXAMPLE = REPO / "rules" / "examples" / "team.yaml"
PAIR_NAMES = sorted({p.name.split(".")[0] for p in PAIRS.glob("*.yaml")})


def _known() -> set[str]:
    return {s.id for s in builtin_pack().rules}


def _validate(path: Path):
    return validate_file(path, known_ids=_known(), registered=set(engine.checks()))


def _header(path: Path) -> tuple[str, list[str]]:
    verdict, expected = "", []
    for line in path.read_text().splitlines():
        if line.startswith("# schema:"):
            verdict = line.split(":", 1)[1].strip()
        elif line.startswith("# expect:"):
            expected.append(line.split(":", 1)[1].strip())
    return verdict, expected


def _flatten(findings: list[Finding]) -> list[Finding]:
    out = []
    for finding in findings:
        out.append(finding)
        out.extend(_flatten(finding.explains))
    return out


_EVALUATED: dict[str, tuple] = {}


def _case(name: str):
    """(session, tables) of a recorded case, computed once per test run."""
    if name not in _EVALUATED:
        session = load(CASES / name / "session")
        _EVALUATED[name] = (session, compute_tables(session))
    return _EVALUATED[name]


def _empty_session() -> Session:
    return Session(SessionMeta(source="x", source_format="test", collector=CollectorInfo(name="test")),
                   empty_events())


# -- the schema -------------------------------------------------------------------------------


def test_committed_schema_is_the_generated_one():
    """rules/rulepack.schema.json is generated from the models: after changing them run
    `python -m advisor.rules.packs.schema`."""
    assert (REPO / "rules" / "rulepack.schema.json").read_text() == schema_text()
    assert load_rulepack_schema() == rulepack_schema()


def test_schema_is_valid_and_every_property_is_described():
    schema = load_rulepack_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    objects = [schema, *schema["$defs"].values()]
    for definition in objects:
        for name, prop in definition.get("properties", {}).items():
            assert prop.get("description"), f"{definition.get('title')}.{name} has no description"


@pytest.mark.parametrize("pack", [*(f"builtin/{p.name}" for p in sorted((REPO / "rules" / "builtin").glob("*.yaml"))),
                                  "examples/team.yaml"])
def test_shipped_packs_validate_against_the_schema(pack):
    data = yaml.safe_load((REPO / "rules" / pack).read_text())
    jsonschema.Draft202012Validator(load_rulepack_schema()).validate(data)


# -- ok / fail pairs --------------------------------------------------------------------------


def test_every_pair_is_complete():
    assert len(PAIR_NAMES) >= 10
    for name in PAIR_NAMES:
        assert (PAIRS / f"{name}.ok.yaml").is_file(), f"{name} has no .ok.yaml"
        assert (PAIRS / f"{name}.fail.yaml").is_file(), f"{name} has no .fail.yaml"


@pytest.mark.parametrize("name", PAIR_NAMES)
def test_ok_file_validates_and_runs(name):
    path = PAIRS / f"{name}.ok.yaml"
    pack, errors = _validate(path)
    assert errors == [] and pack is not None
    jsonschema.Draft202012Validator(load_rulepack_schema()).validate(yaml.safe_load(path.read_text()))
    # What validates also evaluates: on a case with steps and user ranges, none fails.
    session, tables = _case("cpu_validate_every_step")
    ids = {s.id for s in pack.rules}
    result = run_rules(session, tables, pack.rules, enabled=ids, preview=True)
    assert result.errors == []
    assert set(result.ran) == ids


@pytest.mark.parametrize("name", PAIR_NAMES)
def test_fail_file_lists_every_problem_with_its_line(name):
    path = PAIRS / f"{name}.fail.yaml"
    verdict, expected = _header(path)
    assert expected, f"{path.name} lists no expected problem"
    pack, errors = _validate(path)
    assert pack is None
    assert [f"{e.line}: {e.message}" for e in errors] == expected
    assert all(str(e).startswith(f"tests/rulepacks/{path.name}:") for e in errors)
    # The JSON Schema sees what the models see; names, expressions and placeholders only
    # `advisor rules validate` checks.
    assert verdict in ("valid", "invalid", "unreadable")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        assert verdict == "unreadable"
        return
    schema_errors = list(jsonschema.Draft202012Validator(load_rulepack_schema()).iter_errors(data))
    assert (verdict == "invalid") == bool(schema_errors), [e.message for e in schema_errors]


def test_a_pack_that_is_not_text_or_not_there(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00rules")
    assert "not UTF-8" in str(validate_file(binary)[1][0])
    assert "no such rule pack" in str(validate_file(tmp_path / "nope.yaml")[1][0])
    assert "a mapping" in str(validate_text("", "empty.yaml")[1][0])


def test_load_pack_raises_one_line_naming_the_first_problem_and_the_count():
    with pytest.raises(RulePackError) as caught:
        load_pack(PAIRS / "types.fail.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("tests/rulepacks/types.fail.yaml:") and "(and 8 more problems" in message
    assert len(caught.value.errors) == 9


# -- expressions ------------------------------------------------------------------------------

HOSTILE = {
    "import": '__import__("os").system("touch owned")',
    "builtin call": 'open("/etc/passwd")',
    "eval": 'eval("1")',
    "attribute": "key.__class__",
    "attribute of an allowed call": 'key.str.startswith("a").__class__',
    "dunder local": "@__builtins__ > 0",
    "private local": "@_secret > 0",
    "subscript": "key[0]",
    "lambda": "(lambda: 1)()",
    "comprehension": "[c for c in key]",
    "generator": "sum(c for c in calls)",
    "walrus": "(x := 1)",
    "conditional": "calls if calls else 0",
    "power bomb": "10 ** 10 ** 10",
    "string bomb": '"a" * 1000000000',
    "f-string": 'f"{key}" == "x"',
    "method": "calls.sum()",
    "str method not whitelisted": 'key.str.extract("(.*)")',
    "str method with a column argument": "key.str.startswith(key)",
    "keyword argument": "abs(x=calls)",
    "statement": "import os",
    "two statements": "calls; calls",
    "backticks": "`cpu ratio` > 1",
    "unknown column": "nonsense > 1",
    "unknown local": "calls > @secret",
    "is": "key is None",
    "in a column": "key in calls",
    "dict": "{1: 2}",
    "bytes": 'b"x" == key',
    "matmul": "calls @ calls",
    "too long": "calls + " * 200 + "calls",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_expressions_are_refused(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ExpressionError) as caught:
        check_expression(HOSTILE[name], columns=["key", "calls"], local_names=["share"])
    assert str(caught.value)
    assert not (tmp_path / "owned").exists()


ALLOWED = [
    'key == "Forward" and calls > @share',
    "not (calls == 0) or ~(calls != calls)",
    "1 < calls <= 3 & calls % 2 == 1 | calls // 2 >= 1",
    'key in ["a", "b"] and key not in ("c",)',
    'key.str.startswith("For") or key.str.endswith("ward") or key.str.contains("w")',
    "abs(-calls) + sqrt(calls) + log1p(calls) + exp(0) + floor(1.5) + ceil(1.5) + log(1) + log10(1)",
    'key == "aten::item @ examples/host_sync.py:69"',
]


@pytest.mark.parametrize("text", ALLOWED)
def test_allowed_expressions_check_and_evaluate(text):
    checked = check_expression(text, columns=["key", "calls"], local_names=["share"])
    assert checked.columns <= {"key", "calls"}
    frame = evaluation_frame(pd.DataFrame({"calls": [1, 3]}, index=pd.Index(["Forward", "Backward"], name="key")))
    result = evaluate(text, frame, {"share": 0.5})
    assert len(result) == 2


def test_an_at_inside_a_string_is_text():
    frame = evaluation_frame(pd.DataFrame({"calls": [6]}, index=pd.Index(["aten::item @ x.py:69"], name="key")))
    assert evaluate('key == "aten::item @ x.py:69"', frame, {}).tolist() == [True]


def test_evaluate_checks_again_and_sees_no_caller_variables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    secret = 42  # noqa: F841  (pandas would resolve @secret from the caller's frame)
    frame = evaluation_frame(pd.DataFrame({"calls": [1]}, index=pd.Index(["a"], name="key")))
    with pytest.raises(ExpressionError):
        evaluate("calls == @secret", frame, {})
    with pytest.raises(ExpressionError):
        evaluate('__import__("os").system("touch owned")', frame, {})
    assert not (tmp_path / "owned").exists()


def test_arithmetic_on_a_text_column_fails_instead_of_repeating_it():
    frame = evaluation_frame(pd.DataFrame({"name": ["x"]}, index=pd.Index(["a"], name="key")))
    with pytest.raises(TypeError):
        evaluate("name * 100000000", frame, {})


# -- templates --------------------------------------------------------------------------------


def test_placeholders_are_formatted_by_their_kind():
    values = {"cpu_avg_ns": 7_190_000, "cpu_ratio": 0.4117, "calls": 4458, "share": 0.3, "key": "Optimization"}
    text = fill("{key}: {cpu_avg_ns} ({cpu_ratio}), {cpu_ratio:%}, {cpu_avg_ns:time}, {calls:count}, "
                "{share:.2f}, {{x}}", values)
    assert text == "Optimization: 7.19 ms (41.2%), 41.2%, 7.19 ms, 4,458, 0.30, {x}"
    assert fill("{cpu_ratio}", {"cpu_ratio": float("nan")}) == "-"


@pytest.mark.parametrize("template", ["{key.__class__}", "{key[0]}", "{0}", "{}", "{key!r}", "{nope}",
                                      "{key:{calls}}", "{calls:%z}", "{"])
def test_hostile_placeholders_are_refused(template):
    with pytest.raises(TemplateError):
        check_template(template, ["key", "calls"])


# Hostile packs kept as data, one kind each (expressions in conditions, derived columns,
# savings and thresholds; message and recommendation placeholders; YAML bombs and python
# tags): `advisor rules validate` refuses each, and `diagnose` with it stops in one line.
HOSTILE_PACKS = sorted((PAIRS / "hostile").glob("*.yaml"))


def test_at_least_forty_kinds_of_hostile_pack_are_kept():
    assert len(HOSTILE_PACKS) >= 40


@pytest.mark.parametrize("path", HOSTILE_PACKS, ids=lambda p: p.stem)
def test_a_hostile_pack_is_refused_by_validate_and_inert_under_diagnose(path, tmp_path, monkeypatch, capsys,
                                                                       make_trace):
    monkeypatch.chdir(tmp_path)
    assert main(["rules", "validate", str(path)]) == 1
    said = capsys.readouterr()
    assert str(path) in said.out + said.err and "Traceback" not in said.out + said.err
    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    assert main(["diagnose", str(trace), "--rules", str(path), "--format", "json"]) == 2
    said = capsys.readouterr()
    (line,) = said.err.strip().splitlines()
    assert line.startswith(f"advisor: {path}") and not said.out
    assert list(tmp_path.iterdir()) == [trace]  # nothing ran: no "owned", nothing written


def test_fill_refuses_what_validation_would_have():
    with pytest.raises(TemplateError):
        fill("{key.__class__.__init__.__globals__}", {"key": "x"})


# -- the example pack on its cases ------------------------------------------------------------

# rule -> the case it must fire on; it must not fire on any other case here.
EXAMPLE_FIRES = {
    "slow-optimizer-step": "cpu_slow_optimizer",
    "too-many-launches": "cpu_per_sample_loop",
    "slow-user-region": "cpu_validate_every_step",
}
EXAMPLE_CASES = ["cpu_clean_train", "cpu_host_sync", "cpu_starved_loader", *EXAMPLE_FIRES.values()]


def _example_findings(case: str) -> dict[str, list[Finding]]:
    session, tables = _case(case)
    result = run_rules(session, tables, load_pack(EXAMPLE).rules)
    assert result.errors == [], result.errors
    by_rule: dict[str, list[Finding]] = {}
    for finding in _flatten(result.findings):
        by_rule.setdefault(finding.rule, []).append(finding)
    return by_rule


def test_example_pack_has_three_documented_rules():
    pack = load_pack(EXAMPLE)
    assert [s.id for s in pack.rules] == list(EXAMPLE_FIRES)
    for spec in pack.rules:
        assert spec.is_data_rule and spec.thresholds and spec.docs.example and spec.docs.instead


@pytest.mark.parametrize("case", EXAMPLE_CASES)
@pytest.mark.parametrize("rule", EXAMPLE_FIRES)
def test_example_rule_fires_on_its_case_and_no_other(rule, case):
    fired = _example_findings(case)
    if EXAMPLE_FIRES[rule] == case:
        assert rule in fired, f"{rule} must fire on {case}; fired: {sorted(fired)}"
    else:
        assert rule not in fired, f"{rule} must not fire on {case}: {fired[rule][0].message}"


def test_slow_optimizer_finding_cites_its_rows():
    finding = _example_findings("cpu_slow_optimizer")["slow-optimizer-step"][0]
    _, tables = _case("cpu_slow_optimizer")
    model = tables["model"]
    excess = model.loc["Optimization", "cpu_avg_ns"] - (model.loc["Forward", "cpu_avg_ns"]
                                                        + model.loc["Backward", "cpu_avg_ns"])
    assert finding.saving.ms_per_step == pytest.approx(excess / 1e6, abs=1e-3)
    assert finding.severity is Severity.high  # the optimizer is over half the step
    cited = {(e.table, e.row, e.column) for e in finding.evidence}
    assert {("model", "Optimization", "cpu_avg_ns"), ("model", "Forward", "cpu_avg_ns"),
            ("model", "Backward", "cpu_avg_ns")} <= cited
    assert "more than forward" in finding.message and "{" not in finding.message


def test_slow_region_names_the_region_and_leaves_torch_ranges_alone():
    findings = _example_findings("cpu_validate_every_step")["slow-user-region"]
    assert [f.evidence[0].row for f in findings] == ['validate']
    assert '"validate"' in findings[0].message
    # a share of the recorded window, and that share of the job's own step
    _, tables = _case("cpu_validate_every_step")
    assert findings[0].metrics["share_of_step"] == pytest.approx(tables["userdefined"].loc["validate", "cpu_ratio"])
    assert findings[0].metrics["share_of_step"] <= 1
    # cpu_clean_train's Optimizer.step range is 40% of its step, and is torch's own.
    _, tables = _case("cpu_clean_train")
    assert tables["userdefined"].loc["Optimizer.step#AdamW.step", "cpu_ratio"] > 0.25


def test_launch_count_is_per_step():
    finding = _example_findings("cpu_per_sample_loop")["too-many-launches"][0]
    _, tables = _case("cpu_per_sample_loop")
    per_step = tables["overview"].loc["Operator", "calls"] / tables["model"].loc["ProfileStep", "calls"]
    assert finding.metrics["per_step"] == pytest.approx(per_step)
    assert finding.saving.ms_per_step == pytest.approx((per_step - 2000) * 5000 / 1e6, abs=1e-3)


def test_no_example_rule_fires_on_an_empty_session():
    session = _empty_session()
    result = run_rules(session, compute_tables(session), load_pack(EXAMPLE).rules)
    assert result.findings == [] and result.errors == []
    assert set(result.skipped) == set(EXAMPLE_FIRES)  # they all need steps


# -- running packs: failures, lifecycle, thresholds -------------------------------------------


def _data_rule(rule_id: str, condition: str, **extra) -> RuleSpec:
    fields = {"id": rule_id, "title": rule_id, "severity": Severity.low, "table": "model", "condition": condition,
              "saving": SavingSpec(ns_per_step="cpu_avg_ns"), "message": "{key} {cpu_avg_ns}", "recommendation": "r",
              "docs": RuleDocs(what="w", why="y", example="e", instead="i")}
    fields.update(extra)
    return RuleSpec(**fields)


def test_a_data_rule_that_fails_at_run_time_is_skipped_and_the_others_run():
    session, tables = _case("cpu_clean_train")
    broken = _data_rule("broken-at-run-time", 'cpu_avg_ns.str.startswith("x")')  # a number column
    fine = _data_rule("fine-rule", 'key == "Backward"')
    result = run_rules(session, tables, [broken, fine])
    assert [f.rule for f in result.findings] == ["fine-rule"]
    assert len(result.errors) == 1 and result.errors[0].startswith("rule broken-at-run-time failed and was skipped")


def test_a_hostile_rule_built_in_code_is_refused_at_run_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session, tables = _case("cpu_clean_train")
    hostile = _data_rule("hostile", '__import__("os").system("touch owned") == 0')
    result = run_rules(session, tables, [hostile])
    assert "ExpressionError" in result.errors[0] and not (tmp_path / "owned").exists()


def test_escalate_and_limit():
    session, tables = _case("cpu_clean_train")
    spec = _data_rule("every-phase", 'key != "ProfileStep" and cpu_avg_ns > 0', limit=2,
                      escalate=[{"severity": "high", "when": 'key == "Optimization"'}])
    findings = run_rules(session, tables, [spec]).findings
    assert [f.evidence == [] for f in findings] == [True, True]
    assert [f.message.split()[0] for f in findings] == ["Optimization", "Backward"]  # largest saving first
    assert [f.severity for f in findings] == [Severity.high, Severity.low]


def test_config_thresholds_change_what_fires(tmp_path):
    (tmp_path / "advisor.toml").write_text(textwrap.dedent(f"""\
        packs = ["{EXAMPLE}"]
        [thresholds.slow-optimizer-step]
        ratio = 0.5
        """))
    config = load_config(find_config([tmp_path]))
    selection = load_rules(config=config).configure(config)
    spec = next(s for s in selection.specs if s.id == "slow-optimizer-step")
    assert spec.thresholds["ratio"] == 0.5 and spec.thresholds["min_saving_ms"] == 0.5
    session, tables = _case("cpu_clean_train")  # optimizer at 0.8x forward + backward
    fired = {f.rule for f in run_rules(session, tables, selection.specs).findings}
    assert "slow-optimizer-step" in fired
    assert load_pack(EXAMPLE).rules[0].thresholds["ratio"] == 1.0  # the pack itself is untouched


def test_lifecycle_and_requirements_decide_what_runs():
    session, tables = _case("cpu_clean_train")
    stable = _data_rule("stable-rule", 'key == "Backward"')
    preview = _data_rule("preview-rule", 'key == "Backward"', lifecycle="preview")
    deprecated = _data_rule("deprecated-rule", 'key == "Backward"', lifecycle="deprecated")
    gpu = _data_rule("gpu-rule", 'key == "Backward"', requires=["gpu"])
    specs = [stable, preview, deprecated, gpu]
    result = run_rules(session, tables, specs)
    assert result.ran == ["stable-rule"]
    assert set(result.skipped) == {"preview-rule", "deprecated-rule", "gpu-rule"}
    assert run_rules(session, tables, specs, preview=True).ran == ["stable-rule", "preview-rule"]
    assert run_rules(session, tables, specs, enabled={"deprecated-rule"}).ran == ["stable-rule", "deprecated-rule"]
    assert run_rules(session, tables, specs, disabled={"stable-rule"}).ran == []


# -- configuration ----------------------------------------------------------------------------


def test_config_is_found_advisor_toml_first_then_pyproject_then_the_script_folder(tmp_path):
    here, script = tmp_path / "here", tmp_path / "script"
    here.mkdir(), script.mkdir()
    (here / "pyproject.toml").write_text('[project]\nname = "x"\n')  # no [tool.advisor]: not ours
    (script / "pyproject.toml").write_text('[tool.advisor]\ndisable = ["low-gpu-utilization"]\n')
    assert find_config([here, script]) == script / "pyproject.toml"
    assert load_config(script / "pyproject.toml").disable == ["low-gpu-utilization"]
    (here / "advisor.toml").write_text("preview = true\n")
    assert find_config([here, script]) == here / "advisor.toml"
    assert find_config([tmp_path]) is None


@pytest.mark.parametrize(("text", "words"), [
    ("packs = [", "not valid TOML"),
    ("colour = 'red'\n", "unknown key 'colour'"),
    ("disable = 'low-gpu-utilization'\n", "disable"),
    ("fail_on = 'urgent'\n", "fail_on"),
    ("[thresholds.dataloader-starvation]\ndataloader_share = '0.2'\n", "dataloader_share"),
])
def test_bad_config_is_one_clear_error(tmp_path, text, words):
    (tmp_path / "advisor.toml").write_text(text)
    with pytest.raises(ConfigInvalid) as caught:
        load_config(tmp_path / "advisor.toml")
    assert words in str(caught.value) and "advisor.toml" in str(caught.value)


@pytest.mark.parametrize(("text", "words"), [
    ('disable = ["dataloader-starvaton"]\n', "no rule 'dataloader-starvaton'"),
    ('[thresholds.dataloader-starvation]\nshare = 0.2\n', "has no threshold 'share'"),
    ('enable = ["nope"]\n', "no rule 'nope'"),
])
def test_config_naming_rules_or_thresholds_that_do_not_exist_is_an_error(tmp_path, text, words):
    (tmp_path / "advisor.toml").write_text(text)
    config = load_config(tmp_path / "advisor.toml")
    with pytest.raises(ConfigInvalid) as caught:
        load_rules(config=config, plugins=False).configure(config)
    assert words in str(caught.value)


def test_a_renamed_rule_is_followed_with_a_note(tmp_path):
    pack = tmp_path / "renamed.yaml"
    pack.write_text((PAIRS / "ids.ok.yaml").read_text())
    (tmp_path / "advisor.toml").write_text('packs = ["renamed.yaml"]\ndisable = ["old-name"]\n')
    config = load_config(tmp_path / "advisor.toml")
    rules = load_rules(config=config, plugins=False)
    selection = rules.configure(config)
    assert selection.disabled == {"new-name"}
    assert any("renamed new-name" in note for note in selection.notes)
    assert rules.spec("older-name").id == "new-name"


def test_a_pack_clashing_with_a_builtin_id_is_refused(tmp_path):
    pack = tmp_path / "clash.yaml"
    pack.write_text((PAIRS / "python-rule.ok.yaml").read_text())  # id low-gpu-utilization
    with pytest.raises(PackInvalid) as caught:
        load_rules([pack], plugins=False)
    assert "already a rule of the builtin pack" in str(caught.value)
    assert str(caught.value).startswith(f"{pack}:5:") or "clash.yaml:5:" in str(caught.value)


# -- plugins through the advisor.rules entry point ---------------------------------------------

PLUGIN_PACK = """\
pack: acme
rules:
  - id: acme-many-ops
    title: ACME's own check, in Python
    severity: low
    tables: [overview]
    thresholds: {max_ops: 100}
    docs: {what: w, why: y, example: e, instead: i}
"""

PLUGIN_MODULE = """\
from pathlib import Path

from advisor.rules import register
from advisor.findings import Finding, Saving


@register("acme-many-ops")
def check(ctx):
    calls = ctx.table("overview").loc["Operator", "calls"] / max(ctx.step_count, 1)
    if calls <= ctx.threshold("max_ops"):
        return []
    return [Finding(rule=ctx.spec.id, title=ctx.spec.title, severity="low", confidence=0.5,
                    saving=Saving(ms_per_step=0.1, share_of_step=0.01), message=f"{calls:.0f} ops",
                    recommendation="fewer")]


pack = Path(__file__).with_name("acme_rules.yaml")
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Fake installed plugins: modules on sys.path and entry points naming them."""
    monkeypatch.setattr(registry, "_CHECKS", dict(engine.checks()))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "acme_rules.py").write_text(PLUGIN_MODULE)
    (tmp_path / "acme_rules.yaml").write_text(PLUGIN_PACK)
    (tmp_path / "broken_rules.py").write_text("raise RuntimeError('this plugin is broken')\n")
    (tmp_path / "bad_pack_rules.py").write_text("pack = __file__.replace('.py', '.yaml')\n")
    (tmp_path / "bad_pack_rules.yaml").write_text("pack: bad\nrules:\n  - id: x\n")
    entries = [
        metadata.EntryPoint("acme", "acme_rules:pack", catalog.ENTRY_POINT_GROUP),
        metadata.EntryPoint("broken", "broken_rules:pack", catalog.ENTRY_POINT_GROUP),
        metadata.EntryPoint("badpack", "bad_pack_rules:pack", catalog.ENTRY_POINT_GROUP),
    ]

    def entry_points(*, group):
        return [e for e in entries if e.group == group]

    monkeypatch.setattr(catalog.metadata, "entry_points", entry_points)
    for name in ("acme_rules", "broken_rules", "bad_pack_rules"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return entries


def test_plugin_rules_load_through_the_entry_point_and_run(plugins):
    rules = load_rules()
    assert rules.origin["acme-many-ops"] == "acme"
    assert "acme-many-ops" in engine.checks()
    # The broken plugins are reported and skipped; the good one and the built-in rules load.
    assert len(rules.problems) == 2
    assert any("broken" in p and "RuntimeError: this plugin is broken" in p for p in rules.problems)
    assert any("badpack" in p and "invalid" in p for p in rules.problems)
    session, tables = _case("cpu_clean_train")
    result = run_rules(session, tables, rules.specs)
    assert "acme-many-ops" in {f.rule for f in result.findings} and result.errors == []


def test_plugin_rules_are_listed_and_their_ids_taken(plugins, tmp_path, capsys):
    assert main(["rules", "list"]) == 0
    captured = capsys.readouterr()
    assert "acme-many-ops" in captured.out and "[acme]" in captured.out
    assert "rule plugin broken" in captured.err
    clash = tmp_path / "clash.yaml"
    clash.write_text(PLUGIN_PACK.replace("pack: acme", "pack: mine"))
    assert main(["rules", "validate", str(clash)]) == 1
    assert "already a plugin acme rule's" in capsys.readouterr().out


# -- the command line -------------------------------------------------------------------------


def test_rules_validate_ok_and_failing_packs(capsys):
    assert main(["rules", "validate", str(EXAMPLE)]) == 0
    assert "ok, 3 rules (slow-optimizer-step, too-many-launches, slow-user-region)" in capsys.readouterr().out
    failing = PAIRS / "expressions.fail.yaml"
    assert main(["rules", "validate", str(EXAMPLE), str(failing)]) == 1
    captured = capsys.readouterr()
    _, expected = _header(failing)
    problems = [line for line in captured.out.splitlines() if "expressions.fail.yaml:" in line]
    assert len(problems) == len(expected) > 20  # every problem, not just the first
    assert captured.err.strip() == "advisor: 1 rule pack with problems"


def test_rules_list_and_show_with_a_pack(capsys):
    assert main(["rules", "list", "--rules", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()][-3:] == list(EXAMPLE_FIRES)
    assert "[team-example]" in out
    assert main(["rules", "show", "slow-user-region", "--rules", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    for heading in ("## What it does", "## Why it matters", "## Example", "## Use instead", "## Condition",
                    "## Options"):
        assert heading in out
    assert "share = 0.25" in out and "table: userdefined" in out


def test_rules_show_follows_a_redirect(tmp_path, capsys):
    pack = tmp_path / "renamed.yaml"
    pack.write_text((PAIRS / "ids.ok.yaml").read_text())
    assert main(["rules", "show", "old-name", "--rules", str(pack)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("new-name: ") and "(old-name was renamed new-name.)" in out


def test_rules_new_writes_a_valid_rule_a_case_and_a_passing_test(tmp_path, capsys):
    assert main(["rules", "new", "my-smell", "--dir", str(tmp_path)]) == 0
    written = capsys.readouterr().out
    pack = tmp_path / "rules" / "my-smell.yaml"
    case = tmp_path / "cases" / "my-smell" / "case.yaml"
    test = tmp_path / "tests" / "test_my_smell.py"
    assert all(str(p) in written for p in (pack, case, test))
    assert main(["rules", "validate", str(pack)]) == 0
    assert yaml.safe_load(case.read_text())["must"] == ["my-smell"]
    # The scaffold's own test runs: the pack is valid; the case, not yet recorded, is skipped.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in done.stdout
    # It fires where the rule's own condition holds: a real session, a low threshold.
    spec = load_pack(pack).rules[0]
    session, tables = _case("cpu_slow_optimizer")
    assert [f.rule for f in run_rules(session, tables, [spec]).findings] == ["my-smell"]


@pytest.mark.parametrize(("argv", "words"), [
    (["rules", "new", "My_Smell"], "is not a rule id"),
    (["rules", "new", "dataloader-starvation"], "already a rule's id"),
])
def test_rules_new_refuses_bad_ids(tmp_path, capsys, argv, words):
    assert main([*argv, "--dir", str(tmp_path)]) == 2
    assert words in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_rules_new_overwrites_nothing(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_my_smell.py").write_text("# mine\n")
    assert main(["rules", "new", "my-smell", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert not (tmp_path / "rules").exists()
    assert (tmp_path / "tests" / "test_my_smell.py").read_text() == "# mine\n"


def test_diagnose_runs_a_pack_and_fails_on_its_severity(tmp_path, capsys):
    session = CASES / "cpu_slow_optimizer" / "session"
    out = tmp_path / "report.json"
    assert main(["diagnose", "--rules", str(EXAMPLE), str(session), "--format", "json", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    # The pack's rule fires beside the built-in optimizer-not-fused (Adam's unfused CPU step),
    # the two within a few ms of each other at the top.
    assert "slow-optimizer-step" in [f["rule"] for f in report["findings"][:2]]
    assert main(["diagnose", str(session), "--format", "json", "-o", str(out)]) == 0
    assert "slow-optimizer-step" not in out.read_text()
    capsys.readouterr()
    assert main(["diagnose", "--rules", str(EXAMPLE), "--fail-on", "high", str(session), "-o", str(out)]) \
        == FAIL_ON_EXIT


def test_diagnose_with_an_invalid_pack_is_one_line_naming_file_and_line(capsys):
    code = main(["diagnose", "--rules", str(PAIRS / "expressions.fail.yaml"), str(CASES / "cpu_clean_train" / "session")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith("advisor: tests/rulepacks/expressions.fail.yaml:") and "more problems" in err


def test_diagnose_reads_the_config_of_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [project]
        name = "team-job"

        [tool.advisor]
        packs = ["{EXAMPLE}"]
        disable = ["dataloader-starvation"]
        fail_on = "medium"
        """))
    starved = CASES / "cpu_starved_loader" / "session"
    assert main(["diagnose", str(starved), "--format", "json", "-o", "r.json"]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["findings"] == []
    optimizer = CASES / "cpu_slow_optimizer" / "session"
    assert main(["diagnose", str(optimizer), "--format", "json", "-o", "r.json"]) == FAIL_ON_EXIT
    assert "failing as asked by fail_on in" in capsys.readouterr().err
    # An explicit --config wins over the folder's.
    (tmp_path / "other.toml").write_text("")
    assert main(["diagnose", "--config", "other.toml", str(starved), "--format", "json", "-o", "r.json"]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["findings"][0]["rule"] == "dataloader-starvation"


def test_a_bad_config_stops_diagnose_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "advisor.toml").write_text('disable = ["no-such-rule"]\n')
    assert main(["diagnose", str(CASES / "cpu_clean_train" / "session")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "advisor.toml" in err and "no-such-rule" in err


# -- the public surface -----------------------------------------------------------------------


def test_public_names_resolve():
    from advisor.rules import packs as rulepacks

    for name in rulepacks.__all__:
        assert getattr(rulepacks, name) is not None
    assert rulepacks.load_pack is load_pack


def test_a_python_check_sees_its_overridden_thresholds(monkeypatch):
    monkeypatch.setattr(registry, "_CHECKS", dict(engine.checks()))
    seen = {}

    @register("test-python-rule")
    def check(ctx: RuleContext):
        seen["limit"] = ctx.threshold("limit")
        return [Finding(rule=ctx.spec.id, title="t", severity=Severity.low, confidence=1,
                        saving=Saving(ms_per_step=1, share_of_step=0.1), message="m", recommendation="r",
                        evidence=[Evidence(kind="table_row", table="model", row="Forward")])]

    spec = RuleSpec(id="test-python-rule", title="t", severity="low", thresholds={"limit": 1},
                    docs=RuleDocs(what="w", why="y", example="e", instead="i"))
    overridden = spec.model_copy(update={"thresholds": {"limit": 7.0}})
    run_rules(_empty_session(), {}, [overridden])
    assert seen == {"limit": 7.0}


def test_an_unknown_table_with_no_close_name_lists_the_tables():
    text = (PAIRS / "fields.ok.yaml").read_text().replace("table: model", "table: zzz")
    _, errors = validate_text(text, "pack.yaml")
    assert len(errors) == 1 and "'zzz' is not a summary table; the tables are: device, overview, model" in str(errors[0])


def test_a_bad_pack_stops_diagnose_before_the_script_runs(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("from pathlib import Path\nPath(__file__).with_name('ran').write_text('yes')\n")
    code = main(["diagnose", "--rules", str(PAIRS / "types.fail.yaml"), str(script)])
    assert code == 2 and not (tmp_path / "ran").exists()
    assert "types.fail.yaml:" in capsys.readouterr().err


def test_rules_show_gives_the_configured_thresholds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "advisor.toml").write_text("[thresholds.dataloader-starvation]\ndataloader_share = 0.25\n")
    assert main(["rules", "show", "dataloader-starvation"]) == 0
    out = capsys.readouterr().out
    assert "dataloader_share = 0.25  (set in" in out and "the pack says 0.1)" in out


def test_the_builtin_rules_validate_as_any_pack(capsys):
    assert main(["rules", "validate", str(REPO / "rules" / "builtin")]) == 0
    out = capsys.readouterr().out
    assert "rules/builtin/dataloader-starvation.yaml: ok, 1 rule (dataloader-starvation)" in out
    assert out.count(": ok, 1 rule") == len(list((REPO / "rules" / "builtin").glob("*.yaml")))


BOMB = "".join(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}" if i else '"lol"'] * 9) + "]\n"
               for i in range(9))


def test_a_yaml_bomb_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)  # nine anchors, each nine of the last: 9**9 values once expanded
    done = subprocess.run([sys.executable, "-m", "advisor", "rules", "validate", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "anchors and aliases expand to more than" in done.stdout + done.stderr


def test_a_python_tag_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tagged.yaml"
    path.write_text('version: 1\nrules: !!python/object/apply:os.system ["touch owned"]\n')
    pack, errors = _validate(path)
    assert pack is None and "could not determine a constructor" in errors[0].message
    assert not (tmp_path / "owned").exists()
