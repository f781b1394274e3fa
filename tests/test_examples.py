"""The example scripts with planted problems, and the benchmarks that go with them.

- Each new example runs plainly on a CPU and exits 0 (the scripts run concurrently, in
  subprocesses, to keep the file quick).
- odd_gemm's GEMM sizes miss multiples of 8 and aligned_gemm's are the same sizes
  rounded up to them, read from the models the scripts build.
- benchmarks/gpu_checks.py: its comparison and attribution functions on hand-made
  sessions, its case drafting against a recorded case, its argument parsing, and the one
  line it gives on a machine without CUDA.
- benchmarks/collector_overhead.py runs its CPU rows and says the GPU rows need a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
import yaml

from advisor.session import CollectorInfo, Session, SessionMeta, conform_events

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
BENCHMARKS = REPO / "benchmarks"


def load_module(path: Path) -> ModuleType:
    """A script as a module, without running its main()."""
    spec = importlib.util.spec_from_file_location(f"_under_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_checks() -> ModuleType:
    return load_module(BENCHMARKS / "gpu_checks.py")


# -- the examples run ------------------------------------------------------------------------------

RUNS = {
    "pageable_copies": ["pageable_copies.py", "--steps", "2", "--batch-size", "8"],
    "odd_gemm": ["odd_gemm.py", "--steps", "2"],
    "aligned_gemm": ["aligned_gemm.py", "--steps", "2"],
    "small_batch": ["small_batch.py", "--steps", "2"],
}


OVERHEAD = "collector_overhead"


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every run started at once, the collector-overhead benchmark's CPU rows too: each is
    a Python process that mostly imports torch, so together they take little longer than
    the slowest."""
    commands = {name: [sys.executable, str(EXAMPLES / argv[0]), *argv[1:], "--device", "cpu"]
                for name, argv in RUNS.items()}
    overhead_json = tmp_path_factory.mktemp("overhead") / "overhead.json"
    commands[OVERHEAD] = [sys.executable, str(BENCHMARKS / "collector_overhead.py"), "--window", "1:3",
                          "--batch-size", "8", "--device", "cpu", "--json", str(overhead_json)]
    started = {name: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
               for name, command in commands.items()}
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=180)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    done[OVERHEAD].json_path = overhead_json
    return done


@pytest.mark.parametrize("name", list(RUNS))
def test_example_runs_on_cpu(example_runs, name):
    done = example_runs[name]
    assert done.returncode == 0, done.stderr[-2000:]
    script = RUNS[name][0].removesuffix(".py")
    assert done.stdout.startswith(f"{script}: 2 steps"), done.stdout


@pytest.mark.parametrize("script", ["pageable_copies.py", "odd_gemm.py", "aligned_gemm.py", "small_batch.py"])
def test_example_says_what_is_planted_and_takes_the_common_options(script):
    module = load_module(EXAMPLES / script)
    doc = module.__doc__ or ""
    assert "planted" in doc.lower() or "twin" in doc.lower()
    assert "fix" in doc.lower()
    source = (EXAMPLES / script).read_text()
    for option in ('"--steps"', '"--device"', '"--seed"'):
        assert option in source, f"{script} lacks {option}"
    assert callable(module.build_model)


# -- the GEMM twins ----------------------------------------------------------------------------------


def linear_sizes(module: ModuleType) -> list[tuple[int, int]]:
    model = module.build_model()
    return [(layer.in_features, layer.out_features) for layer in model.modules() if isinstance(layer, torch.nn.Linear)]


def round_up(value: int, multiple: int = 8) -> int:
    return -(-value // multiple) * multiple


def test_odd_gemm_misses_multiples_of_eight_in_every_layer():
    odd = load_module(EXAMPLES / "odd_gemm.py")
    sizes = linear_sizes(odd)
    assert len(sizes) == 3
    for fan_in, fan_out in sizes:
        assert fan_in % 8 or fan_out % 8, (fan_in, fan_out)
    assert odd.BATCH_SIZE % 8  # M, the batch, misses too


def test_aligned_gemm_is_odd_gemm_rounded_up_to_multiples_of_eight():
    odd = load_module(EXAMPLES / "odd_gemm.py")
    aligned = load_module(EXAMPLES / "aligned_gemm.py")
    sizes = linear_sizes(aligned)
    assert all(fan_in % 8 == 0 and fan_out % 8 == 0 for fan_in, fan_out in sizes), sizes
    assert aligned.BATCH_SIZE % 8 == 0
    assert sizes == [(round_up(a), round_up(b)) for a, b in linear_sizes(odd)]
    assert aligned.BATCH_SIZE == round_up(odd.BATCH_SIZE)


def test_small_batch_defaults_to_a_tiny_batch():
    source = (EXAMPLES / "small_batch.py").read_text()
    assert '"--batch-size", type=int, default=4' in source
    module = load_module(EXAMPLES / "small_batch.py")
    launches = sum(1 for m in module.build_model().modules() if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)))
    assert launches >= 20  # many small layers: many small kernels a step


