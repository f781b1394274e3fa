"""`advisor compare`: two profiles side by side, on hand-made sessions and on the resnet50
pair in ../shared/traces (num_workers 0 and 4)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import shared_trace
from report_samples import MS, NASTY, sample_parts, sample_session

from advisor.cli import main
from advisor.importers import load
from advisor.reports.compare_report import (
    _delta,
    _value,
    comparison_markdown,
    comparison_text,
    render_comparison,
)
from advisor.rules import run_rules
from advisor.step import build_step_model
from advisor.tables import compute_tables
from advisor.tables.comparison import Comparison, compare


def _parts(session):
    model = build_step_model(session)
    tables = compute_tables(session, model=model)
    return model, tables, run_rules(model.session, tables, model=model).findings


@pytest.fixture(scope="module")
def starved_then_fed():
    return compare(_parts(sample_session(loader_ms=40)), _parts(sample_session(loader_ms=2)))


def _named(changes, name):
    return next(c for c in changes if c.name == name)


def test_headline_says_the_step_got_faster(starved_then_fed):
    c = starved_then_fed
    step = _named(c.headline, "mean step time")
    assert (step.before, step.after, step.delta) == (100 * MS, 62 * MS, -38 * MS)
    assert step.relative == pytest.approx(-0.38) and step.verdict == "better"
    ips = _named(c.headline, "throughput (ips)")
    assert ips.after > ips.before and ips.verdict == "better" and ips.unit == "steps/s"
    share = _named(c.headline, "data-loader share of the step")
    assert share.before == pytest.approx(0.4) and share.verdict == "better"
    assert _named(c.headline, "GPU utilization (gpu:0)").verdict == "better"
    assert c.per == "step" and c.notes == []


def test_each_phase_before_and_after(starved_then_fed):
    loader = _named(starved_then_fed.phases, "Dataloader (host)")
    assert (loader.before, loader.after) == (40 * MS, 2 * MS)
    forward = _named(starved_then_fed.phases, "Forward (host)")
    assert forward.delta == 0 and forward.verdict == "same"
    # Phases with nothing on either side are left out.
    assert "Others (host)" not in {c.name for c in starved_then_fed.phases}


def test_moved_rows_per_step(starved_then_fed):
    rows = [r for r in starved_then_fed.rows if r.table == "gpu_idle"]
    loading = next(r for r in rows if r.key == "data loading")
    assert loading.before == 40 * MS and loading.after == 2 * MS and loading.verdict == "better"
    # Kernels ran the same: no kernel row moved.
    assert not [r for r in starved_then_fed.rows if r.table == "kernel"]


def test_findings_that_went_away(starved_then_fed):
    gone = {f.rule: f for f in starved_then_fed.findings if f.status == "gone"}
    assert "dataloader-starvation" in gone
    assert gone["dataloader-starvation"].label_before == "1" and gone["dataloader-starvation"].saving_after_ms is None
    kept = [f for f in starved_then_fed.findings if f.rule == "tensor-core-misalignment"]
    assert len(kept) == 1 and kept[0].status in ("unchanged", "changed") and kept[0].label_after


def test_the_other_way_round_findings_appear():
    c = compare(_parts(sample_session(loader_ms=2)), _parts(sample_session(loader_ms=40)))
    appeared = [f for f in c.findings if f.status == "appeared"]
    assert "dataloader-starvation" in {f.rule for f in appeared}
    assert c.findings[0].status == "appeared"
    assert _named(c.headline, "mean step time").verdict == "worse"


def test_a_profile_against_itself_moves_nothing():
    session, tables, findings = sample_parts()
    parts = (build_step_model(session), tables, findings)
    c = compare(parts, parts)
    assert c.rows == []
    assert all(f.status == "unchanged" for f in c.findings)
    assert {x.verdict for x in c.headline + c.phases} == {"same"}


def test_without_steps_totals_are_compared_per_window():
    c = compare(_parts(sample_session(steps=0)), _parts(sample_session()))
    assert c.per == "window" and c.notes
    assert c.before.steps == 0 and c.after.steps == 3


def test_renderers_word_the_comparison(starved_then_fed):
    text = comparison_text(starved_then_fed)
    assert "Headline" in text and "-38.0 ms (-38%)" in text and "better" in text
    assert re.search(r"gone\s+dataloader-starvation", text)
    md = comparison_markdown(starved_then_fed)
    assert "| mean step time | 100 ms | 62.0 ms | -38.0 ms (-38%) | **better** |" in md
    assert Comparison.model_validate_json(starved_then_fed.model_dump_json()) == starved_then_fed


def test_an_80_column_terminal_reads_every_finding_s_title(starved_then_fed):
    text = comparison_text(starved_then_fed, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    findings = text[text.index("Findings"):]
    assert not any(line.strip() == "\u2026" for line in findings.splitlines())  # no column squeezed to a "..."
    for f in starved_then_fed.findings:
        assert " ".join(f.title.split()[:3]) in " ".join(findings.split()), f.title


def test_an_80_column_terminal_cuts_no_figure_nor_verdict(starved_then_fed):
    # The throughput reads "x.xxx steps/s" and its change "+x.xxx steps/s (+nn%)": on 80
    # columns the row names wrap, the figures and verdicts stay whole (they were cut to
    # "5.72 steps..." and "bette" when a redirect gave the console 80 columns).
    text = comparison_text(starved_then_fed, width=80)
    assert "\u2026" not in text[:text.index("Findings")]
    for change in starved_then_fed.headline + starved_then_fed.phases:
        assert re.search(rf"\b{change.verdict}\b", text)
    for change in starved_then_fed.headline:
        for figure in (_value(change, change.before), _value(change, change.after), _delta(change)):
            assert figure in text, figure


def test_names_from_traces_are_escaped_in_markdown():
    slow = sample_session()
    ev = slow.events
    nasty = (ev["name"] == NASTY).to_numpy()
    ev.loc[nasty, "end_ns"] += 5 * MS  # the kernel with markup in its name runs longer after
    c = compare(_parts(sample_session()), _parts(slow))
    assert any(r.key == NASTY and r.table == "kernel" for r in c.rows)
    md = comparison_markdown(c)
    assert "<script>" not in md and "\\<script\\>" in md


def test_cli_compare_json(tmp_path, capsys):
    before = sample_session(loader_ms=40).save(tmp_path / "before")
    after = sample_session(loader_ms=2).save(tmp_path / "after")
    assert main(["compare", str(before), str(after), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["per"] == "step" and data["before"]["steps"] == 3
    assert main(["compare", str(before), str(after), "-f", "markdown", "-o", str(tmp_path / "c.md")]) == 0
    assert (tmp_path / "c.md").read_text().startswith("## advisor compare")


def test_cli_compare_refuses_scripts_and_missing_files(tmp_path, capsys):
    folder = sample_session().save(tmp_path / "s")
    assert main(["compare", "train.py", str(folder)]) == 2
    assert "run `advisor diagnose --save DIR train.py` first" in capsys.readouterr().err
    assert main(["compare", str(folder), str(tmp_path / "missing.json")]) != 0
    assert "no such file" in capsys.readouterr().err


def test_render_to_console(starved_then_fed, tmp_path):
    out = tmp_path / "c.txt"
    render_comparison(starved_then_fed, "terminal", out)
    assert out.read_text().startswith("advisor compare")


def test_resnet50_num_workers_0_then_4():
    before = _parts(load(shared_trace("resnet50_v100_num_workers_0.pt.trace.json.gz")))
    after = _parts(load(shared_trace("resnet50_v100_num_workers_4.pt.trace.json.gz")))
    c = compare(before, after)
    step = _named(c.headline, "mean step time")
    # The steady steps' mean, the step model's (advisor.step.timing): 174.8 -> 131.3 ms, the
    # second trace's first step (waiting on work launched before the trace) set apart.
    assert step.verdict == "better" and step.relative == pytest.approx(131.3 / 174.8 - 1, abs=0.01)
    loader = _named(c.phases, "Dataloader (host)")
    assert loader.relative < -0.95
    status = {f.rule: f.status for f in c.findings}
    assert status["dataloader-starvation"] == "gone" and status["low-gpu-utilization"] == "gone"
    # The pageable copy waits on a busier GPU once the loader no longer hides its tail: the
    # same finding, worth more after.
    sync = next(f for f in c.findings if f.rule == "sync-memcpy-stall")
    assert sync.status == "changed" and sync.saving_after_ms > sync.saving_before_ms
    assert sync.anchor == "host_sync[aten::to @ resnet50_profiler_api.py:44]"
    idle = next(r for r in c.rows if r.table == "gpu_idle" and r.key == "data loading")
    assert idle.verdict == "better"


def test_the_job_s_own_pace_leads_where_both_runs_have_unrecorded_steps():
    import pandas as pd

    def with_own_pace(parts, own_ms):
        model, tables, findings = parts
        timing = pd.DataFrame({"unrecorded_avg_ns": [own_ms * MS]}, index=["ProfileStep"])
        return model, {**tables, "step_timing": timing}, findings

    # recorded: 100 -> 62 ms (-38%); unrecorded, the job's own pace: 60 -> 50 ms (-17%)
    c = compare(with_own_pace(_parts(sample_session(loader_ms=40)), 60),
                with_own_pace(_parts(sample_session(loader_ms=2)), 50))
    first = c.headline[0]
    assert first.name == "step time, unrecorded steps (the job's own pace)"
    assert (first.before, first.after) == (60 * MS, 50 * MS) and first.verdict == "better"
    assert _named(c.headline, "mean step time (recorded steps)").relative == pytest.approx(-0.38)


def _copies_session(copies_per_step: int):
    """Two 20 ms steps, each a matmul of 8 ms on the GPU and ``copies_per_step`` device-to-
    device copies of 0.1 ms each, launched by aten::copy_."""
    from builders import Trace

    t = Trace()
    for number, base in ((1, 0.0), (2, 20.0)):
        t.step(number, base, base + 20)
        mm = t.op("aten::mm", base + 1, base + 2)
        t.gpu("gemm", "kernel", base + 2, base + 10, launch=t.call("cudaLaunchKernel", base + 1.2, base + 1.4, parent=mm))
        for i in range(copies_per_step):
            start = base + 10 + i * 0.45
            op = t.op("aten::copy_", start, start + 0.3)
            call = t.call("cudaMemcpyAsync", start + 0.05, start + 0.1, parent=op)
            t.gpu("Memcpy DtoD (Device -> Device)", "memcpy", start + 0.1, start + 0.2, launch=call,
                  copy_kind="DtoD", src_memory="Device", dst_memory="Device", bytes=1_000_000)
    return t.session()


def test_copies_that_multiply_lead_the_comparison():
    comparison = compare(_parts(_copies_session(1)), _parts(_copies_session(20)))
    (copies, *others) = [m for m in comparison.multiplied if m.table == "memory"]
    assert copies.key == "Memcpy DtoD (Device -> Device)" and copies.factor == pytest.approx(20)
    assert copies.calls_before == 1 and copies.calls_after == 20
    assert "20.0x" in copies.message and "1.0 -> 20.0 calls per step" in copies.message
    text = comparison_text(comparison)
    assert text.index("What multiplied") < text.index("Headline")
    assert "What multiplied" in comparison_markdown(comparison)
    # The same run against itself multiplies nothing.
    assert compare(_parts(_copies_session(20)), _parts(_copies_session(20))).multiplied == []
