"""The recorded cases in cases/: each saved session must produce the findings its case.yaml
says it must, none of those it must not, and the figures it expects.

A case is a folder (pylint functional style): case.yaml (description, the command that
recorded it, must / must_not rule ids, figure expectations with the reason for each) and
session/ (what `advisor diagnose --save` wrote). The sessions are read, not re-recorded,
so these tests take no profiler and no timing luck; `python cases/record.py` records them
again (see cases/README.md).

A rule listed under ``known_wrong`` fires today where it should not (a must_not rule) or
does not fire where it should (a must rule): its check is an expected failure (strict), so
the day the rule is fixed the test says so and the entry comes out of case.yaml. An
expectation may carry ``known_wrong: why`` the same way.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from advisor.cli import main
from advisor.findings import Finding
from advisor.importers import load
from advisor.job import is_job_dir
from advisor.job.diagnose import diagnose_saved_job
from advisor.reports.schema import validate_report
from advisor.rules import builtin_specs, run_rules
from advisor.step import build_step_model
from advisor.tables import compute_tables

REPO = Path(__file__).resolve().parents[1]
CASES_DIR = REPO / "cases"
CASE_NAMES = sorted(p.parent.name for p in CASES_DIR.glob("*/case.yaml"))
# A case is test data kept in the repository: a GPU recording of a loop that launches
# kernels parameter by parameter holds some 30,000 rows.
MAX_CASE_BYTES = 1_500_000

CASE_KEYS = {"description", "command", "must", "must_not", "known_wrong", "expect"}
TABLE_TESTS = {"at_least", "at_most", "equals"}
FINDING_TESTS = {"severity", "share_of_step_at_least", "ms_per_step_at_least", "source_line", "message_contains",
                 "recommendation_contains", "recommendation_lacks", "leads", "at_most_severity"}
# What the step model made of the profile: where its steps came from, how many are steady,
# whether it shows its work once, and its headline.
WINDOW_TESTS = {"source", "steps", "one_pass", "headline_contains"}


def steady_of(session):
    """The session as its step model judges it."""
    return build_step_model(session).session


def spec_of(name: str) -> dict:
    return yaml.safe_load((CASES_DIR / name / "case.yaml").read_text())


def flatten(findings: list[Finding]) -> list[Finding]:
    """Every finding, with the symptoms nested under their causes as well."""
    out: list[Finding] = []
    for finding in findings:
        out.append(finding)
        out.extend(flatten(finding.explains))
    return out


def profile_of(name: str) -> Path:
    """The case's profile: its saved session folder (a recorded case), or the trace it holds
    (a synthetic one, cases/synth_traces.py)."""
    trace = CASES_DIR / name / "trace.json.gz"
    return trace if trace.is_file() else CASES_DIR / name / "session"


def is_synthetic(name: str) -> bool:
    return profile_of(name).name == "trace.json.gz"


def is_job_case(name: str) -> bool:
    return is_job_dir(profile_of(name)) or _merged(profile_of(name))


@functools.cache
def evaluated(name: str):
    """(session, tables, every finding flattened) of a case, computed once per test run,
    as `advisor diagnose` reads it (a start-up first step left out). For a job (a torchrun
    case, saved as job.json and a session per rank): the lowest rank's session, its tables
    with the job's cross-rank tables, and the job's findings, merged across ranks."""
    folder = profile_of(name)
    if is_job_dir(folder) or _merged(folder):
        job, diagnosis = _job_of(folder)
        assert diagnosis.errors == [], diagnosis.errors
        session = steady_of(load(job.ranks[0].summary.source))
        return session, {**compute_tables(session), **diagnosis.tables}, flatten(diagnosis.findings)
    session = steady_of(load(folder))
    tables = compute_tables(session)
    result = run_rules(session, tables)
    assert result.errors == [], result.errors
    return session, tables, flatten(result.findings)


def _merged(profile: Path) -> bool:
    """A synthetic trace that merges a job's ranks into one file (advisor.importers.merged)."""
    from advisor.importers.merged import merged_ranks

    return profile.is_file() and merged_ranks(profile)


@functools.cache
def _job_of(profile: Path):
    """(job, diagnosis) of a saved job, or of a merged trace split into its ranks as
    `advisor diagnose` splits it."""
    if is_job_dir(profile):
        return diagnose_saved_job(profile)
    import tempfile

    from advisor.importers.merged import split
    from advisor.job import diagnose_job, order_ranks, summarise_job

    ranks = split(profile, Path(tempfile.mkdtemp(prefix="advisor-test-ranks-"))).files
    job = order_ranks(summarise_job(ranks, workers=1), source=str(profile))
    return job, diagnose_job(job)


