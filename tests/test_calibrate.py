"""Calibration: measuring this machine, storing it where the user's config lives, and
reading it back. Runs use tiny sizes and budgets; timings are never asserted, only that
measured figures are positive and survive the round trip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from advisor.errors import AdvisorError, UsageError
from advisor.knowledge.calibrate import (
    Calibration,
    CalibrationError,
    DeviceCalibration,
    calibrate,
    calibration_path,
    format_calibration,
    load_calibration,
    save_calibration,
)

torch = pytest.importorskip("torch", reason="calibration runs torch.matmul")

TINY = {"seconds": 0.3, "sizes": (32, 64), "array_bytes": 1 << 20}


@pytest.fixture
def stored(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("ADVISOR_CALIBRATION", str(path))
    return path


def test_a_cpu_calibration_measures_stores_and_loads(stored):
    calibration = calibrate("cpu", **TINY)
    cpu = calibration.device("cpu")
    assert cpu is not None and cpu.kind == "cpu" and cpu.skipped is None
    assert cpu.matmul_flops["fp32"] > 0 and cpu.matmul_size["fp32"] in (32, 64)
    assert cpu.copy_bandwidth > 0 and cpu.triad_bandwidth > 0
    assert cpu.memory_bandwidth == max(cpu.copy_bandwidth, cpu.triad_bandwidth)
    assert cpu.array_bytes == 1 << 20 and cpu.threads == torch.get_num_threads()
    assert cpu.peak_flops("float32") == cpu.matmul_flops["fp32"]

    assert save_calibration(calibration) == stored
    loaded = load_calibration()
    assert loaded == Calibration.model_validate_json(stored.read_text())
    assert loaded.device("cpu").matmul_flops == cpu.matmul_flops
    assert loaded.format == "advisor-calibration/1"


def test_sizes_that_would_not_fit_the_budget_are_skipped_with_a_note():
    cpu = calibrate("cpu", seconds=0.05, sizes=(16, 4096), array_bytes=1 << 20).device("cpu")
    assert cpu.matmul_size["fp32"] == 16
    assert any("n=4096 skipped" in note for note in cpu.notes)


def test_cuda_is_measured_only_where_there_is_a_gpu():
    entry = calibrate("cuda", **TINY).devices[0]
    if torch.cuda.is_available():
        assert entry.skipped is None and entry.matmul_flops
    else:
        assert entry.kind == "gpu" and "torch.cuda.is_available() is False" in entry.skipped
        assert not entry.matmul_flops and entry.memory_bandwidth is None


def test_the_gpu_branch_measures_every_tensor_core_dtype_and_compares_with_the_datasheet(monkeypatch):
    # No GPU here: stand in for one whose kernels run on the CPU, to check what the GPU
    # branch measures and records (the timings themselves mean nothing).
    import advisor.knowledge.calibrate as calibrate_module

    fake = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "get_device_name": lambda index=0: "NVIDIA A100-SXM4-80GB",
        "get_device_capability": lambda index=0: (8, 0), "is_bf16_supported": lambda: True,
        "mem_get_info": lambda index=0: (80 << 30, 80 << 30), "synchronize": lambda device=None: None,
    }
    for name, stand_in in fake.items():
        monkeypatch.setattr(torch.cuda, name, stand_in)
    monkeypatch.setattr(calibrate_module, "_torch_device", lambda torch_, key: torch_.device("cpu"))
    entry = calibrate("cuda", **TINY).devices[0]
    assert (entry.key, entry.kind, entry.name, entry.skipped) == ("cuda:0", "gpu", "NVIDIA A100-SXM4-80GB", None)
    assert set(entry.matmul_flops) == {"fp32", "tf32", "fp16", "bf16"}
    assert entry.memory_bandwidth > 0 and entry.array_bytes == 1 << 20
    assert any("of the a100-sxm4-80gb datasheet peak" in note for note in entry.notes)
    assert any("datasheet bandwidth" in note for note in entry.notes)


def test_all_measures_the_cpu_and_enters_every_gpu():
    calibration = calibrate("all", **TINY)
    assert calibration.devices[0].key == "cpu" and calibration.device("cpu")
    assert len(calibration.devices) >= 2
    assert calibration.machine["logical_cores"]


def test_the_tf32_switch_is_restored_after_a_measurement():
    from advisor.knowledge.calibrate import _tf32

    matmul = torch.backends.cuda.matmul
    attribute = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, attribute)
    with _tf32(torch, True):
        assert getattr(matmul, attribute) in ("tf32", True)
    with _tf32(torch, False):
        assert getattr(matmul, attribute) in ("ieee", False)
    assert getattr(matmul, attribute) == before
    with _tf32(torch, None):  # CPU runs leave the switch alone
        assert getattr(matmul, attribute) == before


@pytest.mark.parametrize("device", ["tpu", "cuda:x", ""])
def test_an_unknown_device_is_a_usage_error(device):
    with pytest.raises(UsageError, match="unknown device"):
        calibrate(device, **TINY)


def test_without_torch_calibration_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(CalibrationError, match="needs PyTorch"):
        calibrate("cpu", **TINY)


# -- where it is kept ---------------------------------------------------------------------------


def test_the_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ADVISOR_CALIBRATION", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert calibration_path() == tmp_path / "xdg" / "advisor" / "calibration.json"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert calibration_path() == tmp_path / "home" / ".config" / "advisor" / "calibration.json"
    monkeypatch.setenv("ADVISOR_CALIBRATION", str(tmp_path / "mine.json"))
    assert calibration_path() == tmp_path / "mine.json"


def _entry(key: str, flops: float | None = None, skipped: str | None = None) -> DeviceCalibration:
    return DeviceCalibration(key=key, kind="cpu" if key == "cpu" else "gpu", measured="2024-01-01T00:00:00+00:00",
                             matmul_flops={"fp32": flops} if flops else {}, skipped=skipped)


def test_saving_merges_by_device_and_never_loses_a_measurement(stored):
    save_calibration(Calibration(devices=[_entry("cpu", 1e11), _entry("cuda:0", 5e13)]))
    save_calibration(Calibration(devices=[_entry("cpu", 2e11), _entry("cuda:0", skipped="no CUDA device")]))
    loaded = load_calibration()
    assert loaded.device("cpu").matmul_flops["fp32"] == 2e11  # the newer measurement
    assert loaded.device("cuda").matmul_flops["fp32"] == 5e13  # a skip does not erase it
    assert [d.key for d in loaded.devices] == ["cpu", "cuda:0"]
    assert not list(stored.parent.glob("*.partial"))


def test_saving_creates_the_folder(tmp_path):
    target = tmp_path / "new" / "folder" / "calibration.json"
    assert save_calibration(Calibration(devices=[_entry("cpu", 1e11)]), target) == target
    assert load_calibration(target).device("cpu")


def test_no_file_means_no_calibration(stored):
    assert load_calibration() is None


@pytest.mark.parametrize("content", ["{not json", '{"format": "something-else/9"}', '{"devices": [{"key": 1}]}'])
def test_a_damaged_file_is_one_clear_line_and_calibrating_again_replaces_it(stored, content):
    stored.write_text(content)
    with pytest.raises(CalibrationError) as raised:
        load_calibration()
    message = str(raised.value)
    assert str(stored) in message and "advisor calibrate" in message and "\n" not in message
    assert isinstance(raised.value, AdvisorError)
    save_calibration(Calibration(devices=[_entry("cpu", 1e11)]))
    assert load_calibration().device("cpu").matmul_flops["fp32"] == 1e11


def test_the_summary_has_a_line_per_device():
    calibration = Calibration(devices=[
        DeviceCalibration(key="cpu", kind="cpu", name="Test CPU", measured="x", threads=2,
                          matmul_flops={"fp32": 1.5e11}, matmul_size={"fp32": 1024},
                          memory_bandwidth=2e10, copy_bandwidth=2e10, triad_bandwidth=1.8e10, seconds=7.5),
        _entry("cuda", skipped="no CUDA device: torch.cuda.is_available() is False"),
    ])
    text = format_calibration(calibration, Path("/tmp/c.json"))
    lines = text.splitlines()
    assert lines[0] == ("cpu (Test CPU, 2 threads): matmul fp32 150 GFLOP/s (n=1024); "
                        "memory 20.0 GB/s (copy 20.0 GB/s, triad 18.0 GB/s); 7.5 s")
    assert lines[1] == "cuda: skipped: no CUDA device: torch.cuda.is_available() is False"
    assert lines[-1] == "stored in /tmp/c.json"


# -- whose peaks, and whether to believe them ----------------------------------------------------


def _host_with(stored: Path, flops: float, **machine) -> tuple:
    from advisor.collect.assemble import host_device
    from advisor.knowledge.cpu import this_processor

    import os

    facts = {"processor": this_processor(), "logical_cores": os.cpu_count(), "load_per_core": 0.1, **machine}
    save_calibration(Calibration(machine=facts, devices=[
        DeviceCalibration(key="cpu", kind="cpu", measured="2026-11-20T09:30:00+00:00",
                          matmul_flops={"fp32": flops}, memory_bandwidth=2e10)]))
    notes: list[str] = []
    return host_device(notes), notes


def test_the_report_says_whose_calibration_it_uses_and_when(stored, monkeypatch):
    from advisor.knowledge import cpu

    monkeypatch.setattr(cpu, "promised_fp32_flops", lambda features, cores: 1e11)
    device, notes = _host_with(stored, 4e10)
    said = [n for n in notes if str(stored) in n]
    assert device.peak_flops == {"fp32": 4e10}
    assert said and "measured 2026-11-20 09:30:00 UTC on this machine, load 0.1 a core" in said[0]


def test_a_calibration_from_a_busy_machine_is_refused_and_said(stored, monkeypatch):
    """1.05 GFLOP/s of fp32 matmul, from a busy machine, would put every healthy op far
    below its roofline: refused, with the file, the date and the figure."""
    from advisor.knowledge import cpu

    monkeypatch.setattr(cpu, "promised_fp32_flops", lambda features, cores: 1.28e11)
    device, notes = _host_with(stored, 1.05e9, load_per_core=3.5)
    assert device.peak_flops == {}, "the peaks are not used"
    said = next(n for n in notes if str(stored) in n)
    assert "not used" in said and "1.05 GFLOP/s" in said and "load 3.5 a core" in said and "busy" in said


def test_a_calibration_under_load_is_refused_whatever_it_measured(stored, monkeypatch):
    """Under a load of 3 a core the figures are a share of the machine, however plausible
    they look beside the CPU's vector units."""
    from advisor.knowledge import cpu

    monkeypatch.setattr(cpu, "promised_fp32_flops", lambda features, cores: 1e11)
    device, notes = _host_with(stored, 4e10, load_per_core=3.0)
    assert device.peak_flops == {}
    said = next(n for n in notes if str(stored) in n)
    assert "not used" in said and "under load 3.0 a core" in said and "advisor calibrate" in said