# -- gpu_checks: comparing sessions ----------------------------------------------------------------------


def session_of(rows: list[dict]) -> Session:
    """A session from rows of (name, kind, start_ns, end_ns, step, ...)."""
    events = conform_events(pd.DataFrame(rows)) if rows else conform_events(pd.DataFrame({"name": []}))
    meta = SessionMeta(source="hand-made", source_format="test", collector=CollectorInfo(name="test"))
    return Session(meta, events)


def kernels(spec: dict[str, list[int]], step: int = 2) -> list[dict]:
    """Kernel rows: {name: [duration_ns, ...]}, laid end to end."""
    rows, t = [], 0
    for name, durations in spec.items():
        for duration in durations:
            rows.append({"name": name, "kind": "kernel", "start_ns": t, "end_ns": t + duration, "step": step})
            t += duration + 10
    return rows


BIG = {"gemm": [40_000, 40_000], "relu": [10_000] * 4, "bn": [8_000] * 3, "tiny": [100]}


def test_identical_sessions_agree(gpu_checks):
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(BIG)), session_of(kernels(BIG)))
    assert comparison.ok
    assert comparison.offenders.empty
    assert comparison.advisor_total_ns == comparison.reference_total_ns == 80_000 + 40_000 + 24_000 + 100
    assert comparison.rows.loc["gemm", "advisor_calls"] == 2
    assert set(comparison.rows.index[comparison.rows["checked"]]) == {"gemm", "relu", "bn"}  # tiny is < 1%


def test_a_kernel_off_by_more_than_the_tolerance_is_an_offender(gpu_checks):
    slower = dict(BIG, relu=[10_800] * 4)  # +8%
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(slower)), session_of(kernels(BIG)))
    assert not comparison.ok
    assert list(comparison.offenders.index) == ["relu"]
    assert comparison.offenders.loc["relu", "rel_diff"] == pytest.approx(0.08)
    assert any("relu" in line and "+8.0%" in line for line in comparison.lines())


def test_within_tolerance_and_small_kernels_pass(gpu_checks):
    close = dict(BIG, gemm=[41_000, 41_000], tiny=[300])  # +2.5%; tiny triples but is < 1% of the time
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(close)), session_of(kernels(BIG)))
    assert comparison.ok
    assert comparison.rows.loc["tiny", "rel_diff"] == pytest.approx(2.0)
    assert not comparison.rows.loc["tiny", "checked"]


def test_a_kernel_on_one_side_only_is_an_offender(gpu_checks):
    renamed = {("gemm_v2" if k == "gemm" else k): v for k, v in BIG.items()}
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(renamed)), session_of(kernels(BIG)))
    assert set(comparison.offenders.index) == {"gemm", "gemm_v2"}
    assert comparison.rows.loc["gemm_v2", "rel_diff"] == np.inf
    assert comparison.rows.loc["gemm", "rel_diff"] == -1.0
    text = "\n".join(comparison.lines())
    assert "advisor only" in text and "torch only" in text


def test_the_comparison_reads_only_the_steps_asked_for(gpu_checks):
    mine = kernels(BIG) + kernels({"gemm": [900_000]}, step=9)  # a later step the reference lacks
    comparison = gpu_checks.compare_kernel_times(session_of(mine), session_of(kernels(BIG)), steps=range(2, 7))
    assert comparison.ok
    assert not gpu_checks.compare_kernel_times(session_of(mine), session_of(kernels(BIG))).ok


def test_no_kernels_is_no_agreement(gpu_checks):
    assert not gpu_checks.compare_kernel_times(session_of([]), session_of(kernels(BIG))).ok


def test_attribution_shares(gpu_checks):
    rows = [
        {"name": "aten::mm", "kind": "op", "start_ns": 0, "end_ns": 100},
        {"name": "cudaLaunchKernel", "kind": "runtime", "start_ns": 10, "end_ns": 20, "parent_op": 0},
        *[{"name": "gemm", "kind": "kernel", "start_ns": 30 + i, "end_ns": 31 + i, "parent_op": 0, "launch": 1,
           "phase": "Forward", "step": 2} for i in range(98)],
        {"name": "stray", "kind": "kernel", "start_ns": 200, "end_ns": 210, "phase": "Others", "step": 2},
        {"name": "lost", "kind": "kernel", "start_ns": 220, "end_ns": 230},
    ]
    shares = gpu_checks.attribution_shares(session_of(rows))
    assert shares["kernels"] == 100
    assert shares["with_op"] == pytest.approx(0.98)
    assert shares["with_phase"] == pytest.approx(0.98)
    assert shares["with_step"] == pytest.approx(0.99)
    assert shares["by_phase"] == {"Forward": 98, "Others": 1, "(none)": 1}
    assert sorted(name for name, _ in shares["without_op"]) == ["lost", "stray"]
    assert gpu_checks.attribution_shares(session_of([]))["kernels"] == 0