@functools.cache
def leading(name: str) -> str | None:
    """The rule of a case's top finding (the first of the ranked list), as the user reads it."""
    folder = profile_of(name)
    if is_job_dir(folder) or _merged(folder):
        findings = _job_of(folder)[1].findings
    else:
        session = steady_of(load(folder))
        findings = run_rules(session, compute_tables(session)).findings
    return findings[0].rule if findings else None


def fired(name: str) -> dict[str, list[Finding]]:
    by_rule: dict[str, list[Finding]] = {}
    for finding in evaluated(name)[2]:
        by_rule.setdefault(finding.rule, []).append(finding)
    return by_rule


def _params(key: str) -> list:
    params = []
    for name in CASE_NAMES:
        spec = spec_of(name)
        known_wrong = spec.get("known_wrong") or {}
        for rule in spec.get(key) or []:
            marks = []
            if rule in known_wrong:
                marks.append(pytest.mark.xfail(strict=True, reason=" ".join(str(known_wrong[rule]).split())))
            params.append(pytest.param(name, rule, id=f"{name}-{rule}", marks=marks))
    return params


def _expectations() -> list:
    return [
        pytest.param(name, i, id=f"{name}-{i}-{e.get('table') or e.get('finding') or 'window'}",
                     marks=[pytest.mark.xfail(strict=True, reason=" ".join(str(e["known_wrong"]).split()))]
                     if e.get("known_wrong") else [])
        for name in CASE_NAMES
        for i, e in enumerate(spec_of(name).get("expect") or [])
    ]


# -- the cases themselves ---------------------------------------------------------------------


def test_the_cases_are_there():
    assert {"cpu_starved_loader", "cpu_clean_train", "cpu_host_sync"} <= set(CASE_NAMES)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_is_well_formed(name):
    spec = spec_of(name)
    assert set(spec) <= CASE_KEYS, f"unknown keys {set(spec) - CASE_KEYS}"
    assert str(spec.get("description", "")).strip(), "a case says what it is"
    rule_ids = {s.id for s in builtin_specs()}
    must, must_not = set(spec.get("must") or []), set(spec.get("must_not") or [])
    assert must | must_not <= rule_ids, f"unknown rule ids {(must | must_not) - rule_ids}"
    assert not must & must_not
    assert set(spec.get("known_wrong") or {}) <= must | must_not, "known_wrong names must or must_not rules"
    for expectation in spec.get("expect") or []:
        assert str(expectation.get("why", "")).strip(), f"{expectation} says why"
        if "table" in expectation:
            assert {"row", "column"} <= set(expectation)
            assert len(TABLE_TESTS & set(expectation)) == 1, expectation
        elif "window" in expectation:
            assert set(expectation["window"]) and set(expectation["window"]) <= WINDOW_TESTS, expectation
        else:
            assert "finding" in expectation and len(FINDING_TESTS & set(expectation)) == 1, expectation
            assert expectation.get("leads", True) is True, "leads: true, or no leads at all"
            if "at_most_severity" in expectation:  # a rule that may fire, but no higher than this
                assert expectation["finding"] not in must | must_not, expectation
            else:
                assert expectation["finding"] in must, "a figure of a finding the case does not demand"
    folder = profile_of(name)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else folder.stat().st_size
    assert size < MAX_CASE_BYTES, f"{name} is {size} bytes: record fewer steps"


