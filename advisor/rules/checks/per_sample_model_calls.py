"""per-sample-model-calls: the model runs once per sample, not once per batch.

Two loops do this:

- a training loop that slices a batch apart and calls the model (and the loss) on each
  sample: the Model Summary counts far more Forward phases per step than the one or two a
  step makes (the model, the loss);
- an inference loop that calls the model on one sample at a time, each call a step of its
  own (advisor's hooks take each call of the model as a step where nothing else marks
  one): the steps are many, the model's input a batch of one, and each step's work its
  operators' dispatch far more than their arithmetic.

Either way the model's operators run once per sample: the same work in N times as many
operator calls, each paying its dispatch (and on a GPU its launch). Batching the samples
into one call keeps the arithmetic and drops almost all of the calls. For the inference
loop the saving is what a call of ``target_batch`` samples would leave per sample: the
call's dispatch shared by the batch, plus the arithmetic each sample still needs (its
FLOPs at the CPU's measured peak where `advisor calibrate` measured it, else at a modest
``cpu_gflops``), plus the loop's own work between calls (reading, tokenizing), which
stays per sample. The call's share of the step comes from the steps timed without the
profiler.
"""

from __future__ import annotations

import numpy as np

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import ms, pct, row_evidence, saving, severity_by_share, site_evidence, value
from advisor.rules.registry import RuleContext, register


@register("per-sample-model-calls")
def check(ctx: RuleContext) -> list[Finding]:
    per_call = _per_call_steps(ctx)
    if per_call is not None:
        return [per_call]
    model = ctx.table("model")
    step = ctx.mean_step_ns
    steps = ctx.step_count
    if model is None or not len(model) or not step or not steps:
        return []
    calls = float(value(model, "Forward", "calls", 0.0) or 0.0) / steps
    if calls < ctx.threshold("min_forward_calls"):
        return []
    # Per-sample training builds a backward graph per call: autograd's nodes per step
    # follow the forward calls. Forward calls with a small graph behind them are passes
    # that train nothing (an evaluation loop inside the step), another problem.
    operators = ctx.table("operator")
    backward = float(value(model, "Backward", "cpu_total_ns", 0.0) or 0.0)
    if operators is not None and len(operators) and backward > 0 and "calls" in operators.columns:
        autograd = operators.index.astype(str).str.startswith("autograd::engine::evaluate_function")
        nodes = float(operators.loc[autograd, "calls"].sum()) / steps
        if nodes < ctx.threshold("min_backward_nodes_per_call") * calls:
            return []
    forward = float(value(model, "Forward", "cpu_ratio", 0.0) or 0.0)
    backward = float(value(model, "Backward", "cpu_ratio", 0.0) or 0.0)
    others = float(value(model, "Others", "cpu_ratio", 0.0) or 0.0)
    share = forward + backward
    if share < ctx.threshold("min_share"):
        return []
    # Batched, the step makes a few calls (the model, the loss) instead of ``calls``:
    # the model's phases keep that fraction of their time, the per-sample Python around
    # them (slicing, the loop) goes too at best.
    kept = ctx.threshold("calls_after") / calls
    point = step * share * (1 - kept)
    high = step * (share + others) * (1 - kept)
    capped = _gpu_idle_cap(ctx)
    if capped is not None:
        # On a GPU the per-sample calls cost the host's dispatch while the GPU waits: batching
        # gives back at most the GPU's idle time, whatever the host's phases took.
        point, high = min(point, capped), min(high, capped)
    message = (f"The model's forward runs {calls:.0f} times a step (the Model Summary's Forward calls over "
               f"{steps} recorded step{'s' if steps != 1 else ''}), where a batched step runs it once or twice (the "
               f"model, the loss): the samples go through the model one at a time. Forward and backward take "
               f"{pct(share)} of the step, {ms(step * share)} of the {ms(step)} step, nearly all of it the dispatch "
               "of operators repeated per sample." + _called_at(model))
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, point / step),
        confidence=0.7,
        saving=saving(ctx, point, f"the forward and backward time per step less the {ctx.threshold('calls_after'):.0f} "
                                  "calls a batched step keeps; at most the per-sample Python around them too",
                      low_ns=point * ctx.threshold("saving_low_share"), high_ns=high,
                      remains="The step keeps one batched forward and backward (the same arithmetic in a few "
                              "operator calls), the optimizer and the data loading."),
        message=message,
        recommendation=("Run the model on the whole batch: stack the samples into one tensor (torch.stack, or a "
                        "DataLoader with batch_size=N) and call model(batch) and the loss once; where the samples "
                        "differ in size, pad them or use torch.func.vmap for per-sample functions (per-sample "
                        "gradients: torch.func.grad with vmap)."),
        evidence=[e for e in (
            _call_site(model, calls),
            row_evidence("model", model, "Forward", "calls", "forward passes in the recorded steps"),
            row_evidence("model", model, "Forward", "cpu_ratio"),
            row_evidence("model", model, "Backward", "cpu_ratio"),
        ) if e is not None],
        metrics={"forward_calls_per_step": calls, "share": share},
    )]


def _gpu_idle_cap(ctx: RuleContext) -> float | None:
    """The GPU's idle time per step on a GPU run (the step model's partition), or None."""
    part = ctx.model.partition if ctx.model is not None else None
    if part is None or not part.on_gpu:
        return None
    return part.idle_ns / max(part.steps, 1)


