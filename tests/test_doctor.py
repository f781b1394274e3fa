"""`advisor doctor`: the machine checks, the GPU checks' pure parts, and the command.

Without a GPU (developers' machines and CI) the GPU rows skip with their reason, the GPU
checks refuse in one line, and their dry run lists what they would run; the GPU paths of
the machine checks run against stand-ins for torch and cupti-python. The comparisons the
GPU checks make (kernel times, attribution, clocks, record fields) are pure functions of
sessions and records, checked here on hand-made ones and on the replayed CUPTI stream.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from advisor.cli import main
from advisor.doctor import children, gpu_checks, machine
from advisor.session import CollectorInfo, Session, SessionMeta, conform_events

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


# -- comparing sessions ----------------------------------------------------------------------


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


def test_identical_sessions_agree():
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(BIG)), session_of(kernels(BIG)))
    assert comparison.ok
    assert comparison.offenders.empty
    assert comparison.advisor_total_ns == comparison.reference_total_ns == 80_000 + 40_000 + 24_000 + 100
    assert comparison.rows.loc["gemm", "advisor_calls"] == 2
    assert set(comparison.rows.index[comparison.rows["checked"]]) == {"gemm", "relu", "bn"}  # tiny is < 1%


def test_a_kernel_off_by_more_than_the_tolerance_is_an_offender():
    slower = dict(BIG, relu=[10_800] * 4)  # +8%
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(slower)), session_of(kernels(BIG)))
    assert not comparison.ok
    assert list(comparison.offenders.index) == ["relu"]
    assert comparison.offenders.loc["relu", "rel_diff"] == pytest.approx(0.08)
    assert any("relu" in line and "+8.0%" in line for line in comparison.lines())


def test_within_tolerance_and_small_kernels_pass():
    close = dict(BIG, gemm=[40_600, 40_600], tiny=[300])  # +1.5%; tiny triples but is < 1% of the time
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(close)), session_of(kernels(BIG)))
    assert comparison.ok
    assert comparison.rows.loc["tiny", "rel_diff"] == pytest.approx(2.0)
    assert not comparison.rows.loc["tiny", "checked"]


def test_a_kernel_on_one_side_only_is_an_offender():
    renamed = {("gemm_v2" if k == "gemm" else k): v for k, v in BIG.items()}
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(renamed)), session_of(kernels(BIG)))
    assert set(comparison.offenders.index) == {"gemm", "gemm_v2"}
    assert comparison.rows.loc["gemm_v2", "rel_diff"] == np.inf
    assert comparison.rows.loc["gemm", "rel_diff"] == -1.0
    text = "\n".join(comparison.lines())
    assert "advisor only" in text and "torch only" in text


def test_the_comparison_reads_only_the_steps_asked_for():
    mine = kernels(BIG) + kernels({"gemm": [900_000]}, step=9)  # a later step the reference lacks
    comparison = gpu_checks.compare_kernel_times(session_of(mine), session_of(kernels(BIG)), steps=range(2, 7))
    assert comparison.ok
    assert not gpu_checks.compare_kernel_times(session_of(mine), session_of(kernels(BIG))).ok


def test_a_kernel_as_noisy_in_the_reference_as_against_advisor_is_within():
    """The A/A run: a kernel whose two reference runs differ by 5% may differ from advisor
    by up to twice that; a steady one is held to 2%."""
    noisy = dict(BIG, relu=[10_800] * 4)  # +8% against the reference
    twin = dict(BIG, relu=[10_500] * 4)  # the reference's own second run: +5%
    spread = gpu_checks.aa_spread(session_of(kernels(BIG)), session_of(kernels(twin)))
    assert spread["relu"] == pytest.approx(0.05) and spread["gemm"] == 0
    comparison = gpu_checks.compare_kernel_times(session_of(kernels(noisy)), session_of(kernels(BIG)), spread=spread)
    assert comparison.ok and comparison.rows.loc["relu", "tolerance"] == pytest.approx(0.10)
    steady_off = dict(BIG, gemm=[41_200, 41_200])  # +3% on a kernel with no spread
    assert not gpu_checks.compare_kernel_times(session_of(kernels(steady_off)), session_of(kernels(BIG)),
                                               spread=spread).ok


def test_names_calls_per_step_and_grid_block_must_be_exact():
    def shaped(spec, grid="[1, 1, 1]", steps=(2, 3)):
        rows = []
        for step in steps:
            for row in kernels(spec, step=step):
                rows.append({**row, "grid": grid, "block": "[128, 1, 1]"})
        return session_of(rows)

    same = gpu_checks.compare_kernel_shapes(shaped(BIG), shaped(BIG), steps=[2, 3])
    assert same == []
    extra_call = dict(BIG, relu=[10_000] * 5)
    said = gpu_checks.compare_kernel_shapes(shaped(extra_call), shaped(BIG), steps=[2, 3])
    assert said == ["relu: 5 calls a step, torch.profiler 4"]
    other_grid = gpu_checks.compare_kernel_shapes(shaped(BIG, grid="[2, 1, 1]"), shaped(BIG), steps=[2, 3])
    assert len(other_grid) == len(BIG) and all("grid/block" in line for line in other_grid)
    renamed = {("gemm_v2" if k == "gemm" else k): v for k, v in BIG.items()}
    said = gpu_checks.compare_kernel_shapes(shaped(renamed), shaped(BIG), steps=[2, 3])
    assert said == ["only advisor records gemm_v2", "only torch.profiler records gemm"]


def test_a_note_that_no_step_ran_contradicts_recorded_steps():
    from advisor.session import TimedStep

    session = session_of(kernels(BIG))
    session.meta.timed_steps = [TimedStep(step=2, start_ns=0, duration_ns=10, recorded=True)]
    session.meta.collector.notes = ["steps 2:7 were asked for; steps 2 were recorded",
                                    "no step in 2:7 ran, so the GPU was not recorded; --steps all records the whole run"]
    assert gpu_checks.notes_against_steps(session) == [session.meta.collector.notes[1]]
    session.meta.collector.notes = session.meta.collector.notes[:1]
    assert gpu_checks.notes_against_steps(session) == []


def test_no_kernels_is_no_agreement():
    assert not gpu_checks.compare_kernel_times(session_of([]), session_of(kernels(BIG))).ok


def test_attribution_shares():
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


def test_clock_consistency_counts_work_before_its_launch_and_calls_outside_their_op():
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


# -- the record check, on the recorded stream tests/test_cupti.py replays --------------------


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


def test_field_report_finds_every_field_advisor_reads_on_cupti_pythons_records():
    records = recorded_records()
    types: dict = {}
    children.note_record_types(records, types)
    assert sum(entry["count"] for entry in types.values()) == len(records)
    assert {"CONCURRENT_KERNEL/ActivityKernel9", "MEMCPY/ActivityMemcpy6", "RUNTIME/ActivityAPI",
            "EXTERNAL_CORRELATION/ActivityExternalCorrelation"} <= set(types)
    for key, entry in types.items():
        assert entry["missing"] == [], key
    assert types["MEMCPY/ActivityMemcpy6"]["renamed"] == {"flags": "flags_"}


def test_field_report_names_a_missing_field():
    copy = next(r for r in recorded_records() if type(r).__name__ == "ActivityMemcpy6")
    del copy.bytes
    key, entry = children.field_report(copy)
    assert key == "MEMCPY/ActivityMemcpy6" and entry["missing"] == ["bytes"]
    assert children.field_report(object()) is None


# -- the machine checks ---------------------------------------------------------------------------------


def rows_by_name(rows):
    return {row.name: row for row in rows}


def test_every_check_answers_and_a_skip_says_why():
    rows = machine.check_machine(start_collector=False)
    assert [r.name for r in rows] == ["advisor", "torch", "host", "driver", "gpu", "cupti-python", "cupti-free",
                                      "calibration"]
    for row in rows:
        assert row.status in machine.STATUSES, row
        assert row.summary.strip(), row
    assert rows_by_name(rows)["advisor"].status == "ok"


def test_driver_version_from_proc_and_from_nothing(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
                    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert machine.driver_version(proc, smi=None) == ("550.54.15", str(proc))
    open_kernel = tmp_path / "open"
    open_kernel.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n")
    assert machine.driver_version(open_kernel, smi=None)[0] == "570.86.15"
    version, why = machine.driver_version(tmp_path / "absent", smi=None)
    assert version is None and "no NVIDIA driver found" in why


class _Props(SimpleNamespace):
    pass


def stand_in_torch(cuda: str | None = "12.4", devices: int = 1, name: str = "NVIDIA H100 80GB HBM3",
                   capability: tuple[int, int] = (9, 0), sms: int = 132):
    """What machine.py asks of torch, and nothing more."""
    props = _Props(name=name, major=capability[0], minor=capability[1], multi_processor_count=sms,
                   total_memory=80 * 2**30)
    cuda_module = SimpleNamespace(is_available=lambda: devices > 0, device_count=lambda: devices,
                                  get_device_properties=lambda index: props)
    profiler = SimpleNamespace(supported_activities=lambda: [SimpleNamespace(name="CPU"), SimpleNamespace(name="CUDA")])
    return SimpleNamespace(__version__="2.6.0+cu124", version=SimpleNamespace(cuda=cuda), cuda=cuda_module,
                           profiler=profiler)


@pytest.fixture
def gpu_machine(monkeypatch, tmp_path):
    """A machine with one H100, its driver and a CUDA 12.4 torch; cupti-python as each test sets it."""
    from advisor.collect import cupti, torch_hooks

    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Release Build\n")
    monkeypatch.setattr(machine, "PROC_DRIVER", proc)
    monkeypatch.setattr(torch_hooks, "import_torch", lambda: (stand_in_torch(), None))
    for name in machine.INJECTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    state = SimpleNamespace(version="12.8.0", api=object(), why=None)
    monkeypatch.setattr(cupti, "cupti_python_version", lambda: state.version)
    monkeypatch.setattr(cupti, "import_cupti", lambda: (state.api, state.why))
    return state


def test_a_ready_gpu_machine_can_collect_the_gpu(gpu_machine):
    rows = rows_by_name(machine.check_machine(start_collector=False))
    assert rows["driver"].status == "ok" and "550.54.15" in rows["driver"].summary
    assert rows["gpu"].status == "ok" and "H100" in rows["gpu"].summary and "132 SMs" in rows["gpu"].summary
    assert rows["cupti-python"].status == "ok" and "12.8.0" in rows["cupti-python"].summary
    assert rows["cupti-free"].status == "skip" and "not asked" in rows["cupti-free"].summary


def test_cupti_python_of_another_cuda_major_fails_with_the_install_line(gpu_machine):
    gpu_machine.version = "13.0.1"
    rows = machine.check_machine(start_collector=False)
    row = rows_by_name(rows)["cupti-python"]
    assert row.status == "fail" and "CUDA 13" in row.summary and "12.4" in row.summary
    assert row.hint == "pip install 'cupti-python==12.4.*'"
    result = machine.verdict(rows)
    assert result.host and not result.gpu and "cupti-python 13.0.1" in result.gpu_line


def test_missing_cupti_python_fails_and_says_what_to_install(gpu_machine):
    gpu_machine.api, gpu_machine.why, gpu_machine.version = None, "cupti-python is not installed: pip ...", None
    row = rows_by_name(machine.check_machine(start_collector=False))["cupti-python"]
    assert row.status == "fail" and "not installed" in row.summary and row.hint.startswith("pip install")


def test_a_tool_injected_into_cuda_holds_cupti(gpu_machine, monkeypatch):
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/opt/nsight-systems/libToolsInjection64.so")
    row = rows_by_name(machine.check_machine(start_collector=True))["cupti-free"]
    assert row.status == "fail" and "libToolsInjection64" in row.summary


def test_a_gpu_the_knowledge_base_lacks_is_a_warning(gpu_machine, monkeypatch):
    from advisor.collect import torch_hooks

    monkeypatch.setattr(torch_hooks, "import_torch", lambda: (stand_in_torch(name="Quantum GX 9000", capability=(12, 7), sms=7), None))
    rows = machine.check_machine(start_collector=False)
    row = rows_by_name(rows)["gpu"]
    assert row.status == "warn" and "Quantum GX 9000" in row.summary and "--gpu" in row.hint
    assert machine.verdict(rows).gpu  # a warning does not stop collection


def test_without_torch_traces_are_still_read(monkeypatch):
    from advisor.collect import torch_hooks

    monkeypatch.setattr(torch_hooks, "import_torch", lambda: (None, "ModuleNotFoundError: No module named 'torch'"))
    rows = machine.check_machine(start_collector=False)
    by_name = rows_by_name(rows)
    assert by_name["torch"].status == "warn" and by_name["host"].status == "skip"
    assert all(by_name[n].status == "skip" for n in ("gpu", "cupti-python", "cupti-free"))
    result = machine.verdict(rows)
    assert not result.host and not result.gpu and "traces are still read" in result.host_line


# -- the command ---------------------------------------------------------------------------------------


torch = pytest.importorskip("torch")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the GPU rows would run")


@no_cuda
def test_doctor_on_a_cpu_machine_says_what_it_could_not_check(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[SKIP] gpu" in out and "CPU build" in out
    assert "Host: scripts are profiled on the host" in out and "GPU:  the GPU is not recorded here" in out


@no_cuda
def test_doctor_json_is_data(capsys):
    assert main(["doctor", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["can_collect"] == {"host": True, "gpu": False}
    assert {c["name"] for c in data["checks"]} >= {"torch", "gpu", "cupti-python"}


@no_cuda
def test_gpu_checks_say_in_one_line_why_they_cannot_run_here(capsys):
    assert main(["doctor", "--gpu-checks", "--only", "records"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("advisor: the GPU checks cannot run here: ") and "--dry-run" in err[0]


def test_gpu_checks_dry_run_lists_what_they_would_run(capsys):
    assert main(["doctor", "--gpu-checks", "--dry-run", "--only", "attribution,kernels,records"]) == 0
    out = capsys.readouterr().out
    busy = f"--device cuda --steps 9 --batch-size {gpu_checks.BUSY_BATCH}"
    assert f"-m advisor.doctor.loop {busy} --torch-profiler 2:7" in out
    assert out.count("--torch-profiler 2:7") == 2, "the reference and its A/A twin"
    assert "-m advisor.doctor.children collect" in out and f"advisor/doctor/loop.py {busy}" in out
    assert "-m advisor.doctor.children records" in out


@pytest.mark.parametrize("argv, words", [
    (["doctor", "--gpu-checks", "--only", "kernels,nope"], "unknown checks"),
    (["doctor", "--only", "kernels"], "go with --gpu-checks"),
    (["doctor", "--gpu-checks", "--steps", "0:4"], "1 <= A < B"),
])
def test_bad_doctor_options_are_one_line(argv, words, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors leave through SystemExit
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_the_loop_context_asks_for_steps_past_the_window():
    ctx = gpu_checks.Context(out=Path("/tmp/x"), window=(2, 7))
    assert ctx.loop_args() == ["--device", "cuda", "--steps", "9", "--batch-size", str(gpu_checks.BUSY_BATCH)]


def test_the_bundle_holds_the_reports_and_the_reference_trace_gzipped(tmp_path):
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("[]")
    (out / "torch_profiler_trace.json").write_text("{}")
    (out / "torch_profiler_trace_aa.json").write_text("{}")
    gpu_checks.keep_gzipped(out / "torch_profiler_trace.json")
    bundle = tmp_path / "b" / "doctor.tar.gz"
    gpu_checks.write_bundle(bundle, out, {"cases/cpu_host_sync": REPO / "cases" / "cpu_host_sync"})
    with tarfile.open(bundle) as archive:
        names = set(archive.getnames())
    assert "doctor/results.json" in names and "doctor/torch_profiler_trace.json" not in names
    assert "doctor/torch_profiler_trace.json.gz" in names and "doctor/torch_profiler_trace_aa.json" not in names
    assert "cases/cpu_host_sync/case.yaml" in names


def test_the_gpu_session_entry_point_dry_runs_both_parts():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_checks.py"), "--dry-run",
                           "--only", "records"], check=False, capture_output=True, text=True, cwd=REPO, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "-m advisor.doctor.children records" in done.stdout
    assert "-m advisor diagnose --save cases/gpu_odd_gemm/session" in done.stdout
