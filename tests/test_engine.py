"""The rule engine: ranking by saving, symptoms under causes, broken rules skipped."""

from __future__ import annotations

import pandas as pd

from advisor.findings import Finding, Saving, Severity
from advisor.rules import RuleContext, RuleSpec, engine, register, registry, run_rules
from advisor.rules.engine import cause_graph, rank
from advisor.rules.packs import RuleDocs
from advisor.session import CollectorInfo, Session, SessionMeta, empty_events


def _finding(rule: str, ms: float, severity: Severity = Severity.medium) -> Finding:
    return Finding(rule=rule, title=rule, severity=severity, confidence=0.5,
                   saving=Saving(ms_per_step=ms, share_of_step=min(ms / 100, 1)), message="m", recommendation="r")


def _spec(rule_id: str, explains: list[str] | None = None, **thresholds) -> RuleSpec:
    return RuleSpec(id=rule_id, title=rule_id, severity=Severity.medium, explains=explains or [],
                    thresholds=thresholds, docs=RuleDocs(what="w", why="y", example="e", instead="i"))


def _session() -> Session:
    return Session(SessionMeta(source="x", source_format="test", collector=CollectorInfo(name="test")), empty_events())


def test_roots_are_ranked_by_saving_and_symptoms_nest_under_causes():
    specs = [_spec("cause", ["symptom"]), _spec("symptom"), _spec("other")]
    findings = [_finding("symptom", 50), _finding("other", 10), _finding("cause", 30)]
    ranked = rank(findings, cause_graph(specs))
    assert [f.rule for f in ranked] == ["cause", "other"]
    assert [f.rule for f in ranked[0].explains] == ["symptom"]


def test_symptom_without_its_cause_stays_a_root():
    specs = [_spec("cause", ["symptom"]), _spec("symptom")]
    ranked = rank([_finding("symptom", 5)], cause_graph(specs))
    assert [f.rule for f in ranked] == ["symptom"] and not ranked[0].explains


def test_a_chain_of_causes_nests_fully():
    specs = [_spec("root", ["middle"]), _spec("middle", ["leaf"]), _spec("leaf")]
    ranked = rank([_finding("leaf", 9), _finding("middle", 8), _finding("root", 7)], cause_graph(specs))
    assert [f.rule for f in ranked] == ["root"]
    assert ranked[0].explains[0].rule == "middle" and ranked[0].explains[0].explains[0].rule == "leaf"


def test_a_symptom_two_fired_causes_explain_goes_to_the_one_nothing_else_explains():
    # queued work -> the host's syncs waiting on it; both -> the idle GPU. The idle GPU is
    # the queued work's symptom, though the sync saves as much.
    specs = [_spec("queued", ["sync", "idle"]), _spec("sync", ["idle"]), _spec("idle")]
    ranked = rank([_finding("idle", 15), _finding("sync", 7.5), _finding("queued", 7.5)], cause_graph(specs))
    assert [f.rule for f in ranked] == ["queued"]
    assert sorted(f.rule for f in ranked[0].explains) == ["idle", "sync"]
    assert not ranked[0].explains[1].explains and not ranked[0].explains[0].explains


def test_a_failing_rule_is_reported_and_the_others_still_run(monkeypatch):
    monkeypatch.setattr(registry, "_CHECKS", dict(engine.checks()))

    @register("test-broken")
    def broken(ctx: RuleContext):
        raise KeyError("no such column")

    @register("test-fine")
    def fine(ctx: RuleContext):
        return [_finding("test-fine", ctx.threshold("ms"))]

    result = run_rules(_session(), {}, [_spec("test-broken"), _spec("test-fine", ms=4.0)])
    assert [f.rule for f in result.findings] == ["test-fine"]
    assert result.findings[0].saving.ms_per_step == 4.0
    assert len(result.errors) == 1 and "test-broken" in result.errors[0] and "KeyError" in result.errors[0]


def test_no_rule_fires_on_an_empty_session():
    from advisor.tables import compute_tables

    session = _session()
    result = run_rules(session, compute_tables(session))
    assert result.findings == [] and result.errors == []


