"""A trace's report kept for the next `advisor diagnose` (advisor.cli.report_cache): the
same report in every format without the trace, the tables or the rules again, and never
once anything the report depends on has changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from builders import synth_trace
from conftest import REPO

from advisor.cli import FAIL_ON_EXIT, main
from advisor.cli.report_cache import PLUGIN_GROUP
from advisor.importers import loader

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow


@pytest.fixture
def trace(tmp_path):
    """A small trace of a training loop (benchmarks/synth.py): steps, a loader, kernels."""
    path = tmp_path / "train.json"
    synth_trace(path, 3000)
    return path


@pytest.fixture
def cache_dir(cache_dir, tmp_path, monkeypatch):
    """conftest's cache of the test's own, run from the test's folder (the current folder is
    part of what a kept report depends on)."""
    monkeypatch.chdir(tmp_path)
    return cache_dir


@pytest.fixture
def reads(monkeypatch):
    """How many times a command read the trace or loaded its cached Session."""
    calls = []
    real = loader.load

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "load", counting)
    monkeypatch.setattr("advisor.importers.load", counting)
    return calls


def test_the_second_diagnose_writes_the_kept_report_without_reading_anything(tmp_path, trace, cache_dir, reads):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert main(["diagnose", str(trace), "--format", "json", "-o", str(first)]) == 0
    assert len(reads) == 1
    assert len(list(cache_dir.glob("*/report-*.json"))) == 1
    assert main(["diagnose", str(trace), "--format", "json", "-o", str(second)]) == 0
    assert len(reads) == 1, "the second run read the trace or its Session"
    assert second.read_bytes() == first.read_bytes()
    assert json.loads(second.read_text())["findings"], "the synthetic loop has findings"


@pytest.mark.parametrize("fmt", ["terminal", "markdown", "html"])
def test_every_format_from_the_kept_report_is_the_fresh_one(tmp_path, trace, cache_dir, reads, fmt):
    fresh, kept = tmp_path / f"fresh.{fmt}", tmp_path / f"kept.{fmt}"
    assert main(["diagnose", str(trace), "--format", fmt, "-o", str(fresh)]) == 0
    assert main(["diagnose", str(trace), "--format", fmt, "-o", str(kept)]) == 0
    assert len(reads) == 1
    assert kept.read_text() == fresh.read_text()


def test_a_kept_report_is_never_used_once_what_it_depends_on_changed(tmp_path, trace, cache_dir, reads):
    def diagnose(*options):
        assert main(["diagnose", str(trace), "--format", "json", "-o", str(tmp_path / "r.json"), *options]) in (0, 3)
        return len(reads)

    assert diagnose() == 1
    assert diagnose() == 1
    # Another option that changes what the report says: a different GPU to judge against.
    assert diagnose("--gpu", "a100-sxm4-80gb") == 2
    assert diagnose("--gpu", "a100-sxm4-80gb") == 2
    # A configuration file appears where one is looked for.
    (tmp_path / "advisor.toml").write_text("[thresholds.dataloader-starvation]\ndataloader_share = 0.9\n")
    assert diagnose() == 3
    assert diagnose() == 3
    # It is edited.
    (tmp_path / "advisor.toml").write_text("[thresholds.dataloader-starvation]\ndataloader_share = 0.5\n")
    assert diagnose() == 4
    # A pack of the user's, then a change to it, then a second pack in its folder.
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "team.yaml").write_text(_pack("team-rule", 'key == "Forward"'))
    assert diagnose("--rules", str(packs)) == 5
    assert diagnose("--rules", str(packs)) == 5
    (packs / "team.yaml").write_text(_pack("team-rule", 'key == "Backward"'))
    assert diagnose("--rules", str(packs)) == 6
    (packs / "more.yaml").write_text(_pack("more-rule", 'key == "Forward"'))
    assert diagnose("--rules", str(packs)) == 7
    # The trace itself changes.
    synth_trace(trace, 3600)
    assert diagnose("--rules", str(packs)) == 8
    # And --no-cache never reads a kept report.
    assert diagnose("--rules", str(packs), "--no-cache") == 9


def test_a_report_in_which_a_rule_failed_is_not_kept(tmp_path, trace, cache_dir, reads, capsys):
    """A rule that failed may not fail next time: its report is made again, and says again
    what failed, with the same exit code."""
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "broken.yaml").write_text(_pack("broken-at-run-time", 'cpu_avg_ns.str.startswith("x")'))
    (tmp_path / "advisor.toml").write_text('fail_on = "info"\n')
    runs = []
    for _ in range(2):
        code = main(["diagnose", str(trace), "--rules", str(packs), "--format", "json", "-o", str(tmp_path / "r.json")])
        runs.append((code, capsys.readouterr().err.splitlines()))
    assert len(reads) == 2
    (first_code, first_err), (second_code, second_err) = runs
    assert first_code == second_code == FAIL_ON_EXIT
    assert second_err == first_err
    assert any(line.startswith("advisor: rule broken-at-run-time failed and was skipped") for line in second_err)
    assert second_err[-1].startswith("advisor: findings at or above 'info': failing as asked by fail_on in ")


def test_a_damaged_record_is_a_fresh_run(tmp_path, trace, cache_dir, reads):
    out = tmp_path / "r.json"
    assert main(["diagnose", str(trace), "--format", "json", "-o", str(out)]) == 0
    (record,) = cache_dir.glob("*/report-*.json")
    record.write_text("{not json")
    assert main(["diagnose", str(trace), "--format", "json", "-o", str(out)]) == 0
    assert len(reads) == 2
    json.loads(out.read_text())


def test_the_plugin_group_is_the_catalog_s():
    from advisor.rules.packs.catalog import ENTRY_POINT_GROUP

    assert PLUGIN_GROUP == ENTRY_POINT_GROUP


def test_a_kept_json_report_is_written_without_pandas_or_the_rules(tmp_path, trace, cache_dir):
    """The point of keeping the report: the second run imports neither the tables'
    libraries nor the rules."""
    out = tmp_path / "r.json"
    assert main(["diagnose", str(trace), "--format", "json", "-o", str(out)]) == 0
    probe = textwrap.dedent(f"""\
        import sys
        from advisor.cli import main
        code = main(["diagnose", {str(trace)!r}, "--format", "json", "-o", {str(out)!r}])
        print(code, " ".join(sorted(m for m in ("pandas", "numpy", "pydantic", "advisor.rules.packs.catalog",
                                                "advisor.importers.loader") if m in sys.modules)))
        """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ADVISOR_CACHE_DIR": str(cache_dir)}, cwd=tmp_path, check=True)
    assert done.stdout.split() == ["0"], done.stdout


def _pack(rule_id: str, condition: str) -> str:
    return textwrap.dedent(f"""\
        pack: {rule_id}-pack
        rules:
          - id: {rule_id}
            title: A rule of the user's
            severity: low
            table: model
            condition: '{condition}'
            saving: {{ns_per_step: cpu_avg_ns}}
            message: "{{key}} {{cpu_avg_ns}}"
            recommendation: r
            docs: {{what: w, why: y, example: e, instead: i}}
        """)
