"""tensor-core-misalignment: GEMMs and convolutions whose shapes keep them off tensor cores
(or on their slow paths), and fp32 matrix work that could use them (Roofline Summary)."""

from __future__ import annotations

import math

import pandas as pd

from advisor.findings import Evidence, Finding, Severity
from advisor.knowledge import hardware as kb
from advisor.rules.checks.common import ms, saving, severity_by_share
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
    steps = max(ctx.step_count, 1)
    aligned_eff = ctx.threshold("aligned_efficiency")
    misaligned_eff = ctx.threshold("misaligned_efficiency")
    bandwidth = kb.memory_bandwidth(profile)

    items: list[dict] = []
    for key, row in matrix.iterrows():
        measured_here = bool(row.get("measured_on_target")) and not pd.isna(row["measured_ns"])
        dtype = str(row["dtype"])
        # fp32 measured on its GPU: judged as it could run (TF32 / autocast). A run judged
        # against another device (a CPU run with --gpu) is judged as it would run there
        # under autocast: fp16.
        judged = dtype if dtype in HALF else ("fp16" if not measured_here else "tf32")
        rule = kb.tensor_core_rule(profile, judged)
        if rule is None or not row["flops"] or pd.isna(row["flops"]):
            continue
        dims = _dims(row)
        missing = {name: value for name, value in dims.items() if value % rule.required_multiple}
        memory_ns = row["bytes"] / bandwidth * 1e9 if row["bytes"] and not pd.isna(row["bytes"]) else 0.0
        peak = kb.peak_flops(profile, judged, True)
        if not peak:
            continue
        compute_ns = row["flops"] / peak * 1e9
        fp32_off_tensor_cores = measured_here and dtype == "fp32" and row.get("tensor_core_kernels") != "yes"
        if not missing and not fp32_off_tensor_cores:
            continue
        factor = 1.0
        for value in missing.values():
            factor *= _pad(value, rule.required_multiple) / value
        fixed_ns = max(compute_ns * factor, memory_ns) / aligned_eff
        if measured_here:
            now_ns = float(row["measured_ns"])
            basis = f"measured time on {profile.id} against the padded shape at {aligned_eff:.0%} of the tensor-core peak"
        else:
            now_ns = max(compute_ns, memory_ns) / misaligned_eff
            basis = (f"estimated on {profile.id} from the roofline: misaligned shapes at {misaligned_eff:.0%} "
                     f"and padded ones at {aligned_eff:.0%} of the {judged} tensor-core peak")
        items.append({
            "key": key, "row": row, "missing": missing, "rule": rule, "judged": judged,
            "fp32": fp32_off_tensor_cores, "saving_ns": max(now_ns - fixed_ns, 0.0), "basis": basis,
        })
    if not items:
        return []
    items.sort(key=lambda item: -item["saving_ns"])
    per_step = sum(item["saving_ns"] for item in items) / steps
    share = per_step / ctx.mean_step_ns if ctx.mean_step_ns else 0.0
    lines, evidence = [], []
    for item in items[: int(ctx.threshold("max_listed"))]:
        row, rule = item["row"], item["rule"]
        parts = []
        if item["missing"]:
            pads = ", ".join(f"{name} {value} -> {_pad(value, rule.required_multiple)}"
                             for name, value in item["missing"].items())
            parts.append(f"not multiples of {rule.required_multiple} for {item['judged']}: pad {pads}")
        if item["fp32"]:
            parts.append("fp32 on CUDA cores: TF32 (torch.backends.cuda.matmul.allow_tf32 = True) or "
                         "bf16 autocast would use tensor cores")
        lines.append(f"{_layer(row)}, {int(row['calls'])} calls: " + "; ".join(parts))
        evidence.append(Evidence(kind="table_row", table="roofline", row=str(item["key"]), column="input_dims",
                                 value=str(row["input_dims"]), note="; ".join(parts)))
    misaligned = [i for i in items if i["missing"]]
    fp32 = [i for i in items if i["fp32"]]
    advice = []
    if misaligned:
        advice.append("pad the listed feature / channel counts to the multiples shown (e.g. nn.Linear(1000, 1024) "
                      "and drop or ignore the extra outputs, vocabulary sizes rounded up to a multiple of 64, "
                      "batch sizes that are multiples of 8)")
    if fp32:
        advice.append("let fp32 matrix work use tensor cores: torch.set_float32_matmul_precision('high') (TF32) "
                      "or torch.autocast(device_type='cuda', dtype=torch.bfloat16)")
    where = f"on {profile.names[0]}" + ("" if all(bool(i["row"].get("measured_on_target")) for i in items)
                                        else " (this run was judged against it with --gpu, not measured on it)")
    return [
        Finding(
            rule=ctx.spec.id,
            title=ctx.spec.title,
            severity=severity_by_share(ctx, share) if share else Severity.low,
            confidence=0.7 if all(bool(i["row"].get("measured_on_target")) for i in items) else 0.5,
            saving=saving(ctx, per_step, items[0]["basis"]),
            message=(" and ".join(part for part in (
                         f"{len(misaligned)} GEMM/convolution shapes miss the tensor-core multiples" if misaligned else "",
                         f"{len(fp32)} run fp32 matrix work on CUDA cores" if fp32 else "") if part)
                     + f" {where}, costing an estimated {ms(per_step)} per step: " + "; ".join(lines) + "."),
            recommendation="Give tensor cores the shapes they need: " + "; ".join(advice) + ".",
            evidence=evidence,
            metrics={"misaligned": [str(i["key"]) for i in misaligned], "fp32_off_tensor_cores": [str(i["key"]) for i in fp32],
                     "target": profile.id},
        )
    ]
