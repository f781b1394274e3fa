"""per-sample-model-calls: the model runs once per sample, not once per batch.

A loop that slices a batch apart and calls the model (and the loss) on each sample makes
the model's operators run once per sample: the same work in N times as many operator
calls, each paying its dispatch (and on a GPU its launch), and a backward graph N times
as large. The Model Summary counts the Forward phases: far more than the one or two a
step makes (the model, the loss) means per-sample calls. Batching the samples into one
call keeps the arithmetic and drops almost all of the calls.
"""

from __future__ import annotations

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, saving, severity_by_share, value
from advisor.rules.registry import RuleContext, register


@register("per-sample-model-calls")
def check(ctx: RuleContext) -> list[Finding]:
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
    message = (f"The model's forward runs {calls:.0f} times a step (the Model Summary's Forward calls over "
               f"{steps} recorded step{'s' if steps != 1 else ''}), where a batched step runs it once or twice (the "
               f"model, the loss): the samples go through the model one at a time. Forward and backward take "
               f"{pct(share)} of the step, {ms(step * share)} of the {ms(step)} step, nearly all of it the dispatch "
               "of operators repeated per sample.")
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
            row_evidence("model", model, "Forward", "calls", "forward passes in the recorded steps"),
            row_evidence("model", model, "Forward", "cpu_ratio"),
            row_evidence("model", model, "Backward", "cpu_ratio"),
        ) if e is not None],
        metrics={"forward_calls_per_step": calls, "share": share},
    )]
