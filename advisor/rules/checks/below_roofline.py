"""below-roofline: ops far below their ideal time on the target device (Roofline Summary)."""

from __future__ import annotations

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import faster_gpu, ms, pct, severity_by_share
from advisor.rules.kernel_why import at_limit, counters_for, evidence_for, why
from advisor.rules.registry import RuleContext, register

ADVICE = {
    "gemm": "GEMMs below their roofline: use bf16/fp16 autocast (or TF32 for fp32), keep M/N/K "
            "multiples of 8 (see tensor-core-misalignment), and larger batches so tiles fill the GPU",
    "conv": "convolutions below their roofline: channels_last memory format with autocast, "
            "channel counts that are multiples of 8, and torch.backends.cudnn.benchmark = True",
    "attention": "attention below its roofline: use F.scaled_dot_product_attention with the flash or "
                 "memory-efficient backend (bf16/fp16, head dim a multiple of 8)",
    "elementwise": "memory-bound elementwise ops: fuse them (torch.compile) so data is read once",
    "reduction": "reductions and softmax: fuse with their neighbours (torch.compile) or use fused kernels",
    "norm": "normalisations: use fused implementations (apex/torch fused LayerNorm, torch.compile)",
    "copy": "copies and dtype conversions: avoid .contiguous()/.to(dtype) round trips in the hot path",
    "embedding": "embedding lookups: keep tables in the compute dtype and batch the lookups",
}


@register("below-roofline")
def check(ctx: RuleContext) -> list[Finding]:
    table = ctx.table("roofline")
    if table is None or not len(table) or "measured_ns" not in table.columns:
        return []
    target_efficiency = ctx.threshold("target_efficiency")
    rows = table[table["measured_ns"].notna() & table["ideal_ns"].notna() & (table["ideal_ns"] > 0)
                 & (table["measured_ns"] > 0)]
    # No kernel takes less than a launch floor (a few microseconds from launch to
    # completion): an op is judged against max(flops / peak, bytes / bandwidth, the
    # floor), and one that runs within a few floors of it is launch-bound, not below its
    # roofline (the launch-bound rule's), and would only crowd out the ops worth fixing.
    if len(rows):
        calls = rows["calls"].clip(lower=1).astype(float)
        floor_ns = ctx.threshold("launch_floor_us") * 1e3
        on_gpu = rows["unit"].ne("cpu")
        ideal = rows["ideal_ns"].where(~on_gpu, rows["ideal_ns"].clip(lower=floor_ns * calls))
        rows = rows.assign(ideal_ns=ideal, efficiency=ideal / rows["measured_ns"])
        tiny = on_gpu & (rows["measured_ns"] / calls < ctx.threshold("launch_floors_tiny") * floor_ns)
        rows = rows[~tiny]
    rows = rows[rows["efficiency"] < target_efficiency]
    # Where Nsight Compute profiled an op's kernels and every one runs at the hardware's
    # limit, the counters win over the cost model: there is little left to take.
    counters = counters_for(ctx, set(rows["name"].astype(str)))
    at_the_limit = sorted({str(op) for op, group in counters.groupby("op") if all(at_limit(r) for _, r in group.iterrows())}) \
        if len(counters) else []
    rows = rows[~rows["name"].astype(str).isin(at_the_limit)]
    if not len(rows):
        return []
    steps = max(ctx.step_count, 1)
    # What a fix could give back: down to the time a well-tuned op takes (ideal / target
    # efficiency), not down to the ideal itself, which no real kernel reaches.
    recoverable = (rows["measured_ns"] - rows["ideal_ns"] / target_efficiency).clip(lower=0)
    rows = rows.assign(recoverable_ns=recoverable).sort_values("recoverable_ns", ascending=False)
    gpu_time = float(rows["recoverable_ns"].sum()) / steps
    if gpu_time / 1e6 < ctx.threshold("min_saving_ms") or (ctx.mean_step_ns and gpu_time / ctx.mean_step_ns
                                                          < ctx.threshold("min_share")):
        return []
    basis = (f"time above {pct(target_efficiency)} of the roofline on {str(rows['target'].iloc[0])}, the efficiency a "
             "well-tuned kernel reaches")
    estimate, fix = faster_gpu(
        ctx, [(str(r["name"]), str(r["input_dims"]), max(1.0 - float(r["recoverable_ns"]) / float(r["measured_ns"]), 0.0))
              for _, r in rows.iterrows() if r["unit"] != "cpu"], gpu_time, basis)
    per_step = estimate.ms_per_step * 1e6
    share = estimate.share_of_step
    capped = (f"The GPU would save {ms(gpu_time)} a step, of which the step loses {ms(per_step)}: the rest becomes "
              "idle time where the host sets the pace." if fix is not None and per_step < 0.9 * gpu_time else "")
    listed = rows.head(int(ctx.threshold("max_listed")))
    target = str(listed["target"].iloc[0])
    units = _units(str(listed["target_id"].iloc[0])) if "target_id" in listed.columns else "SMs"
    pictures = {key: _tile_picture(row, units) for key, row in listed.iterrows()}
    lines = [
        f"{row['name']} {row['input_dims']} ({row['dtype']}, {row['bound']}-bound on {row['unit']}): "
        f"{pct(row['efficiency'])} of ideal, {ms(row['measured_ns'] / steps)}/step for an ideal "
        f"{ms(row['ideal_ns'] / steps)} ({ms(row['recoverable_ns'] / steps)} recoverable)"
        + (f"; {pictures[key]}" if pictures[key] else "")
        for key, row in listed.iterrows()
    ]
    evidence = [
        Evidence(kind="table_row", table="roofline", row=str(key), column="efficiency", value=float(row["efficiency"]),
                 note=f"{row['name']}: ideal {ms(row['ideal_ns'] / steps)}, measured {ms(row['measured_ns'] / steps)} per step")
        for key, row in listed.iterrows()
    ]
    said = ""
    profiled = counters[counters["op"].astype(str).isin(set(listed["name"].astype(str)))] if len(counters) else counters
    if len(profiled):
        said = " Nsight Compute's counters say why: " + "; ".join(
            f"{row['op']} ({str(row['kernel'])[:60]}): {why(row)}" for _, row in profiled.drop_duplicates("kernel").head(3).iterrows()) + "."
        evidence += evidence_for(profiled)
    if at_the_limit:
        said += (f" Left out, the counters showing them at the hardware's limit where the cost model did not: "
                 f"{', '.join(at_the_limit)}.")
    kinds = list(dict.fromkeys(listed["kind"]))
    advice = [_attention_advice(ctx, listed) if k == "attention" else ADVICE[k] for k in kinds if k in ADVICE][:3]
    few = [key for key, picture in pictures.items() if picture.startswith(FEW_TILES)]
    if few:
        advice.insert(0, "a GEMM whose output fills a few tiles leaves most of the GPU idle: give each call more "
                         "rows (a larger batch, or the calls that share weights batched into one) so its tiles fill "
                         "every multiprocessor")
    return [
        Finding(
            rule=ctx.spec.id,
            title=ctx.spec.title,
            severity=severity_by_share(ctx, share),
            confidence=0.6,
            saving=estimate,
            message=(f"{len(rows)} op shapes run below {pct(target_efficiency)} of their roofline on {target}; "
                     f"the ones losing most time: " + "; ".join(lines) + "." + (f" {capped}" if capped else "") + said),
            recommendation=("Bring the slowest ops closer to the hardware: " + "; ".join(advice) + "."
                            if advice else "Profile the listed ops' kernels and look for better implementations."),
            evidence=evidence,
            metrics={"recoverable_ns_per_step": per_step, "gpu_time_ns_per_step": gpu_time, "op_shapes": int(len(rows)),
                     "worst": [{"key": str(k), "efficiency": float(r["efficiency"])} for k, r in listed.iterrows()]},
        ).with_fix(fix)
    ]