@pytest.mark.parametrize("name", CASE_NAMES)
def test_session_was_recorded_by_the_command_given(name):
    """case.yaml's command saves into this case's session/ and ran the script, with the
    arguments, that the session says ran; a synthetic case's trace is the one
    cases/synth_traces.py writes, byte for byte."""
    argv = shlex.split(spec_of(name)["command"])
    if is_synthetic(name):
        assert argv == ["python", "cases/synth_traces.py"]
        spec = importlib.util.spec_from_file_location("synth_traces", CASES_DIR / "synth_traces.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.TRACES[name]().write(profile_of(name)) == profile_of(name).read_bytes()
        return
    assert argv[:2] == ["advisor", "diagnose"]
    assert argv[argv.index("--save") + 1] == f"cases/{name}/session"
    script = next(i for i, word in enumerate(argv) if word.endswith(".py"))
    session = evaluated(name)[0]
    assert session.meta.command == argv[script:]
    assert session.meta.exit_code == 0 and session.meta.source_format == "script"


@pytest.mark.parametrize(("name", "rule"), _params("must"))
def test_must(name, rule):
    assert rule in fired(name), f"{name} must produce {rule}; it produced {sorted(fired(name))}"


@pytest.mark.parametrize(("name", "rule"), _params("must_not"))
def test_must_not(name, rule):
    found = fired(name).get(rule, [])
    assert not found, f"{name} must not produce {rule}; it did: {found[0].message if found else ''}"


def _check_window(name: str, wanted: dict, why: str) -> None:
    """A case's window expectation, read from the report `advisor diagnose` writes."""
    from advisor.diagnosis import diagnose

    diagnosis = diagnose(load(profile_of(name)))
    window, steps = diagnosis.report.session.window, diagnosis.model.steps
    if "source" in wanted:
        assert window.source == wanted["source"], f"steps from {window.source!r} ({window.how}): {why}"
    if "steps" in wanted:
        assert steps == wanted["steps"], f"{steps} steady steps ({window.how}): {why}"
    if "one_pass" in wanted:
        assert window.one_pass is wanted["one_pass"], f"one_pass is {window.one_pass}: {why}"
    if "headline_contains" in wanted:
        assert wanted["headline_contains"] in window.headline, f"{window.headline!r}: {why}"


def _table_value(tables, table: str, row: str, column: str):
    frame = tables.get(table)
    assert frame is not None, f"no {table} table"
    assert row in frame.index, f"{table} has no row {row!r}; rows: {list(frame.index)[:20]}"
    assert column in frame.columns, f"{table} has no column {column!r}"
    value = frame.loc[row, column]
    assert not (isinstance(value, float) and math.isnan(value)), f"{table}[{row}].{column} is NaN"
    return value


@pytest.mark.parametrize(("name", "index"), _expectations())
def test_expectation(name, index):
    expectation = spec_of(name)["expect"][index]
    _, tables, _ = evaluated(name)
    why = " ".join(str(expectation["why"]).split())
    if "window" in expectation:
        _check_window(name, expectation["window"], why)
        return
    if "table" in expectation:
        where = f"{expectation['table']}[{expectation['row']}].{expectation['column']}"
        value = _table_value(tables, expectation["table"], expectation["row"], expectation["column"])
        if "at_least" in expectation:
            assert value >= expectation["at_least"], f"{where} = {value} < {expectation['at_least']}: {why}"
        if "at_most" in expectation:
            assert value <= expectation["at_most"], f"{where} = {value} > {expectation['at_most']}: {why}"
        if "equals" in expectation:
            assert value == expectation["equals"], f"{where} = {value} != {expectation['equals']}: {why}"
        return
    if "leads" in expectation:
        assert leading(name) == expectation["finding"], f"{leading(name)} leads: {why}"
        return
    if "at_most_severity" in expectation:
        from advisor.findings import Severity

        ceiling = Severity(expectation["at_most_severity"]).rank
        above = [f for f in fired(name).get(expectation["finding"], []) if f.severity.rank > ceiling]
        assert not above, f"{expectation['finding']} is {above[0].severity.value}: {why}" if above else why
        return
    findings = fired(name).get(expectation["finding"], [])
    assert findings, f"{expectation['finding']} did not fire"
    finding = findings[0]
    if "severity" in expectation:
        assert finding.severity.value == expectation["severity"], why
    if "share_of_step_at_least" in expectation:
        assert finding.saving.share_of_step >= expectation["share_of_step_at_least"], why
    if "ms_per_step_at_least" in expectation:
        assert finding.saving.ms_per_step >= expectation["ms_per_step_at_least"], why
    if "source_line" in expectation:
        lines = {f"{e.file}:{e.line}" for e in finding.evidence if e.kind == "source_line"}
        assert expectation["source_line"] in lines, f"source lines {sorted(lines)}: {why}"
    if "message_contains" in expectation:
        assert expectation["message_contains"] in finding.message, f"{finding.message!r}: {why}"
    if "recommendation_contains" in expectation:
        assert expectation["recommendation_contains"] in finding.recommendation, f"{finding.recommendation!r}: {why}"
    if "recommendation_lacks" in expectation:
        assert expectation["recommendation_lacks"] not in finding.recommendation, f"{finding.recommendation!r}: {why}"


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if n.startswith("cpu_")])
def test_cpu_cases_leave_the_gpu_unmeasured(name):
    session = evaluated(name)[0]
    assert session.meta.collector.gpu_measured is False
    assert not any(d.kind == "gpu" for d in session.meta.devices)


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if n.startswith("gpu_")] or
                         [pytest.param("", marks=pytest.mark.skip(reason="no GPU cases recorded yet: "
                                                                           "cases/draft_gpu_cases.py records them on a GPU"))])