def _per_call_steps(ctx: RuleContext) -> Finding | None:
    """The inference loop: every step one call of the model on a batch of one."""
    if ctx.model is None:
        return None
    meta = ctx.model.session.meta
    facts = meta.trace_metadata
    source = (facts.get("advisor") or {}).get("step_source") or facts.get("step_source")
    batch = facts.get("batch_size")
    calls = len(meta.timed_steps) or ctx.step_count
    step = ctx.mean_step_ns
    model = ctx.table("model")
    backward = float(value(model, "Backward", "calls", 0.0) or 0.0)
    if source != "forward" or not isinstance(batch, int) or batch > ctx.threshold("max_batch") or backward \
            or calls < ctx.threshold("min_calls") or not step:
        return None
    operators = ctx.table("operator")
    recorded = max(ctx.step_count, 1)
    flops = 0.0
    if operators is not None and len(operators) and {"level", "flops"} <= set(operators.columns):
        flops = float(operators.loc[operators["level"] == "top", "flops"].fillna(0).sum()) / recorded
    peak = _cpu_flops(ctx)
    compute = flops / peak * 1e9 if peak else 0.0
    target = ctx.threshold("target_batch")
    # The step is a call of the model and whatever the loop does between calls (reading,
    # tokenizing, making the input tensor): batching shares the call's dispatch; the work
    # between calls stays per sample (at best its tensor-making is shared too: the high end).
    call = step * _forward_share(meta.timed_steps)
    between = step - call
    after = between + call / target + compute
    point = max(step - after, 0.0)
    low = max(call - (call / ctx.threshold("low_batch") + 2 * compute), 0.0)
    high = max(step - compute, point)
    if point / step < ctx.threshold("min_share"):
        return None
    message = (f"Each step is one call of the model on a batch of {batch} ({calls:,} calls, {ms(step)} a step, "
               f"{ms(call)} of it in the call): the model's operators run once per sample, paying their whole "
               f"dispatch for one row of work. A call costs {ms(call)} where its arithmetic ({flops / 1e3:.0f} kFLOP a "
               f"sample) needs about {ms(compute)}; batched {target:.0f} to a call, a sample would cost about "
               f"{ms(after)}, {ms(between)} of it the loop's own work between calls." + _called_at(model))
    return Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, point / step),
        confidence=0.7,
        saving=saving(ctx, point, f"a call's time shared by {target:.0f} samples, plus each sample's arithmetic "
                                  f"({'at the CPU peak advisor calibrate measured' if _calibrated(ctx) else 'at a modest CPU rate'})",
                      low_ns=low, high_ns=high,
                      remains=f"Each sample keeps its own arithmetic, 1/{target:.0f} of a batched call's dispatch "
                              "and the loop's work between calls."),
        message=message,
        recommendation=("Score the samples in batches: stack them (torch.stack, or a DataLoader with batch_size=64) "
                        "and call the model once per batch, then split the outputs (outputs.argmax(dim=1).tolist() "
                        "reads every prediction back at once, not one .item() per sample); for samples of different "
                        "sizes, pad them to a common size or group them by size."),
        evidence=[e for e in (
            _call_site(model, None),
            row_evidence("model", model, "Forward", "calls", "forward passes in the recorded steps"),
            row_evidence("step_timing", ctx.table("step_timing"), "ProfileStep", "best_avg_ns",
                         "a call of the model: one sample"),
        ) if e is not None],
        metrics={"batch_size": batch, "calls": calls, "flops_per_call": flops, "compute_ns": compute,
                 "call_ns": call, "between_calls_ns": between, "per_sample_after_ns": after,
                 "target_batch": target},
    )


def _forward_share(timed: list) -> float:
    """The share of a step the model's call takes, from the steps timed without the
    profiler (whose operators it would slow unevenly): the median over those steps, so a
    step that started the profiler or warmed something up does not sway it; all of the
    step where none were timed."""
    shares = [min(t.phases.get("Forward", 0) / (t.duration_ns - t.own_ns), 1.0) for t in timed
              if not t.recorded and not t.partial and t.duration_ns > t.own_ns]
    return float(np.median(shares)) if shares else 1.0


def _cpu_flops(ctx: RuleContext) -> float:
    """The CPU's FLOP/s for fp32 matrix work: `advisor calibrate`'s measurement, else the
    rule's modest default."""
    for device in ctx.model.session.meta.devices if ctx.model is not None else []:
        if device.kind == "cpu" and device.peak_flops.get("fp32"):
            return float(device.peak_flops["fp32"])
    return ctx.threshold("cpu_gflops") * 1e9


def _calibrated(ctx: RuleContext) -> bool:
    return any(d.kind == "cpu" and d.peak_flops.get("fp32") for d in (ctx.model.session.meta.devices
                                                                        if ctx.model is not None else []))



def _call_site(model, calls: float | None) -> Evidence | None:
    """The user's line that calls the model (the model table's Forward called_from), as a
    source-line evidence."""
    site = value(model, "Forward", "called_from", "") if model is not None and len(model) else ""
    said = f"the model called here, {calls:.0f} times a step" if calls else "the model called here, once a sample"
    return site_evidence(str(site or ""), "model call", said)


def _called_at(model) -> str:
    found = _call_site(model, None)
    return f" The model is called at {found.file.rsplit('/', 1)[-1]}:{found.line}." if found is not None else ""