def _attention_advice(ctx: RuleContext, listed) -> str:
    """The attention advice, unless the trace shows the ops already run fused attention
    kernels: then what is left on the table for them."""
    kernels = ctx.table("operator_kernels")
    names = set(listed.loc[listed["kind"] == "attention", "name"].astype(str))
    if kernels is None or not len(kernels) or not {"operator", "kernel"} <= set(kernels.columns):
        return ADVICE["attention"]
    mine = kernels[kernels["operator"].astype(str).isin(names)]["kernel"].astype(str)
    if mine.str.contains("flash", case=False).any():
        return ("attention below its roofline although it already runs FlashAttention kernels: on Hopper the cuDNN "
                "backend (torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)) or FlashAttention-3 runs "
                "closer to the hardware; with short sequences, more sequences per call (a larger batch, packing) "
                "fill the GPU")
    if mine.str.contains("fmha|efficient", case=False).any():
        return ("attention below its roofline on the memory-efficient kernels: the flash backend (bf16/fp16, head "
                "dim a multiple of 8, no arbitrary mask) is usually faster")
    return ADVICE["attention"]


# A GEMM whose tiles fill at most this share of one wave of the GPU, or whose last wave is at
# most this full, has its tile picture said.
FEW_TILES_SHARE = 0.5
LAST_WAVE_SHARE = 0.25
FEW_TILES = "only "


def _units(target_id: str) -> str:
    """What the target's multiprocessors are called: 'compute units' (AMD) or 'SMs'."""
    from advisor.knowledge import hardware as kb

    try:
        profile = kb.gpu_profile(target_id)
    except Exception:  # noqa: BLE001  (a CPU target, or none: no multiprocessors to name)
        return "SMs"
    return "compute units" if profile.vendor == "amd" else "SMs"


def _tile_picture(row, units: str) -> str:
    """A GEMM's tiles against the GPU, where they leave it idle: "only 8 output tiles
    (256x112) for 304 compute units, 3% of them busy", or "1.1 waves of 256x256 tiles,
    the last 10% full"; "" where the picture says nothing wrong or is not known."""
    tiles, waves, tile = row.get("tiles"), row.get("waves"), str(row.get("tile") or "")
    if row.get("kind") != "gemm" or not tile or tiles is None or waves is None or not (waves > 0) or not (tiles > 0):
        return ""
    slots = round(float(tiles) / float(waves))
    if waves <= FEW_TILES_SHARE:
        return (f"{FEW_TILES}{int(tiles)} output tile{'s' if tiles != 1 else ''} ({tile}) for {slots} {units}, "
                f"{pct(float(waves))} of them busy")
    last = float(waves) - int(waves)
    if waves > 1 and 0 < last <= LAST_WAVE_SHARE:
        return f"{float(waves):.2g} waves of {tile} tiles on {slots} {units}, the last {pct(last)} full"
    return ""