def test_gpu_cases_measured_the_gpu(name):
    session = evaluated(name)[0]
    assert session.meta.collector.gpu_measured is True
    assert any(d.kind == "gpu" for d in session.meta.devices)


# -- through the command line -----------------------------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_diagnose_of_the_saved_session_is_a_valid_report(name, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["diagnose", str(profile_of(name)), "--format", "json", "-o", str(out)]) == 0
    said = capsys.readouterr().err.strip().splitlines()
    # A merged multi-rank trace says first that it is read as a job.
    assert said[-1] == f"advisor: report written to {out}" and len(said) == 1 + _merged(profile_of(name))
    report = json.loads(out.read_text())
    validate_report(report)

    def rules(findings: list[dict]) -> list[str]:
        return [r for f in findings for r in [f["rule"], *rules(f.get("explains") or [])]]

    assert sorted(rules(report["findings"])) == sorted(f.rule for f in evaluated(name)[2])
    model = evaluated(name)[1]["model"]
    steps = model.loc["ProfileStep", "calls"] if "ProfileStep" in model.index else 0  # no steps, no Model Summary
    if is_job_case(name):  # the job's steps are its ranks' fewest; its tables the cross-rank ones
        assert report["session"]["steps"]["count"] <= steps and report["job"]["ranks"]
        assert set(report["tables"]) >= {"ranks"}
        return
    assert report["session"]["steps"]["count"] == steps
    assert set(report["tables"]) >= {"model", "perf", "host_sync"}

# -- drafting the GPU cases (cases/draft_gpu_cases.py) ----------------------------------------


