"""cpu-dtype-speed: a dtype weighed against the CPU's flags (bf16 autocast on a CPU without
bf16 units is many times slower than fp32; fp32 on a CPU with AMX leaves bf16's speed),
and the trial that measures the other way (``advisor verify``'s fp32 fix)."""

from __future__ import annotations

import pytest

from advisor.diagnosis import diagnose
from tests.builders import Trace

AVX2 = {"flags": ["avx", "avx2", "fma"], "known": True}
AMX = {"flags": ["avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"], "known": True}
BF16 = '["c10::BFloat16","c10::BFloat16","c10::BFloat16"]'
FP32 = '["float","float","float"]'


def _training(features: dict | None, *, half: bool, fp32_probe: bool = False, peaks: dict | None = None):
    """Four 100 ms steps: each a 60 ms linear (bf16 under autocast, or fp32) with its casts,
    and, with ``fp32_probe``, a 2 ms fp32 matmul of a known size (the run's own fp32 rate)."""
    t = Trace()
    types = BF16 if half else FP32
    for n in range(4):
        base = n * 100.0
        t.step(n, base, base + 100)
        t.phase("Forward", base, base + 70)
        outer = t.op("aten::linear", base + 1, base + 66, input_dims="[[512,1024],[1024,1024],[1024]]",
                     input_types=FP32)
        if half:
            t.op("aten::_to_copy", base + 1, base + 5, parent=outer, input_dims="[[1024,1024],[],[],[],[],[],[]]",
                 input_types='["float","Scalar","","","","Scalar",""]',
                 concrete_inputs='["","15","","","","False",""]')  # 15: torch.bfloat16
            t.op("aten::linear", base + 5, base + 65, parent=outer,
                 input_dims="[[512,1024],[1024,1024],[1024]]", input_types=types)
        if fp32_probe:
            t.op("aten::mm", base + 67, base + 69, input_dims="[[512,1024],[1024,1024]]",
                 input_types='["float","float"]')
    session = t.session(gpu_measured=False)
    cpu = session.meta.devices[0]
    if features is not None:
        cpu.properties["cpu_features"] = features
    if peaks:
        cpu.peak_flops = dict(peaks)
        cpu.memory_bandwidth_gbps = 20.0
    return session


def _finding(session):
    return next((f for f in diagnose(session).findings if f.rule == "cpu-dtype-speed"), None)


def test_bf16_autocast_on_a_cpu_without_bf16_units_is_named_with_the_runs_own_fp32_rate():
    # The fp32 probe: 2*512*1024*1024 FLOPs in 2 ms (~537 GFLOP/s); the bf16 linear does the
    # same FLOPs plus bias in 60 ms: fp32 would take ~2 ms of it.
    found = _finding(_training(AVX2, half=True, fp32_probe=True))
    assert found is not None
    assert "without native bf16" in found.message and "avx2" in found.message
    assert "this run's own fp32 matrix ops" in found.message
    assert 55 <= found.saving.ms_per_step <= 66, found.saving  # 60 ms less ~2 ms, plus 4 ms of casts
    assert "drop torch.autocast" in found.recommendation
    assert found.metrics["half_without_native"] == ["bf16"]


def test_without_any_rate_the_saving_is_a_floor_and_says_so():
    found = _finding(_training(AVX2, half=True))
    assert found is not None and "an assumed 2x" in found.message
    assert found.saving.ms_per_step == pytest.approx(30 + 4, abs=1)  # half the 60 ms, and the casts


def test_the_collectors_probe_sizes_it_where_nothing_was_calibrated():
    session = _training(AVX2, half=True)
    session.meta.devices[0].properties["bf16_vs_fp32"] = 0.1  # bf16 matmuls at a tenth of fp32's rate
    found = _finding(session)
    assert found is not None and "a matmul probe on this CPU" in found.message
    assert found.saving.ms_per_step == pytest.approx(60 * 0.9 + 4, abs=1)


def test_the_probe_says_how_bf16_fares_against_fp32_here():
    torch = pytest.importorskip("torch")
    from advisor.knowledge.cpu import probe_bf16_ratio

    threads = torch.get_num_threads()
    ratio = probe_bf16_ratio(torch)
    assert ratio is not None and ratio > 0
    assert torch.get_num_threads() == threads, "the script's thread setting is left as it was"


def test_the_same_autocast_on_a_cpu_with_bf16_units_is_not_a_finding():
    assert _finding(_training(AMX, half=True, fp32_probe=True)) is None


def test_a_trace_whose_cpu_flags_are_unknown_is_not_judged():
    assert _finding(_training(None, half=True, fp32_probe=True)) is None


def test_fp32_on_an_amx_cpu_is_named_where_calibration_measured_bf16_faster():
    found = _finding(_training(AMX, half=False, peaks={"fp32": 1e12, "bf16": 4e12}))
    assert found is not None and "calibrated matmul peaks" in found.message
    assert found.metrics["fp32_with_bf16_units"] and "torch.autocast(\"cpu\", dtype=torch.bfloat16)" in \
        found.recommendation
    # 65 ms a step for a linear of 1.07 GFLOP on a CPU calibrated at 1 TFLOP/s: a kernel that
    # slow is held up by something bf16 does not change, so only the 10.7 ms the FLOPs take at
    # a tenth of the rate counts, 4x faster in bf16, less autocast's 30 us casts.
    flops = 2 * 512 * 1024 * 1024
    assert found.saving.ms_per_step == pytest.approx(flops / 1e11 * 1e3 * 0.75 - 0.03, rel=0.05)


def test_matrix_calls_too_small_to_have_arithmetic_get_no_bf16_advice():
    # A 32-wide layer: on a CPU with AMX, autocast made such a model's step 2-3x slower
    # (its casts cost more than its matmuls); 1,024 calls of 64 kFLOP, 40 us each as recorded.
    t = Trace()
    for n in range(4):
        base = n * 100.0
        t.step(n, base, base + 100)
        t.phase("Forward", base, base + 90)
        for k in range(256):
            t.op("aten::addmm", base + 1 + k * 0.3, base + 1.04 + k * 0.3,
                 input_dims="[[32],[32,32],[32,32]]", input_types=FP32)
    session = t.session(gpu_measured=False)
    cpu = session.meta.devices[0]
    cpu.properties.update({"cpu_features": AMX, "bf16_vs_fp32": 3.5, "autocast_ns_per_matrix_call": 8000.0,
                           "fp32_matmul_flops": 8e10, "torch_threads": 1})
    assert _finding(session) is None


def test_fp32_on_an_amx_cpu_where_calibration_found_bf16_no_faster_is_not_a_finding():
    assert _finding(_training(AMX, half=False, peaks={"fp32": 1e12, "bf16": 0.9e12})) is None


def test_the_fp32_trial_switches_cpu_autocast_off_whatever_way_the_script_opens_it():
    torch = pytest.importorskip("torch")
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from advisor.verify.fixes import apply_fixes\n"
        "apply_fixes(torch, [{'name': 'fp32'}])\n"
        "x = torch.randn(4, 4)\n"
        "with torch.autocast('cpu', dtype=torch.bfloat16): a = (x @ x).dtype\n"
        "with torch.autocast('cpu', torch.bfloat16, True): b = (x @ x).dtype\n"
        "print(a, b)\n"
    )
    # In a process of its own: the fix lasts for the process, as in a trial.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["torch.float32", "torch.float32"]
    assert torch is not None
