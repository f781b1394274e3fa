"""Reports: the Report contract, its JSON Schema, and the terminal / JSON / Markdown renderers.

Everything here is built by hand (session, tables, findings), so the tests depend on no
importer, table or rule. Golden files live in tests/golden/; to accept a deliberate change
of the output, run ``ADVISOR_UPDATE_GOLDEN=1 pytest tests/test_reports.py`` and read the diff.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import os
import re
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

import advisor
from advisor import units
from advisor.errors import UsageError
from advisor.findings import Evidence, Finding, Saving, Severity
from advisor.reports import (
    Report,
    build_report,
    render,
    render_json,
    render_markdown,
    terminal_text,
)
from advisor.reports._markdown import md_code, md_escape
from advisor.reports.report import StepSummary
from advisor.reports.schema import (
    SCHEMA_PATH,
    load_report_schema,
    report_schema,
    schema_text,
    validate_report,
)
from advisor.session import (
    CollectorInfo,
    DeviceInfo,
    Session,
    SessionMeta,
    conform_events,
)

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("ADVISOR_UPDATE_GOLDEN") == "1"
NASTY_KERNEL = "void k<a|b>`x`"
MS = 1_000_000


# -- hand-made inputs ----------------------------------------------------------------------


def make_session(*, gpu_measured: bool = True, steps: int = 3) -> Session:
    rows = []
    for i in range(steps):
        start = 1_000 * MS + i * 100 * MS
        rows.append(
            dict(name=f"ProfilerStep#{i + 1}", kind="step", start_ns=start, end_ns=start + 100 * MS, step=i + 1)
        )
        rows.append(
            dict(
                name="Dataloader", kind="phase", phase="Dataloader", start_ns=start, end_ns=start + 41 * MS, step=i + 1
            )
        )
        rows.append(
            dict(
                name=NASTY_KERNEL,
                kind="kernel",
                start_ns=start + 50 * MS,
                end_ns=start + 90 * MS,
                device=0,
                stream=7,
                step=i + 1,
            )
        )
    rows.append(dict(name="cudaMemcpy", kind="runtime", start_ns=1_000 * MS - 5 * MS, end_ns=1_000 * MS - 3 * MS))
    meta = SessionMeta(
        source="train.py",
        source_format="script",
        created="2024-01-01T00:00:00+00:00",
        command=["train.py", "--epochs", "1"],
        exit_code=0,
        collector=CollectorInfo(
            name="cupti" if gpu_measured else "host",
            gpu_measured=gpu_measured,
            notes=[] if gpu_measured else ["GPU not measured: no CUDA device on this machine"],
        ),
        devices=[
            DeviceInfo(id=-1, kind="cpu", name="x86_64"),
            DeviceInfo(
                id=0,
                kind="gpu",
                name="NVIDIA A100-SXM4-40GB",
                compute_capability="8.0",
                sm_count=108,
                total_memory_bytes=40 * 1024**3,
            ),
        ],
    )
    return Session(meta, conform_events(pd.DataFrame(rows)))


def _frame(index: list[str], **columns) -> pd.DataFrame:
    return pd.DataFrame(columns, index=pd.Index(index, name="key"))


def make_tables() -> dict[str, pd.DataFrame]:
    phases = ["Dataloader", "Forward", "Backward", "Optimization", "Others"]
    model = _frame(
        phases,
        calls=np.array([3, 3, 3, 3, 3], dtype="int64"),
        cpu_total_ns=np.array([123, 60, 90, 20, 7], dtype="int64") * MS,
        cpu_avg_ns=np.array([41, 20, 30, 6.67, 2.33]) * MS,
        cpu_ratio=np.array([0.41, 0.2, 0.3, 0.0667, 0.0233]),
        gpu_total_ns=np.array([np.nan, 40, 70, 10, 0]) * MS,
        gpu_ratio=np.array([np.nan, 0.1333, 0.2333, 0.0333, 0.0]),
    )
    perf = _frame(
        ["reader_cost", "batch_cost", "ips"],
        avg=[0.041, 0.1, 320.0],
        max=[0.05, 0.11, 330.5],
        min=[0.03, 0.09, 290.25],
        unit=["s", "s", "samples/s"],
    )
    device = _frame(["CPU", "GPU 0"], utilization=[0.93, 0.45], busy_ns=np.array([279, 135], dtype="int64") * MS)
    kernel_names = [NASTY_KERNEL] + [f"sm80_xmma_gemm_f16f16_kernel_{i}" for i in range(11)]
    totals = np.array([120] + [30 - 2 * i for i in range(11)], dtype="int64") * MS // 10
    kernel = _frame(
        kernel_names,
        calls=np.full(12, 3, dtype="int64"),
        total_ns=totals,
        avg_ns=totals / 3,
        max_ns=totals // 2,
        min_ns=totals // 4,
        ratio=totals / totals.sum(),
    )
    ops = ["aten::conv2d", "aten::addmm", "aten::copy_", "aten::relu"]
    operator = _frame(
        ops,
        calls=np.array([3, 3, 6, 3], dtype="int64"),
        cpu_total_ns=np.array([9, 5, 3, 1], dtype="int64") * MS,
        gpu_total_ns=np.array([60, 30, np.nan, 5]) * MS,
        input_shapes=["[[32, 3, 224, 224]]", "[[32, 2048], [1000, 2048]]", "", "[[32, 64]]"],
    )
    return {"model": model, "perf": perf, "device": device, "kernel": kernel, "operator": operator}


def make_findings() -> list[Finding]:
    symptom = Finding(
        rule="low-gpu-utilization",
        title="GPU idle 55% of the window",
        severity=Severity.medium,
        confidence=0.8,
        saving=Saving(ms_per_step=np.float64(30.0), share_of_step=0.3, basis="idle time while the host loads data"),
        message="GPU 0 is busy 45.0% of the 300 ms window; most idle time falls while the host is in the data loader.",
        recommendation="Fix the data loader first; the GPU idles because of it.",
        evidence=[
            Evidence(kind="table_row", table="device", row="GPU 0", column="utilization", value=np.float64(0.45)),
            Evidence(
                kind="event", event_id=np.int64(9), name="cudaMemcpy", column="duration_ns", value=np.int64(2_100_000)
            ),
        ],
    )
    cause = Finding(
        rule="dataloader-starvation",
        title="The step waits on the data loader",
        severity=Severity.high,
        confidence=0.9,
        saving=Saving(ms_per_step=41.0, share_of_step=0.41, basis="Dataloader time per step"),
        message="Dataloader takes 41.0% of each step (41.0 ms of 100 ms); the GPU waits meanwhile.",
        recommendation="Set DataLoader(num_workers=4, pin_memory=True) and keep batches on the device.",
        evidence=[
            Evidence(kind="table_row", table="model", row="Dataloader", column="cpu_ratio", value=np.float64(0.41)),
            Evidence(kind="table_row", table="perf", row="reader_cost", column="avg", value=0.041),
            Evidence(kind="source_line", file="train.py", line=42, function="main", note="for batch in loader"),
        ],
        explains=[symptom],
        metrics={"dataloader_share": np.float64(0.41), "steps": np.int64(3), "missing": float("nan")},
    )
    other = Finding(
        rule="tensor-core-misalignment",
        title=f"GEMM shapes miss tensor cores in {NASTY_KERNEL}",
        severity=Severity.low,
        confidence=0.6,
        saving=Saving(ms_per_step=0.42, share_of_step=0.0042),
        message="aten::addmm has N = 1000, not a multiple of 8 for fp16.",
        recommendation="Pad the classifier to 1008 outputs.",
        evidence=[
            Evidence(kind="table_row", table="kernel", row=NASTY_KERNEL, column="total_ns", value=np.int64(12 * MS)),
        ],
    )
    return [cause, other]


# The steps as the step model states them (advisor.diagnosis.report_steps): the report
# copies them, the mean step included; it works out no step time of its own.
STEPS = StepSummary(count=3, numbers=[1, 2, 3], mean_step_ns=100 * MS)


@pytest.fixture
def report() -> Report:
    return build_report(make_session(), make_tables(), make_findings(), steps=STEPS)


def scrub(text: str) -> str:
    """Remove what changes from run to run or release to release: times and versions."""
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?", "<time>", text)
    return re.sub(r'("advisor_version": )"[^"]*"', r'\1"<version>"', text)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    text = scrub(text)
    if UPDATE or not path.exists():
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"{path} did not exist; written now, check it and commit it")
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"output differs from {path}; ADVISOR_UPDATE_GOLDEN=1 rewrites it"


# -- the model ----------------------------------------------------------------------------


def test_build_report_copies_session_metadata(report):
    session = report.session
    assert session.source == "train.py"
    assert session.source_format == "script"
    assert session.command == ["train.py", "--epochs", "1"]
    assert session.exit_code == 0
    assert session.window.start_ns == 1_000 * MS
    assert session.window.end_ns == 1_300 * MS
    assert session.window.duration_ns == 300 * MS
    assert session.steps.count == 3
    assert session.steps.numbers == [1, 2, 3]
    assert session.steps == STEPS
    assert [d.name for d in session.devices] == ["x86_64", "NVIDIA A100-SXM4-40GB"]
    assert session.collector.gpu_measured is True
    assert report.notes == []
    assert set(report.metrics) >= {"window", "gpu_utilization", "dataloader_share", "ideal_time", "efficiency"}
    assert report.advisor_version == advisor.__version__


def test_build_report_copies_tables_row_by_row(report):
    model = report.tables["model"]
    assert [c.name for c in model.columns] == [
        "calls",
        "cpu_total_ns",
        "cpu_avg_ns",
        "cpu_ratio",
        "gpu_total_ns",
        "gpu_ratio",
    ]
    assert [r["key"] for r in model.rows] == ["Dataloader", "Forward", "Backward", "Optimization", "Others"]
    row = model.row("Dataloader")
    assert row["calls"] == 3 and type(row["calls"]) is int
    assert row["cpu_total_ns"] == 123 * MS and type(row["cpu_total_ns"]) is int
    assert row["cpu_ratio"] == 0.41 and type(row["cpu_ratio"]) is float
    assert row["gpu_total_ns"] is None  # NaN -> null
    assert report.tables["perf"].row("ips")["unit"] == "samples/s"
    assert report.tables["kernel"].rows[0]["key"] == NASTY_KERNEL
    assert model.title == "Model"


def test_build_report_uses_table_docs_and_frame_attrs():
    tables = make_tables()
    tables["kernel"].attrs = {
        "title": "Kernel Summary",
        "columns": {"calls": "launches in the window"},
        "notes": ["GPU not measured: no CUDA device"],
    }
    docs = {
        "model": {
            "title": "Model Summary",
            "description": "Time per phase.",
            "key": "phase",
            "columns": [{"name": "cpu_ratio", "description": "CPU time over step time"}],
        }
    }
    report = build_report(make_session(), tables, [], table_docs=docs)
    model = report.tables["model"]
    assert (model.title, model.description, model.key) == ("Model Summary", "Time per phase.", "phase")
    assert {c.name: c.description for c in model.columns}["cpu_ratio"] == "CPU time over step time"
    kernel = report.tables["kernel"]
    assert kernel.title == "Kernel Summary"
    assert kernel.columns[0].description == "launches in the window"
    assert kernel.notes == ["GPU not measured: no CUDA device"]
    assert "GPU not measured: no CUDA device" in terminal_text(report)
    assert "> GPU not measured: no CUDA device" in render_markdown(report)


def test_table_docs_may_be_objects():
    class Doc:
        title = "Kernel Summary"
        description = "One row per kernel name."
        key = "kernel name"
        columns = {"calls": "launches"}

    report = build_report(make_session(), make_tables(), [], table_docs={"kernel": Doc()})
    kernel = report.tables["kernel"]
    assert (kernel.title, kernel.key, kernel.columns[0].description) == ("Kernel Summary", "kernel name", "launches")


def test_build_report_keeps_findings_as_python_values(report):
    cause = report.findings[0]
    assert cause.metrics == {"dataloader_share": 0.41, "steps": 3, "missing": None}
    assert type(cause.metrics["steps"]) is int
    symptom = cause.explains[0]
    assert symptom.evidence[1].value == 2_100_000 and type(symptom.evidence[1].value) is int
    json.loads(render_json(report))  # no numpy value left to trip the encoder


def test_ranking_order_is_kept_as_given():
    findings = make_findings()[::-1]  # the smaller saving first: the engine's order wins
    report = build_report(make_session(), make_tables(), findings)
    assert [f.rule for f in report.findings] == ["tensor-core-misalignment", "dataloader-starvation"]
    assert [f["rule"] for f in json.loads(render_json(report))["findings"]] == [
        "tensor-core-misalignment",
        "dataloader-starvation",
    ]
    text = terminal_text(report)
    assert text.index("1. LOW") < text.index("2. HIGH") < text.index("2.1. MEDIUM")
    md = render_markdown(report)
    assert md.index("GEMM shapes miss") < md.index("The step waits") < md.index("GPU idle 55%")


def test_gpu_not_measured_is_said_and_why():
    report = build_report(make_session(gpu_measured=False), {}, [])
    assert report.notes == ["GPU not measured: no CUDA device on this machine"]
    assert report.session.collector.gpu_measured is False
    text = terminal_text(report)
    assert "GPU      not measured: no CUDA device on this machine" in text
    assert "No findings" in text
    md = render_markdown(report)
    assert "> GPU not measured: no CUDA device on this machine" in md
    assert "No findings" in md


def test_session_without_steps_reports_the_event_window():
    session = make_session(steps=0)
    report = build_report(session, {}, [])
    assert report.session.steps.count == 0
    assert report.session.steps.mean_step_ns is None
    assert report.session.window.duration_ns == 2 * MS
    assert any("No steps" in n for n in report.notes)
    validate_report(render_json(report))
    assert "no steps" in terminal_text(report)


def test_script_error_and_dropped_records_are_noted():
    session = make_session()
    session.meta.script_error = "RuntimeError: CUDA out of memory"
    session.meta.exit_code = 1
    session.meta.collector.dropped_records = 1234
    report = build_report(session, {}, [])
    assert "The collector dropped 1,234 records; totals may be low." in report.notes
    assert "The script did not finish normally: RuntimeError: CUDA out of memory" in report.notes
    text = terminal_text(report)
    assert "train.py --epochs 1 (exit code 1)" in text
    assert "CUDA out of memory" in text


def test_table_frame_with_a_key_column_and_odd_values():
    frame = pd.DataFrame(
        {
            "key": ["a", "b"],
            "n": pd.array([1, None], dtype="Int64"),
            "when": [pd.Timestamp("2024-01-01T00:00:00Z"), pd.NaT],
            "inf": [np.inf, -np.inf],
            "flag": np.array([True, False]),
            "shape": [np.array([2, 3]), [4]],
        }
    )
    report = build_report(make_session(), {"odd": frame}, [])
    rows = report.tables["odd"].rows
    assert rows[0] == {
        "key": "a",
        "n": 1,
        "when": "2024-01-01T00:00:00+00:00",
        "inf": None,
        "flag": True,
        "shape": [2, 3],
    }
    assert rows[1] == {"key": "b", "n": None, "when": None, "inf": None, "flag": False, "shape": [4]}
    validate_report(render_json(report))


# -- the schema ---------------------------------------------------------------------------


def test_committed_schema_is_the_generated_one():
    assert SCHEMA_PATH.is_file(), "run: python -m advisor.reports.schema"
    assert SCHEMA_PATH.read_text(encoding="utf-8") == schema_text(), (
        "advisor/schemas/report.schema.json is stale; regenerate it: python -m advisor.reports.schema"
    )
    assert load_report_schema() == report_schema()


def test_schema_is_a_valid_2020_12_schema_with_titles():
    schema = load_report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)

    def properties(node):
        if isinstance(node, dict):
            for name, prop in (node.get("properties") or {}).items():
                if isinstance(prop, dict) and "title" in node:
                    yield name, prop
            for value in node.values():
                yield from properties(value)
        elif isinstance(node, list):
            for value in node:
                yield from properties(value)

    # A property that is a $ref takes the title of the definition it names.
    untitled = [name for name, prop in properties(schema) if not ({"title", "$ref"} & set(prop))]
    assert not untitled


def test_json_report_validates_against_the_committed_schema(report):
    text = render_json(report)
    data = json.loads(text)
    validate_report(data)
    assert text.startswith('{\n  "advisor_version"')
    assert data["findings"][0]["rule"] == "dataloader-starvation"
    assert data["findings"][0]["explains"][0]["rule"] == "low-gpu-utilization"
    assert data["tables"]["kernel"]["rows"][0]["key"] == NASTY_KERNEL
    assert data["tables"]["model"]["rows"][0]["gpu_total_ns"] is None
    assert Report.model_validate_json(text) == report  # the JSON report reads back whole


def test_schema_rejects_a_broken_report(report):
    data = json.loads(render_json(report))
    del data["findings"][0]["saving"]
    with pytest.raises(jsonschema.ValidationError):
        validate_report(data)
    data = json.loads(render_json(report))
    del data["tables"]["model"]["rows"][0]["key"]
    with pytest.raises(jsonschema.ValidationError):
        validate_report(data)
    data = json.loads(render_json(report))
    data["findings"][0]["severity"] = "catastrophic"
    with pytest.raises(jsonschema.ValidationError):
        validate_report(data)


def test_json_golden(report):
    check_golden("report.json", render_json(report))


# -- the terminal report ------------------------------------------------------------------


def test_terminal_golden(report):
    text = terminal_text(report, width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    check_golden("report_terminal.txt", text)


def test_terminal_shows_findings_nested_and_evidence(report):
    text = terminal_text(report)
    assert "1. HIGH  The step waits on the data loader  [dataloader-starvation]" in text
    assert "Saves 41.0 ms/step (41% of step)" in text
    assert "model[Dataloader].cpu_ratio = 0.41" in text
    assert "event #9 cudaMemcpy 2.10 ms" in text
    assert "train.py:42 in main" in text
    assert "1.1. MEDIUM  GPU idle 55% of the window  [low-gpu-utilization]  explained by the above" in text
    symptom_line = next(line for line in text.splitlines() if "1.1. MEDIUM" in line)
    cause_line = next(line for line in text.splitlines() if "1. HIGH" in line)
    assert len(symptom_line) - len(symptom_line.lstrip()) > len(cause_line) - len(cause_line.lstrip())
    assert text.count("1.1. MEDIUM") == 1  # shown once, under its cause


def test_terminal_is_stable_across_widths_and_colour(report):
    for width in (60, 80, 100, 160):
        text = terminal_text(report, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert "\x1b[" not in text
    coloured = terminal_text(report, color=True)
    assert "\x1b[" in coloured
    plain = "".join(line.rstrip() + "\n" for line in re.sub(r"\x1b\[[0-9;]*m", "", coloured).splitlines())
    assert plain == terminal_text(report)


def test_render_terminal_writes_to_the_console_given(report):
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, color_system=None, force_terminal=False)
    render(report, "terminal", console=console)
    assert "The step waits on the data loader" in buffer.getvalue()


# -- the Markdown report ------------------------------------------------------------------


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def test_markdown_escapes_names_in_tables(report):
    md = render_markdown(report)
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith(r"| key | calls | total\_ns"))
    row = next(line for line in lines if line.startswith("| void"))
    assert _unescaped_pipes(row) == _unescaped_pipes(header) == 8
    assert "`" not in row.replace("\\`", "")
    assert "<" not in row.replace("\\<", "") and ">" not in row.replace("\\>", "")
    assert md_escape(NASTY_KERNEL) == r"void k\<a\|b\>\`x\`"


def test_markdown_code_spans_hold_backticks():
    assert md_code("plain") == "`plain`"
    assert md_code("a`b") == "``a`b``"
    assert md_code("`x`") == "`` `x` ``"
    assert md_code("a|b") == "`a|b`"


def test_markdown_layout(report):
    md = render_markdown(report)
    assert md.startswith("## advisor report\n")
    assert "1. **The step waits on the data loader** (high, saves 41.0 ms/step (41% of step))" in md
    assert "   **Recommendation:** Set DataLoader(num_workers=4, pin_memory=True)" in md
    assert "   - `model[Dataloader].cpu_ratio` = 0.41" in md
    assert "   1. **GPU idle 55% of the window** (medium" in md  # nested under its cause
    assert "#### Kernel (top 10 of 12)" in md
    for title in ("#### Model", "#### Perf", "#### Device", "#### Operator"):
        assert title in md
    kernel_rows = [line for line in md.splitlines() if line.startswith(r"| sm80\_xmma")]
    assert len(kernel_rows) == 9
    assert "&lt;a|b&gt;" in md  # a title that names a kernel: no raw HTML


def test_markdown_golden(report):
    check_golden("report_markdown.md", render_markdown(report))


# -- render() -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["terminal", "json", "markdown"])
def test_render_to_a_file(report, tmp_path, fmt):
    out = tmp_path / "sub" / f"report.{fmt}"
    render(report, fmt, out)
    text = out.read_text(encoding="utf-8")
    if fmt == "json":
        validate_report(text)
    elif fmt == "terminal":
        assert text == terminal_text(report, width=100)
    else:
        assert text == render_markdown(report)


def test_render_to_stdout(report, capsys):
    render(report, "json", None)
    validate_report(capsys.readouterr().out)


@pytest.mark.parametrize("fmt", ["pdf", "yaml", ""])
def test_render_rejects_unknown_formats(report, fmt):
    with pytest.raises(UsageError, match="unknown report format"):
        render(report, fmt, None)


def test_render_reports_an_unwritable_path_as_usage_error(report, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot write"):
        render(report, "json", blocker / "report.json")


# -- units --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ns, text",
    [
        (0, "0 ns"),
        (850, "850 ns"),
        (456_000, "456 us"),
        (1_234_000, "1.23 ms"),
        (12_345_678, "12.3 ms"),
        (999_700, "1.00 ms"),
        (2_050_000_000, "2.05 s"),
        (float("nan"), "-"),
        (None, "-"),
    ],
)
def test_format_ns(ns, text):
    assert units.format_ns(ns) == text


def test_other_units():
    assert units.format_ratio(0.41) == "41.0%"
    assert units.format_share(0.41) == "41%"
    assert units.format_share(0.004) == "0.4%"
    assert units.format_saving(Saving(ms_per_step=12.3, share_of_step=0.41)) == "12.3 ms/step (41% of step)"
    assert units.format_saving(Saving(ms_per_step=0.456, share_of_step=0.01)) == "456 us/step (1% of step)"
    assert units.format_saving(Saving(ms_per_step=0, share_of_step=0, basis="none: says what is missing")) \
        == "n/a (says what is missing)"
    assert units.format_saving(Saving(ms_per_step=0, share_of_step=0, basis="unknown: the GPU was not recorded")) \
        == "unknown (the GPU was not recorded)"
    assert units.format_bytes(512) == "512 B"
    assert units.format_bytes(40 * 1024**3) == "40.0 GiB"
    assert units.format_cell("cpu_total_ns", 123 * MS) == "123 ms"
    assert units.format_cell("gpu_ratio", 0.1333) == "13.3%"
    assert units.format_cell("calls", 12345) == "12,345"
    assert units.format_cell("name", NASTY_KERNEL) == NASTY_KERNEL
    assert units.format_cell("name", "x" * 100, max_chars=10) == "xxxxxxx..."
    assert units.format_cell("gpu_total_ns", None) == "-"


@settings(max_examples=200)
@given(st.floats(min_value=0, max_value=1e13, allow_nan=False))
def test_format_ns_keeps_three_digits_below_1000(ns):
    number, unit = units.format_ns(ns).split(" ")
    assert unit in ("ns", "us", "ms", "s")
    assert float(number) < 1000 or unit == "s"


# -- properties and the public surface ----------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=30),
            st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**62), 2**62)),
        ),
        max_size=8,
    )
)
def test_any_table_values_give_a_valid_report_in_every_format(rows):
    frame = pd.DataFrame(
        {"value_ns": [v for _, v in rows], "ratio": [v for _, v in rows]},
        index=pd.Index([k for k, _ in rows], name="key", dtype=object),
    )
    report = build_report(make_session(), {"kernel": frame, "model": frame}, make_findings())
    validate_report(render_json(report))
    for row in report.tables["kernel"].rows:
        for value in row.values():
            assert not (isinstance(value, float) and not math.isfinite(value))
    terminal_text(report)
    render_markdown(report)


# -- with the real tables, where they exist ------------------------------------------------


def test_report_from_computed_tables():
    try:
        tables_module = importlib.import_module("advisor.tables")
    except ImportError:
        pytest.skip("advisor.tables is not there yet")
    compute_tables = getattr(tables_module, "compute_tables", None)
    if compute_tables is None:
        pytest.skip("advisor.tables has no compute_tables yet")
    session = make_session()
    tables = compute_tables(session)
    report = build_report(session, tables, make_findings(), table_docs=getattr(tables_module, "TABLE_DOCS", None))
    validate_report(render_json(report))
    assert set(report.tables) == {str(name) for name in tables}
    for name, frame in tables.items():
        assert len(report.tables[str(name)].rows) == len(frame)
    terminal_text(report)
    render_markdown(report)


def test_rules_the_profile_could_not_judge_are_named_in_the_notes():
    from report_samples import sample_parts

    from advisor.reports import build_report as build

    session, tables, findings = sample_parts()
    report = build(session, tables, findings, skipped={"launch-bound": "needs a measured GPU",
                                                       "optimizer-not-fused": "needs a measured GPU",
                                                       "my-rule": "disabled"})
    gpu = [n for n in report.notes if n.startswith("Rules that judge GPU work did not run")]
    assert gpu == ["Rules that judge GPU work did not run, the GPU was not measured: launch-bound, "
                   "optimizer-not-fused."]
    assert not any("my-rule" in n for n in report.notes)  # the user's own choice needs no note


@pytest.mark.parametrize("ratio, said", [
    (0.1, "(recording added 10.0%)"),
    (-0.078, "(the recorded steps were 7.8% faster: recording cost less than the steps vary)"),
])
def test_the_steps_line_says_what_recording_cost_and_never_a_negative_cost(ratio, said):
    from types import SimpleNamespace

    from advisor.reports._common import steps_text

    steps = StepSummary(count=5, numbers=[2, 3, 4, 5, 6], mean_step_ns=69.3e6, unrecorded_steps=12,
                        unrecorded_mean_step_ns=75.2e6, overhead_ratio=ratio)
    text = steps_text(SimpleNamespace(session=SimpleNamespace(steps=steps)))
    assert text.endswith(said), text
    assert "added -" not in text


def test_the_steps_line_says_which_step_was_set_apart_as_a_stall():
    from types import SimpleNamespace

    from advisor.reports._common import steps_text
    from advisor.reports.report import StalledStep

    steps = StepSummary(count=5, numbers=[2, 3, 4, 5, 6], mean_step_ns=10.9e6, unrecorded_steps=70,
                        unrecorded_mean_step_ns=8.5e6, overhead_ratio=0.244,
                        stalled=[StalledStep(step=54, duration_ns=192e6, times_median=21.8)])
    text = steps_text(SimpleNamespace(session=SimpleNamespace(steps=steps)))
    assert text.endswith("(recording added 24.4%); step #54 (192 ms, 21.8x the median) set apart from the mean: a "
                         "pause of the process (most likely the garbage collector or the machine), not the loop's "
                         "pace"), text


def test_on_a_busy_machine_a_saving_leads_with_its_share_and_says_the_load():
    """Milliseconds measured on a busy machine stretch with its load; the share of the step
    holds. The saving says so, in every format."""
    from pathlib import Path

    from advisor.diagnosis import diagnose
    from advisor.importers import load
    from advisor.units import format_saving, format_share

    session = load(Path(__file__).resolve().parents[1] / "cases" / "cpu_in_memory_loop" / "session")
    quiet = diagnose(session).findings[0]
    facts = dict(session.meta.trace_metadata.get("advisor") or {})
    facts["cpu_wait"] = {"wall_ns": 1_000_000_000, "run_delay_ns": 400_000_000}
    session.meta.trace_metadata["advisor"] = facts
    busy = diagnose(session).findings[0]
    assert quiet.saving.busy_share is None and busy.saving.busy_share == 0.4
    said = format_saving(busy.saving)
    assert said.startswith(f"{format_share(busy.saving.share_of_step)} of each step")
    assert "at this run's load: the main thread waited for a core 40% of its time" in said
    assert busy.saving.ms_per_step == quiet.saving.ms_per_step  # the figures are the run's; only the wording leads


def test_evidence_of_a_column_of_nanoseconds_by_any_of_its_names_reads_as_a_duration():
    # autograd_nodes' ns_per_step read "9.281e+06" beside every other figure in units
    from advisor.reports._common import evidence_value
    from advisor.units import format_cell

    assert evidence_value("ns_per_step", 9.281e6) == "9.28 ms"
    assert evidence_value("per_step_ns", 9.281e6) == "9.28 ms"
    assert evidence_value("calls_per_step", 9.281e6) == "9.281e+06"
    assert format_cell("ns_per_step", 64_600.0) == "64.6 us"


def test_a_long_row_key_is_cut_in_the_middle_so_its_end_is_read():
    """'autograd::engine::evaluate_function: AddmmBackward0' cut at its end read
    'autograd::engine::evaluate_function…': which backward it was is at the end."""
    from advisor.reports._terminal import _cut_key

    tables = make_tables()
    long = "autograd::engine::evaluate_function: AddmmBackward0_with_a_name_longer_than_any_column_allows_here"
    tables["kernel"] = tables["kernel"].rename(index={NASTY_KERNEL: long})
    text = terminal_text(build_report(make_session(), tables, make_findings(), steps=STEPS))
    (line,) = [ln for ln in text.splitlines() if ln.startswith("autograd::engine::")]
    key = line.split("  ")[0]
    assert "…" in key and key.endswith("_here") and len(key) < len(long)
    assert _cut_key("abcdefghij", 10) == "abcdefghij"
    assert _cut_key("abcdefghijk", 6) == "abc…jk"
    # Keys that would read the same once cut are cut nearer their start, so rows stay apart.
    from advisor.reports._terminal import _cut_keys

    nodes = [f"autograd::engine::evaluate_function: {n}Backward0" for n in ("Addmm", "Mm", "Relu")]
    assert _cut_keys(nodes, 18) == ["auto…ddmmBackward0", "auto…: MmBackward0", "auto…ReluBackward0"]
    # An escaped control character is kept whole or left out, never cut in two.
    assert _cut_key(r"aten::mm\x1b]0;title\x07\x9b31m", 18) == r"aten::mm…\x9b31m"