@pytest.fixture(scope="module")
def drafting():
    """cases/draft_gpu_cases.py as a module, without running its main()."""
    path = CASES_DIR / "draft_gpu_cases.py"
    spec = importlib.util.spec_from_file_location("_draft_gpu_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_drafted_cases_name_only_rules_that_exist(drafting, tmp_path):
    from advisor.rules import builtin_specs

    known = {s.id for s in builtin_specs()}
    case_keys = {"description", "command", "must", "must_not", "known_wrong", "expect"}
    for spec in drafting.CASES:
        content, comments = drafting.draft_case(spec, known)
        assert set(content) <= case_keys
        assert set(content["must"]) | set(content["must_not"]) <= known
        assert not set(content["must"]) & set(content["must_not"])
        for rule in set(spec.must) | set(spec.must_not):
            assert rule in known or any(rule in c for c in comments), (spec.name, rule)
        for expectation in content.get("expect", []):
            assert str(expectation["why"]).strip()
            assert "finding" not in expectation or expectation["finding"] in content["must"]
        assert content["command"].startswith(f"advisor diagnose --save cases/{spec.name}/session ")
        assert (REPO / spec.script).is_file()
        path = tmp_path / f"{spec.name}.yaml"
        drafting.write_case_yaml(path, content, ["a comment " * 20, *comments])
        assert yaml.safe_load(path.read_text()) == content
        assert all(len(line) <= 100 for line in path.read_text().splitlines() if line.startswith("#"))


def test_drafted_source_lines_point_at_the_lines_that_wait(drafting):
    spec = next(s for s in drafting.CASES if s.name == "gpu_host_sync")
    content, _ = drafting.draft_case(spec, {"sync-memcpy-stall", "dataloader-starvation"})
    lines = (REPO / "examples" / "host_sync.py").read_text().splitlines()
    pointed = [int(e["source_line"].rsplit(":", 1)[1]) for e in content["expect"]]
    assert [lines[n - 1].split("#")[0].strip() for n in pointed] == [
        "running_loss += loss.item()",
        "predictions = logits.argmax(dim=1).cpu()",
        "correct += int((predictions == batch_labels.cpu()).sum())",
    ]
    pageable = next(s for s in drafting.CASES if s.name == "gpu_pageable_copies")
    content, _ = drafting.draft_case(pageable, {"sync-memcpy-stall", "dataloader-starvation"})
    copy_lines = (REPO / "examples" / "pageable_copies.py").read_text().splitlines()
    pointed = [int(e["source_line"].rsplit(":", 1)[1]) for e in content["expect"] if "source_line" in e]
    assert [copy_lines[n - 1].split("#")[0].strip() for n in pointed] == [
        "images = images.to(device)", "labels = labels.to(device)"]


def test_evaluate_case_checks_a_recorded_case_as_the_case_tests_do(drafting):
    from advisor.importers import load

    folder = REPO / "cases" / "cpu_host_sync"
    session = load(folder / "session")
    spec = yaml.safe_load((folder / "case.yaml").read_text())
    fired, problems = drafting.evaluate_case(session, spec)
    assert "sync-memcpy-stall" in fired and problems == []
    wrong = {"must": ["dataloader-starvation"], "must_not": ["sync-memcpy-stall"], "expect": [
        {"table": "model", "row": "Dataloader", "column": "cpu_ratio", "at_least": 0.9, "why": "."},
        {"finding": "sync-memcpy-stall", "source_line": "examples/host_sync.py:1", "why": "."}]}
    _, problems = drafting.evaluate_case(session, wrong)
    assert len(problems) == 4, problems


def test_the_bundle_holds_the_drafted_cases(drafting, tmp_path):
    import tarfile

    bundle = tmp_path / "b" / "cases.tar.gz"
    drafting.write_bundle(bundle, ["cpu_host_sync"])
    with tarfile.open(bundle) as archive:
        names = set(archive.getnames())
    assert {"cases/cpu_host_sync/case.yaml", "cases/cpu_host_sync/session/session.json"} <= names


def test_drafting_without_a_gpu_says_so_in_one_line(drafting, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the cases would be recorded")
    assert drafting.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dry-run" in err[0]


def test_drafting_dry_run_lists_the_recordings(drafting, capsys):
    assert drafting.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "-m advisor diagnose --save cases/gpu_odd_gemm/session" in out


# Rules whose severity is not their saving's share by design: a straggler whose excess no
# table explains is LOW whatever it costs, a periodic step's work is judged by its share
# of the run, and a finding on a profile of one pass is at most MEDIUM.
_SEVERITY_BY_DESIGN = {"straggler-rank", "periodic-step-work"}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_finding_s_severity_follows_what_it_saves(name):
    """A finding is as severe as the share of the step its fix saves, by its rule's
    thresholds: not by the share of the step its cause takes (a loader a quarter of the
    step whose fix saves a tenth is MEDIUM), nor by a step other than the one the saving is
    a share of."""
    from advisor.rules.engine import builtin_specs

    specs = {spec.id: spec for spec in builtin_specs()}
    session, _tables, findings = evaluated(name)
    for finding in findings:
        spec = specs.get(finding.rule)
        if spec is None or finding.rule in _SEVERITY_BY_DESIGN or finding.saving is None \
                or not {"high_share", "medium_share"} <= set(spec.thresholds):
            continue
        share = finding.saving.share_of_step
        want = ("high" if share >= spec.thresholds["high_share"]
                else "medium" if share >= spec.thresholds["medium_share"] else "low")
        if finding.saving.per == "pass" and want == "high":
            want = "medium"
        assert finding.severity.value == want, (f"{finding.rule}: {finding.severity.value} for a saving of "
                                                f"{share:.1%} of the step")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_what_recording_added_is_the_window_line_s_two_means(name):
    """The Window line says the recorded steps' mean, the unrecorded steps' and what
    recording added: the last is the first over the second, whatever other means a table
    keeps ("mean step 102 ms; 49.1 ms unrecorded (recording added 57%)" read +108%)."""
    folder = profile_of(name)
    if is_job_dir(folder) or _merged(folder):
        pytest.skip("a job's report states its ranks' steps, not one session's")
    from advisor.diagnosis import diagnose

    steps = diagnose(steady_of(load(folder))).report.session.steps
    if not steps.unrecorded_steps or steps.unrecorded_mean_step_ns is None or steps.mean_step_ns is None:
        assert steps.overhead_ratio is None
        return
    assert steps.overhead_ratio == pytest.approx(steps.mean_step_ns / steps.unrecorded_mean_step_ns - 1, abs=1e-6)