def test_clock_consistency_counts_work_before_its_launch_and_calls_outside_their_op(gpu_checks):
    rows = [
        {"name": "aten::mm", "kind": "op", "start_ns": 1_000, "end_ns": 50_000, "external_id": 7},
        {"name": "cudaLaunchKernel", "kind": "runtime", "start_ns": 2_000, "end_ns": 3_000, "parent_op": 0,
         "external_id": 7},
        # outside its op by 10 us: the two clocks disagree
        {"name": "cudaLaunchKernel", "kind": "runtime", "start_ns": 45_000, "end_ns": 60_000, "parent_op": 0,
         "external_id": 7},
        {"name": "gemm", "kind": "kernel", "start_ns": 4_000, "end_ns": 9_000, "launch": 1},
        {"name": "gemm", "kind": "kernel", "start_ns": 30_000, "end_ns": 31_000, "launch": 2},  # 15 us early
    ]
    found = gpu_checks.clock_consistency(session_of(rows))
    assert found["gpu_rows"] == 2 and found["gpu_before_launch"] == 1 and found["worst_gpu_lead_ns"] == 15_000
    assert found["calls_in_ops"] == 2 and found["calls_outside_op"] == 1 and found["worst_outside_ns"] == 10_000


# -- gpu_checks: the record check, on the recorded stream tests/test_cupti.py replays --------------------


def recorded_records() -> list:
    """The records of tests/data/cupti/train_steps.json as objects of one class per
    cupti-python record type, with nested structs (``object_id.pt``) as objects too."""
    document = json.loads((REPO / "tests" / "data" / "cupti" / "train_steps.json").read_text())
    classes: dict[str, type] = {}

    def build(fields: dict, type_name: str = "Pod"):
        cls = classes.setdefault(type_name, type(type_name, (), {}))
        obj = cls()
        for key, value in fields.items():
            if not key.startswith("_"):
                setattr(obj, key, build(value) if isinstance(value, dict) else value)
        return obj

    return [build(raw, raw["_type"]) for buffer in document["buffers"] for raw in buffer]


def test_field_report_finds_every_field_advisor_reads_on_cupti_pythons_records(gpu_checks):
    records = recorded_records()
    types: dict = {}
    gpu_checks.note_record_types(records, types)
    assert sum(entry["count"] for entry in types.values()) == len(records)
    assert {"CONCURRENT_KERNEL/ActivityKernel9", "MEMCPY/ActivityMemcpy6", "RUNTIME/ActivityAPI",
            "EXTERNAL_CORRELATION/ActivityExternalCorrelation"} <= set(types)
    for key, entry in types.items():
        assert entry["missing"] == [], key
    assert types["MEMCPY/ActivityMemcpy6"]["renamed"] == {"flags": "flags_"}


def test_field_report_names_a_missing_field(gpu_checks):
    copy = next(r for r in recorded_records() if type(r).__name__ == "ActivityMemcpy6")
    del copy.bytes
    key, entry = gpu_checks.field_report(copy)
    assert key == "MEMCPY/ActivityMemcpy6" and entry["missing"] == ["bytes"]
    assert gpu_checks.field_report(object()) is None


# -- gpu_checks: cases ----------------------------------------------------------------------------------------


def test_drafted_cases_name_only_rules_that_exist(gpu_checks, tmp_path):
    from advisor.rules import builtin_specs

    known = {s.id for s in builtin_specs()}
    case_keys = {"description", "command", "must", "must_not", "known_wrong", "expect"}
    for spec in gpu_checks.CASES:
        content, comments = gpu_checks.draft_case(spec, known)
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
        gpu_checks.write_case_yaml(path, content, ["a comment " * 20, *comments])
        assert yaml.safe_load(path.read_text()) == content
        assert all(len(line) <= 100 for line in path.read_text().splitlines() if line.startswith("#"))


