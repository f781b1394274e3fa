"""cpu-dtype-speed: matrix work in a dtype this CPU runs slowly, where another would run
faster (Roofline Summary, Device Summary).

A CPU without AVX512-BF16 or AMX has no bf16 (or fp16) matmul of its own: torch converts,
and bf16 autocast there runs many times slower than fp32. A CPU with AMX runs bf16 matmuls
several times faster than fp32. The same autocast is good advice on one machine and bad on
the other, so the rule reads the CPU's flags (the device table) and weighs the dtypes.

Measure: the window's counted matrix ops (gemm, conv, attention) on the CPU by dtype, and
the casts autocast adds (copies to bf16/fp16). How much faster the other dtype is comes
from, in order: this machine's calibrated peaks for both dtypes (``advisor calibrate``,
the device table); the collector's short bf16-against-fp32 matmul probe; for half-precision work, the rate the session's own fp32
matrix ops reached; else a conservative factor from the rule's thresholds. Decide: the
time the other dtype would save is at least ``min_share`` of the step. Word: which dtype,
which flags, where the rate comes from, and the fix; ``advisor verify --try amp`` (or the
fp32 trial) measures it.
"""

from __future__ import annotations

import pandas as pd

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import saving

MATRIX = ("gemm", "conv", "attention")
HALF = ("bf16", "fp16")
CASTS = ("aten::_to_copy", "aten::to", "aten::copy_")
MIN_FP32_FLOPS = 1e6  # a fp32 matrix op this small says little of the CPU's fp32 rate


@register("cpu-dtype-speed")
def check(ctx: RuleContext) -> list[Finding]:
    device = ctx.table("device")
    roofline = ctx.table("roofline")
    if device is None or "cpu" not in device.index or roofline is None or not len(roofline) or ctx.gpu_measured:
        return []
    cpu = device.loc["cpu"]
    if cpu.get("native_bf16") is None or pd.isna(cpu.get("native_bf16")):
        return []  # the CPU's flags were not recorded (a trace from another profiler)
    rows = roofline[roofline["measured_ns"].notna()]
    if "unit" in rows.columns:
        rows = rows[rows["unit"].isin(["cpu", ""]) | rows["unit"].isna()]
    matrix = rows[rows["kind"].isin(MATRIX)]
    if not len(matrix):
        return []
    steps = max(ctx.step_count, 1)
    peaks = _calibrated_peaks(cpu)
    half = matrix[matrix["dtype"].isin(HALF)]
    findings = []
    for dtype in HALF:
        native = bool(cpu.get("native_bf16") if dtype == "bf16" else cpu.get("native_fp16"))
        mine = half[half["dtype"] == dtype]
        if native or not len(mine):
            continue
        finding = _half_without_support(ctx, cpu, rows, matrix, mine, dtype, peaks, steps)
        if finding is not None:
            findings.append(finding)
    if bool(cpu.get("native_bf16")) and not len(half):
        finding = _fp32_with_bf16_units(ctx, cpu, matrix[matrix["dtype"] == "fp32"], peaks, steps)
        if finding is not None:
            findings.append(finding)
    return findings


def _calibrated_peaks(cpu: pd.Series) -> dict[str, float]:
    """dtype -> this CPU's calibrated matmul FLOP/s (the device table's cpu row)."""
    peaks = {}
    for dtype in ("fp32", "bf16", "fp16"):
        value = cpu.get(f"peak_{dtype}_flops_per_s")
        if value is not None and not pd.isna(value) and float(value) > 0:
            peaks[dtype] = float(value)
    return peaks