def test_builtin_rules_have_documentation_and_checks():
    specs = engine.builtin_specs()
    assert {s.id for s in specs} >= {"dataloader-starvation", "sync-memcpy-stall", "low-gpu-utilization"}
    for spec in specs:
        # A rule is either data (its condition is its check) or has Python code registered.
        assert spec.is_data_rule or spec.id in engine.checks()
        assert spec.docs.what and spec.docs.why and spec.docs.example and spec.docs.instead
    # The built-in rules are Python checks (data rules are for users' packs: rules/examples).
    assert [s.id for s in specs if s.is_data_rule] == []
    loader = next(s for s in specs if s.id == "dataloader-starvation")
    assert not pd.isna(loader.thresholds.get("dataloader_share"))
    # The rules about the profile itself lead (what it missed, whether it holds steady steps);
    # no other does.
    assert sorted(s.id for s in specs if s.leads) == ["not-steady-state", "profile-incomplete"]


def test_a_cause_too_small_to_explain_a_symptom_does_not_hide_it():
    specs = [_spec("cause", ["symptom"]), _spec("symptom")]
    ranked = rank([_finding("cause", 0.03), _finding("symptom", 170)], cause_graph(specs))
    assert [f.rule for f in ranked] == ["symptom", "cause"]
    assert not ranked[0].explains and not ranked[1].explains


# Rule ids are public (docs/design.md): they may be renamed only with a redirect, never dropped.
CONTRACT_IDS = {"dataloader-starvation", "sync-memcpy-stall", "low-gpu-utilization", "tensor-core-misalignment",
                "below-roofline"}


def test_builtin_ids_are_kept_and_redirects_point_at_live_rules():
    from advisor.rules.packs.catalog import builtin_pack

    pack = builtin_pack()
    live = {s.id for s in pack.rules}
    assert all(rule_id in live or rule_id in pack.redirects for rule_id in CONTRACT_IDS)
    assert not set(pack.redirects) & live
    assert set(pack.redirects.values()) <= live
    assert len(live) == len(pack.rules)


def test_every_builtin_rule_without_a_condition_has_a_check_and_every_one_runs_on_a_case():
    from advisor.importers import load
    from advisor.paths import cases_dir
    from advisor.tables import compute_tables

    session = load(cases_dir() / "cpu_clean_train" / "session")
    result = run_rules(session, compute_tables(session))
    assert result.errors == []
    assert set(result.ran) | set(result.skipped) == {s.id for s in engine.builtin_specs()}


def test_a_data_rule_and_a_python_rule_share_the_cause_graph(monkeypatch):
    from advisor.importers import load
    from advisor.paths import cases_dir
    from advisor.rules.packs.spec import SavingSpec
    from advisor.tables import compute_tables

    monkeypatch.setattr(registry, "_CHECKS", dict(engine.checks()))

    @register("test-symptom")
    def symptom(ctx: RuleContext):
        return [_finding("test-symptom", 1.0)]

    cause = RuleSpec(id="test-cause", title="cause", severity=Severity.high, explains=["test-symptom"],
                     table="model", condition='key == "Backward"', saving=SavingSpec(ns_per_step="cpu_avg_ns"),
                     message="{key} takes {cpu_avg_ns}", recommendation="r",
                     docs=RuleDocs(what="w", why="y", example="e", instead="i"))
    session = load(cases_dir() / "cpu_clean_train" / "session")
    result = run_rules(session, compute_tables(session), [cause, _spec("test-symptom")])
    assert [f.rule for f in result.findings] == ["test-cause"]
    assert [f.rule for f in result.findings[0].explains] == ["test-symptom"]
    assert result.findings[0].message.startswith("Backward takes ")


def test_rules_that_explain_each_other_lose_no_finding():
    """A circle of ``explains`` (two user rules naming each other) orders the rules as given
    and nests one finding under the other, never each under the other."""
    specs = [_spec("a", ["b"]), _spec("b", ["a"]), _spec("c")]
    graph = cause_graph(specs)
    assert graph.order() == ["a", "b", "c"] and graph.ancestors("a") == {"b"}
    ranked = rank([_finding("a", 10), _finding("b", 5), _finding("c", 1)], graph)
    assert [f.rule for f in ranked] == ["a", "c"] and [f.rule for f in ranked[0].explains] == ["b"]
    assert not ranked[0].explains[0].explains


def test_the_cause_graph_orders_causes_before_symptoms_and_knows_their_ancestors():
    specs = [_spec("leaf"), _spec("middle", ["leaf"]), _spec("root", ["middle"]), _spec("apart")]
    graph = cause_graph(specs)
    order = graph.order()
    assert order.index("root") < order.index("middle") < order.index("leaf") and "apart" in order
    assert graph.ancestors("leaf") == {"middle", "root"} and graph.ancestors("root") == set()
