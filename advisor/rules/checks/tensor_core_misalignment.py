"""tensor-core-misalignment: GEMMs and convolutions whose shapes keep them off tensor cores
(NVIDIA) or matrix cores (AMD), or on their slow paths, and fp32 matrix work that could use
them (Roofline Summary). The wording follows the target's vendor: tensor cores and CUDA
cores, or matrix cores and vector units."""

from __future__ import annotations

import math

import pandas as pd

from advisor.findings import Evidence, Finding, Severity
from advisor.knowledge import hardware as kb
from advisor.rules.checks.common import faster_gpu, ms, severity_by_share
from advisor.rules.kernel_why import counters_for, evidence_for, why
from advisor.rules.registry import RuleContext, register

HALF = ("fp16", "bf16", "fp8", "int8")


def _pad(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


def _dims(row: pd.Series) -> dict[str, int]:
    """The dimensions the tensor-core rule applies to, by the names the user knows."""
    if row["kind"] == "conv":
        named = {"C (in channels)": row.get("c_in"), "K (out channels)": row.get("c_out")}
    elif "linear" in str(row["name"]):
        named = {"M (rows)": row.get("m"), "N (out features)": row.get("n"), "K (in features)": row.get("k")}
    else:
        named = {"M": row.get("m"), "N": row.get("n"), "K": row.get("k")}
    return {k: int(v) for k, v in named.items() if v is not None and not pd.isna(v) and v > 0}


def _layer(row: pd.Series) -> str:
    """The op in the user's words: Linear(1000 -> 1023) on 60 rows, Conv(3 -> 64)."""
    if row["kind"] == "conv":
        return f"{row['name']} Conv({int(row['c_in'])} -> {int(row['c_out'])} channels)"
    if pd.isna(row.get("k")) or pd.isna(row.get("n")) or pd.isna(row.get("m")):
        return str(row["name"])
    m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
    if "linear" in str(row["name"]):
        return f"{row['name']} ({k} -> {n} features, {m} rows)"
    batch = "" if pd.isna(row.get("batch")) or int(row["batch"]) <= 1 else f"{int(row['batch'])} x "
    return f"{row['name']} ({batch}{m}x{k} @ {k}x{n})"


@register("tensor-core-misalignment")
def check(ctx: RuleContext) -> list[Finding]:
    table = ctx.table("roofline")
    if table is None or not len(table) or "target_id" not in table.columns:
        return []
    matrix = table[table["kind"].isin(["gemm", "conv"])]
    if not len(matrix):
        return []
    target_id = str(matrix["target_id"].iloc[0])
    if target_id in ("", "cpu"):
        return []  # no tensor cores to miss; `--gpu NAME` judges a CPU run against a GPU
    profile = kb.gpu_profile(target_id)
    items = [item for key, row in matrix.iterrows() if (item := _measure(ctx, profile, key, row)) is not None]
    if not items:
        return []
    items.sort(key=lambda item: -item["saving_ns"])
    gpu_time = sum(item["saving_ns"] for item in items) / max(ctx.step_count, 1)
    if gpu_time < ctx.threshold("min_saving_ms") * 1e6:
        return []  # microseconds a step: not worth a reader's attention
    estimate, fix = faster_gpu(
        ctx, [(str(i["row"]["name"]), str(i["row"]["input_dims"]), _kept_share(i)) for i in items],
        gpu_time, items[0]["basis"])
    return [_word(ctx, profile, items, gpu_time, estimate, fix)]


def _judged(profile: kb.GpuProfile, dtype: str, measured_here: bool) -> str:
    """The dtype a matrix op is judged in: its own where it is half precision; fp32
    measured on its GPU as it could run (TF32 / autocast); a run judged against another
    device (a CPU run with --gpu) as it would run there under autocast, fp16."""
    judged = dtype if dtype in HALF else ("fp16" if not measured_here else "tf32")
    if judged == "tf32" and kb.tensor_core_rule(profile, "tf32") is None:
        judged = "fp16"  # no TF32 before Ampere (V100, T4): fp32 reaches tensor cores only under fp16 autocast
    return judged


def _measure(ctx: RuleContext, profile: kb.GpuProfile, key: object, row: pd.Series) -> dict | None:
    """One GEMM or convolution of the roofline table: the dimensions that miss the multiple,
    whether it runs fp32 off the matrix units, and what padding (or TF32 / autocast) would
    save; None where it would not pay."""
    aligned_eff, misaligned_eff = ctx.threshold("aligned_efficiency"), ctx.threshold("misaligned_efficiency")
    matrix_unit = kb.unit_names(profile)[1][:-1].replace(" ", "-")  # as an adjective: "tensor-core peak"
    measured_here = bool(row.get("measured_on_target")) and not pd.isna(row["measured_ns"])
    dtype = str(row["dtype"])
    judged = _judged(profile, dtype, measured_here)
    rule = kb.tensor_core_rule(profile, judged)
    if rule is None or not row["flops"] or pd.isna(row["flops"]):
        return None
    # A size below the multiple (K = 1 of an outer product, 3 classes) would be mostly
    # padding: never worth it, never reported.
    missing = {name: value for name, value in _dims(row).items()
               if value % rule.required_multiple and value > rule.required_multiple}
    per_call_ns = float(row["measured_ns"]) / max(float(row["calls"]), 1.0) if measured_here else math.inf
    if row.get("tensor_core_kernels") == "yes" and per_call_ns < ctx.threshold("min_call_us") * 1e3:
        return None  # on tensor cores already, and too short for its shape to matter: launch-bound's
    bandwidth = kb.memory_bandwidth(profile)
    memory_ns = row["bytes"] / bandwidth * 1e9 if row["bytes"] and not pd.isna(row["bytes"]) else 0.0
    peak = kb.peak_flops(profile, judged, True)
    if not peak:
        return None
    compute_ns = row["flops"] / peak * 1e9
    fp32_off_tensor_cores = measured_here and dtype == "fp32" and row.get("tensor_core_kernels") != "yes"
    if not missing and not fp32_off_tensor_cores:
        return None
    factor = 1.0
    for value in missing.values():
        factor *= _pad(value, rule.required_multiple) / value
    # Padding to a multiple of 8 or 16 never changes how many 64-, 128- or 256-wide output
    # tiles a GEMM needs, so tile and wave quantisation are the same before and after: the
    # padded shape costs its extra work, and the gain is the faster path.
    fixed_ns = max(compute_ns * factor, memory_ns) / aligned_eff
    if measured_here:
        now_ns = float(row["measured_ns"])
        basis = (f"measured time on {profile.id} against the padded shape at {aligned_eff:.0%} of the "
                 f"{matrix_unit} peak")
    else:
        now_ns = max(compute_ns, memory_ns) / misaligned_eff
        basis = (f"estimated on {profile.id} from the roofline: misaligned shapes at {misaligned_eff:.0%} "
                 f"and padded ones at {aligned_eff:.0%} of the {judged} {matrix_unit} peak")
    if not fp32_off_tensor_cores and now_ns - fixed_ns < ctx.threshold("min_shape_gain") * now_ns:
        return None  # padding would not pay: the shape runs about as fast as its padded twin
    return {"key": key, "row": row, "missing": missing, "rule": rule, "judged": judged,
            "fp32": fp32_off_tensor_cores, "saving_ns": max(now_ns - fixed_ns, 0.0), "basis": basis}


def _kept_share(item: dict) -> float:
    """The share of its measured time an op keeps once fixed (1 where it was not measured
    on its GPU: a run judged with --gpu)."""
    row = item["row"]
    if bool(row.get("measured_on_target")) and not pd.isna(row["measured_ns"]) and float(row["measured_ns"]) > 0:
        return max(1.0 - item["saving_ns"] / float(row["measured_ns"]), 0.0)
    return 1.0


def _listed(ctx: RuleContext, items: list[dict], general: str) -> tuple[list[str], list[Evidence]]:
    """A line and a piece of evidence for each op listed, the costliest first."""
    steps = max(ctx.step_count, 1)
    lines, evidence = [], []
    for item in items[: int(ctx.threshold("max_listed"))]:
        row, rule = item["row"], item["rule"]
        parts = []
        if item["missing"]:
            pads = ", ".join(f"{name} {value} -> {_pad(value, rule.required_multiple)}"
                             for name, value in item["missing"].items())
            parts.append(f"not multiples of {rule.required_multiple} for {item['judged']}: pad {pads}")
        if item["fp32"]:
            parts.append(f"fp32 on {'CUDA cores' if general == 'cuda cores' else general}")
        measured = (f" of its {ms(float(row['measured_ns']) / steps)}" if bool(row.get("measured_on_target"))
                    and not pd.isna(row["measured_ns"]) else "")
        lines.append(f"{_layer(row)}, {int(row['calls'])} calls, {ms(item['saving_ns'] / steps)} recoverable per "
                     f"step{measured}: " + "; ".join(parts))
        evidence.append(Evidence(kind="table_row", table="roofline", row=str(item["key"]), column="input_dims",
                                 value=str(row["input_dims"]), note="; ".join(parts)))
    return lines, evidence


def _advice(misaligned: list[dict], fp32: list[dict], matrix_units: str) -> list[str]:
    advice = []
    if misaligned:
        advice.append("pad the listed feature / channel counts to the multiples shown (e.g. nn.Linear(1000, 1024) "
                      "and drop or ignore the extra outputs, vocabulary sizes rounded up to a multiple of 64, "
                      "batch sizes that are multiples of 8)")
    if fp32 and all(i["judged"] == "fp16" for i in fp32):
        advice.append(f"let fp32 matrix work use {matrix_units} with mixed precision: run forward and loss under "
                      "torch.autocast(device_type='cuda', dtype=torch.float16) and scale the loss with "
                      "torch.amp.GradScaler('cuda') (this GPU has no TF32 or bf16 tensor cores); "
                      "channels_last (model.to(memory_format=torch.channels_last)) helps convolutions further")
    elif fp32:
        advice.append(f"let fp32 matrix work use {matrix_units}: torch.set_float32_matmul_precision('high') (TF32) "
                      "or torch.autocast(device_type='cuda', dtype=torch.bfloat16)")
    return advice


def _word(ctx: RuleContext, profile: kb.GpuProfile, items: list[dict], gpu_time: float, estimate, fix) -> Finding:
    general, matrix_units = kb.unit_names(profile)
    matrix_unit = matrix_units[:-1].replace(" ", "-")  # as an adjective: "tensor-core peak"
    share = estimate.share_of_step
    capped = (f"The GPU would save {ms(gpu_time)} a step, of which the step loses {ms(estimate.ms_per_step * 1e6)}: "
              "the rest becomes idle time where the host sets the pace." if fix is not None
              and estimate.ms_per_step * 1e6 < 0.9 * gpu_time else "")
    lines, evidence = _listed(ctx, items, general)
    misaligned = [i for i in items if i["missing"]]
    fp32 = [i for i in items if i["fp32"]]
    measured = all(bool(i["row"].get("measured_on_target")) for i in items)
    where = f"on {profile.names[0]}" + ("" if measured else " (this run was judged against it with --gpu, not "
                                                           "measured on it)")
    # Where Nsight Compute profiled the listed ops' kernels, their pipes say what runs them.
    counters = counters_for(ctx, {str(i["row"]["name"]) for i in items})
    said = ""
    if len(counters):
        said = " Nsight Compute's counters: " + "; ".join(
            f"{row['op']} ({str(row['kernel'])[:60]}): {why(row, profile.sm_count)}"
            for _, row in counters.drop_duplicates("kernel").head(3).iterrows()) + "."
        evidence += evidence_for(counters)
    on = "CUDA cores" if general == "cuda cores" else general
    what = " and ".join(part for part in (
        f"{len(misaligned)} GEMM/convolution shapes miss the {matrix_unit} multiples" if misaligned else "",
        f"{len(fp32)}{'' if misaligned else ' GEMM/convolution shapes'} run fp32 matrix work on {on}, which "
        + (f"fp16 autocast would move to {matrix_units} (this GPU has no TF32)"
           if all(i["judged"] == "fp16" for i in fp32) else f"TF32 or bf16 autocast would move to {matrix_units}")
        if fp32 else "") if part)
    return Finding(
        rule=ctx.spec.id,
        title=(f"fp32 matrix work runs without {matrix_units}" if fp32 and not misaligned
               else ctx.spec.title.replace("tensor cores", matrix_units)),
        severity=severity_by_share(ctx, share) if share else Severity.low,
        confidence=0.7 if measured else 0.5,
        saving=estimate,
        message=(f"{where[0].upper()}{where[1:]}, {what}, costing an estimated {ms(gpu_time)} of GPU time per step: "
                 + "; ".join(lines) + "." + (f" {capped}" if capped else "") + said),
        recommendation=f"Give {matrix_units} the shapes they need: "
                       + "; ".join(_advice(misaligned, fp32, matrix_units)) + ".",
        evidence=evidence,
        metrics={"misaligned": [str(i["key"]) for i in misaligned],
                 "fp32_off_tensor_cores": [str(i["key"]) for i in fp32], "target": profile.id,
                 "gpu_time_ns_per_step": gpu_time},
    ).with_fix(fix)