def _half_without_support(ctx: RuleContext, cpu: pd.Series, rows: pd.DataFrame, matrix: pd.DataFrame,
                          mine: pd.DataFrame, dtype: str, peaks: dict[str, float], steps: int) -> Finding | None:
    took = float(mine["measured_ns"].sum()) / steps
    flops = float(mine["flops"].sum()) / steps
    casts = rows[rows["name"].isin(CASTS) & (rows["dtype"] == dtype)]
    cast_ns = float(casts["measured_ns"].sum()) / steps
    fp32 = matrix[(matrix["dtype"] == "fp32") & (matrix["flops"] >= MIN_FP32_FLOPS * matrix["calls"])]
    probed = _probed(cpu) if dtype == "bf16" else None
    if dtype in peaks and "fp32" in peaks:
        in_fp32 = took * peaks[dtype] / peaks["fp32"]
        source = (f"this CPU's calibrated matmul peaks ({peaks['fp32'] / 1e9:.3g} GFLOP/s in fp32, "
                  f"{peaks[dtype] / 1e9:.3g} in {dtype})")
    elif probed is not None:
        in_fp32 = took * probed
        source = f"a matmul probe on this CPU after the run (bf16 at {probed:.2g}x the fp32 rate)"
    elif len(fp32) and float(fp32["measured_ns"].sum()) > 0 and flops > 0:
        rate = float(fp32["flops"].sum()) / float(fp32["measured_ns"].sum())  # FLOP per ns
        in_fp32 = flops / rate
        source = f"the {rate:.3g} GFLOP/s this run's own fp32 matrix ops reached"
    else:
        in_fp32 = took / ctx.threshold("assumed_half_slowdown")
        source = (f"an assumed {ctx.threshold('assumed_half_slowdown'):g}x (a floor: it is often 10x or more; "
                  "`advisor calibrate` measures it)")
    in_fp32 = min(in_fp32, took)
    saved = took - in_fp32 + cast_ns
    share = saved / ctx.run_step_ns if ctx.run_step_ns > 0 else 0.0
    if share < ctx.threshold("min_share"):
        return None
    top = mine.sort_values("measured_ns", ascending=False).head(3)
    listed = "; ".join(f"{key} ({ms(r['measured_ns'] / steps)} a step)" for key, r in top.iterrows())
    flags = str(cpu.get("cpu_features") or "no recorded flags")
    units = "AVX512-BF16 or AMX" if dtype == "bf16" else "AVX512-FP16 or AMX-FP16"
    message = (f"{len(mine)} matrix op shapes run in {dtype} on a CPU without native {dtype} ({units}; its flags: "
               f"{flags}), so torch converts: they take {ms(took)} a step, {pct(took / ctx.run_step_ns)} of it"
               + (f", and the casts autocast adds {ms(cast_ns)} more" if cast_ns > 0 else "")
               + f". In fp32 they would take about {ms(in_fp32)}, by {source}. The slowest: {listed}.")
    return Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, share),
        confidence=0.8 if dtype in peaks or probed is not None or len(fp32) else 0.5,
        saving=saving(ctx, saved, f"the {dtype} matrix ops at the fp32 rate ({source}), and the casts gone",
                      low_ns=cast_ns + (took - in_fp32) / 2, high_ns=took + cast_ns,
                      remains=f"the same matrix work in fp32: about {ms(in_fp32)} a step"),
        message=message,
        recommendation=(f"Run the matrix work in fp32 on this CPU: drop torch.autocast(\"cpu\", dtype=torch.{_torch(dtype)}) "
                        f"(or pass enabled=False here) and keep {dtype} for machines with {units}; "
                        "`advisor verify` measures it (its trial runs the script with CPU autocast off)."),
        evidence=[e for e in (
            row_evidence("device", ctx.table("device"), "cpu", "native_bf16" if dtype == "bf16" else "native_fp16",
                         f"flags: {flags}"),
            *(row_evidence("roofline", ctx.table("roofline"), str(key), "measured_ns",
                           f"{dtype}: {ms(r['measured_ns'] / steps)} a step") for key, r in top.iterrows()),
        ) if e is not None],
        metrics={"dtype": dtype, "matrix_ns_per_step": took, "cast_ns_per_step": cast_ns,
                 "fp32_ns_per_step": in_fp32, "rate_source": source, "half_without_native": [dtype]},
    )