def test_a_calibration_with_another_torch_is_refused(stored, monkeypatch):
    from advisor.knowledge import cpu
    from advisor.knowledge.calibrate import load_calibration

    monkeypatch.setattr(cpu, "promised_fp32_flops", lambda features, cores: 1e11)
    _host_with(stored, 4e10)
    calibration = load_calibration()
    entry = calibration.device("cpu").model_copy(update={"torch_version": "1.13.1"})
    save_calibration(calibration.model_copy(update={"devices": [entry]}))
    from advisor.collect.assemble import host_device

    notes: list[str] = []
    device = host_device(notes)
    assert device.peak_flops == {}
    assert any("with torch 1.13.1" in n and "not used" in n for n in notes)


def test_a_session_without_a_calibration_says_when_that_was(stored):
    from advisor.collect.assemble import host_device

    notes: list[str] = []
    host_device(notes)
    assert any("had not measured this machine's peaks when this was recorded" in n for n in notes)


def test_a_calibration_from_another_machine_is_refused(stored):
    device, notes = _host_with(stored, 4e10, processor="Some Other CPU 9000", logical_cores=96)
    assert device.peak_flops == {}
    assert any("on another machine" in n and "Some Other CPU 9000" in n for n in notes)


def test_cpu_flags_decide_native_bf16(tmp_path):
    from advisor.knowledge.cpu import cpu_features, promised_fp32_flops

    epyc = tmp_path / "epyc"
    epyc.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx f16c fma avx2\n")
    sapphire = tmp_path / "spr"
    sapphire.write_text("flags\t\t: avx avx2 fma avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert not cpu_features(epyc).native_bf16 and cpu_features(sapphire).native_bf16 and cpu_features(sapphire).amx
    assert promised_fp32_flops(cpu_features(epyc), 2) == 32 * 2e9 * 2
    assert not cpu_features(tmp_path / "none").known