def test_drafted_source_lines_point_at_the_lines_that_wait(gpu_checks):
    spec = next(s for s in gpu_checks.CASES if s.name == "gpu_host_sync")
    content, _ = gpu_checks.draft_case(spec, {"sync-memcpy-stall", "dataloader-starvation"})
    lines = (REPO / "examples" / "host_sync.py").read_text().splitlines()
    pointed = [int(e["source_line"].rsplit(":", 1)[1]) for e in content["expect"]]
    assert [lines[n - 1].split("#")[0].strip() for n in pointed] == [
        "running_loss += loss.item()",
        "predictions = logits.argmax(dim=1).cpu()",
        "correct += int((predictions == batch_labels.cpu()).sum())",
    ]
    pageable = next(s for s in gpu_checks.CASES if s.name == "gpu_pageable_copies")
    content, _ = gpu_checks.draft_case(pageable, {"sync-memcpy-stall", "dataloader-starvation"})
    copy_lines = (REPO / "examples" / "pageable_copies.py").read_text().splitlines()
    pointed = [int(e["source_line"].rsplit(":", 1)[1]) for e in content["expect"] if "source_line" in e]
    assert [copy_lines[n - 1].split("#")[0].strip() for n in pointed] == [
        "images = images.to(device)", "labels = labels.to(device)"]


def test_evaluate_case_checks_a_recorded_case_as_the_case_tests_do(gpu_checks):
    from advisor.importers import load

    folder = REPO / "cases" / "cpu_host_sync"
    session = load(folder / "session")
    spec = yaml.safe_load((folder / "case.yaml").read_text())
    fired, problems = gpu_checks.evaluate_case(session, spec)
    assert "sync-memcpy-stall" in fired and problems == []
    wrong = {"must": ["dataloader-starvation"], "must_not": ["sync-memcpy-stall"], "expect": [
        {"table": "model", "row": "Dataloader", "column": "cpu_ratio", "at_least": 0.9, "why": "."},
        {"finding": "sync-memcpy-stall", "source_line": "examples/host_sync.py:1", "why": "."}]}
    _, problems = gpu_checks.evaluate_case(session, wrong)
    assert len(problems) == 4, problems


def test_the_bundle_holds_the_reports_and_the_drafted_cases(gpu_checks, tmp_path):
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("[]")
    (out / "torch_profiler_trace.json").write_text("{}")
    bundle = tmp_path / "b" / "gpu_checks.tar.gz"
    gpu_checks.write_bundle(bundle, out, ["cpu_host_sync"])
    with tarfile.open(bundle) as archive:
        names = set(archive.getnames())
    assert "gpu_checks/results.json" in names and "gpu_checks/torch_profiler_trace.json" not in names
    assert {"cases/cpu_host_sync/case.yaml", "cases/cpu_host_sync/session/session.json"} <= names


# -- gpu_checks: the command ---------------------------------------------------------------------------------


def test_gpu_checks_arguments(gpu_checks):
    parser = gpu_checks.build_parser()
    args = parser.parse_args(["--only", "kernels,cases", "--steps", "3:9"])
    assert args.only == ["kernels", "cases"] and args.steps == (3, 9)
    assert parser.parse_args([]).only == list(gpu_checks.CHECKS)
    for bad in (["--only", "kernels,nope"], ["--steps", "0:4"], ["--steps", "5:5"], ["--steps", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    ctx = gpu_checks.Context(out=Path("/tmp/x"), window=(2, 7))
    assert ctx.loop_args() == ["loop", "--device", "cuda", "--steps", "9"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the checks would run")
def test_gpu_checks_says_in_one_line_why_it_cannot_run_here(gpu_checks, capsys):
    assert gpu_checks.main(["--only", "records"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_checks: ") and "--dry-run" in lines[0], captured.err
    assert "CUDA" in lines[0] and captured.out == ""


def test_gpu_checks_dry_run_lists_what_it_would_run(gpu_checks, capsys):
    assert gpu_checks.main(["--dry-run", "--only", "attribution,kernels,records,cases"]) == 0
    out = capsys.readouterr().out
    assert "collector_overhead.py loop --device cuda --steps 9 --torch-profiler 2:7" in out
    assert "_child collect" in out and "_child records" in out
    assert "-m advisor diagnose --save cases/gpu_odd_gemm/session" in out


# -- collector_overhead ---------------------------------------------------------------------------------------


def test_collector_overhead_runs_its_cpu_rows(example_runs):
    done = example_runs[OVERHEAD]
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {row["name"]: row for row in json.loads(done.json_path.read_text())["rows"]}
    assert set(rows) == {"plain", "host", "torch.profiler", "cupti"}
    for name in ("plain", "host"):
        assert len(rows[name]["step_s"]) == 2 and rows[name]["median_s"] > 0 and not rows[name]["failed"]
    assert rows["host"]["after_s"]  # advisor's rows say what the work after the run cost
    for name in ("torch.profiler", "cupti"):
        assert rows[name]["step_s"] == [] and "needs a CUDA GPU" in rows[name]["note"]
    assert "x plain" in done.stdout and "needs a CUDA GPU" in done.stdout


def test_collector_overhead_window_is_checked():
    import argparse

    module = load_module(BENCHMARKS / "collector_overhead.py")
    assert module.parse_window("3:23") == (3, 23)
    for bad in ("0:5", "5:5", "5", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError):
            module.parse_window(bad)