def _fp32_with_bf16_units(ctx: RuleContext, cpu: pd.Series, fp32: pd.DataFrame, peaks: dict[str, float],
                          steps: int) -> Finding | None:
    if not len(fp32):
        return None
    took = float(fp32["measured_ns"].sum()) / steps
    if "bf16" in peaks and "fp32" in peaks and peaks["bf16"] > peaks["fp32"]:
        speedup = peaks["bf16"] / peaks["fp32"]
        source = (f"this CPU's calibrated matmul peaks ({peaks['fp32'] / 1e9:.3g} GFLOP/s in fp32, "
                  f"{peaks['bf16'] / 1e9:.3g} in bf16)")
        confidence = 0.6
    elif "bf16" in peaks and "fp32" in peaks:
        return None  # calibrated, and bf16 is no faster here
    elif _probed(cpu) is not None:
        speedup = _probed(cpu)
        if speedup <= 1:
            return None  # probed, and bf16 is no faster here
        source = f"a matmul probe on this CPU after the run (bf16 at {speedup:.2g}x the fp32 rate)"
        confidence = 0.5
    else:
        speedup = ctx.threshold("assumed_amx_speedup")
        source = f"an assumed {speedup:g}x (`advisor calibrate` measures this CPU's)"
        confidence = 0.4
    # Only the matrix math speeds up, and autocast costs every matrix call its casts (of the
    # weight, the input, the gradients back): a call too small to have arithmetic to speak
    # of gets slower, not faster.
    saved, per_call = _bf16_saving(ctx, cpu, fp32, speedup, peaks, steps)
    share = saved / ctx.run_step_ns if ctx.run_step_ns > 0 else 0.0
    if share < ctx.threshold("min_share"):
        return None
    flags = str(cpu.get("cpu_features") or "")
    top = fp32.sort_values("measured_ns", ascending=False).head(3)
    listed = "; ".join(f"{key} ({ms(r['measured_ns'] / steps)} a step)" for key, r in top.iterrows())
    return Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, share),
        confidence=confidence,
        saving=saving(ctx, saved, f"each fp32 matrix call's arithmetic {speedup:.3g}x faster in bf16 ({source}), "
                                  f"less the {ms(per_call)} autocast's casts cost a call",
                      low_ns=saved / 2, high_ns=max(took * (1 - 1 / speedup), saved),
                      remains="the matrix work in bf16 and the casts autocast adds"),
        message=(f"{len(fp32)} matrix op shapes run in fp32 ({ms(took)} a step, {pct(took / ctx.run_step_ns)} of it) "
                 f"on a CPU whose AMX / AVX512-BF16 units run bf16 matmuls faster (flags: {flags}): "
                 f"{speedup:.3g}x by {source}. The slowest: {listed}."),
        recommendation=("Run the forward under torch.autocast(\"cpu\", dtype=torch.bfloat16) on this CPU (check "
                        "the loss curve: bf16 changes numerics); `advisor verify --try amp` measures it."),
        evidence=[e for e in (
            row_evidence("device", ctx.table("device"), "cpu", "native_bf16", f"flags: {flags}"),
            *(row_evidence("roofline", ctx.table("roofline"), str(key), "measured_ns",
                           f"fp32: {ms(r['measured_ns'] / steps)} a step") for key, r in top.iterrows()),
        ) if e is not None],
        metrics={"dtype": "fp32", "matrix_ns_per_step": took, "speedup": speedup, "rate_source": source,
                 "fp32_with_bf16_units": True},
    )


def _bf16_saving(ctx: RuleContext, cpu: pd.Series, fp32: pd.DataFrame, speedup: float, peaks: dict[str, float],
                 steps: int) -> tuple[float, float]:
    """What bf16 autocast saves a step on the fp32 matrix calls, and what it costs a call.
    A call's kernel is its measured time less a dispatch (``matrix_dispatch_us``), and never
    longer than its FLOPs at a tenth of the CPU's fp32 rate (``min_rate_share``: a call that
    slow is held up by something bf16 does not change); the kernel runs ``speedup`` times
    faster, and each call pays autocast's casts (the collector's probe, at least
    ``autocast_call_us``). Calls that lose count against it."""
    per_call = max(_number(cpu, "autocast_ns_per_matrix_call"), ctx.threshold("autocast_call_us") * 1e3)
    if "fp32" in peaks:
        rate = peaks["fp32"]  # calibrated, on the machine's cores
    else:
        rate = _number(cpu, "fp32_matmul_flops") or ctx.threshold("cpu_fp32_gflops_per_thread") * 1e9
        threads = _number(cpu, "torch_threads") or 1.0
        rate *= max(min(threads, _number(cpu, "usable_cores") or threads), 1.0)
    calls = fp32["calls"].astype(float).to_numpy()
    measured = fp32["measured_ns"].astype(float).to_numpy() / calls.clip(min=1)
    slowest = fp32["flops"].astype(float).fillna(0.0).to_numpy() / calls.clip(min=1) \
        / (rate * ctx.threshold("min_rate_share")) * 1e9
    kernel = (measured - ctx.threshold("matrix_dispatch_us") * 1e3).clip(min=0.0)
    kernel = kernel.clip(max=slowest)
    saved = float(((kernel * (1 - 1 / speedup) - per_call) * calls).sum()) / steps
    return max(saved, 0.0), per_call


def _number(cpu: pd.Series, name: str) -> float:
    value = cpu.get(name)
    return float(value) if value is not None and not pd.isna(value) and float(value) > 0 else 0.0


def _probed(cpu: pd.Series) -> float | None:
    """bf16's matmul rate over fp32's on this CPU, from the collector's probe (None: none)."""
    value = cpu.get("bf16_vs_fp32")
    return float(value) if value is not None and not pd.isna(value) and float(value) > 0 else None


def _torch(dtype: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16"}[dtype]

