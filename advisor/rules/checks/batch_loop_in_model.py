"""batch-loop-in-model: the model's forward walks its batch row by row in Python.

Judged from the batch_loops table: a loop in the Forward phase that indexes one tensor's
rows one at a time (``h[i]`` for each i, ``for row in h``) and runs a few operators on
each. The same arithmetic done once over the batch (a mask, one masked sum) runs a handful
of operators where the loop runs its body once a row, and leaves a handful of autograd
nodes where the loop leaves one per operator per row (a ``SelectBackward0`` per row, each
filling a zero tensor the size of the batch).

The saving is the step replayed with the loop's forward time and its nodes' backward time
cut to what a batched form keeps: each body operator called about twice for the batch where
the loop calls it once a row (``keep_ops`` over ``rows``; ``keep_ops_low`` and
``keep_ops_high`` for the range's ends), and never less than the arithmetic, the body's
bytes at the device's memory bandwidth (``cpu_gb_per_s`` where no bandwidth is known),
forward and backward.
"""

from __future__ import annotations

import math

from advisor.findings import Finding
from advisor.rules.checks.common import pct, row_evidence, severity_by_share, site_evidence
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.step.whatif import Fix
from advisor.tables.batch_loops import loop_spans

# Body operators that say which batched form fits.
_REDUCTIONS = ("aten::mean", "aten::sum", "aten::max", "aten::amax", "aten::min", "aten::amin", "aten::norm",
               "aten::logsumexp", "aten::softmax", "aten::_softmax")


@register("batch-loop-in-model")
def check(ctx: RuleContext) -> list[Finding]:
    loops = ctx.table("batch_loops")
    if loops is None or not len(loops) or ctx.model is None or not ctx.step_count:
        return []
    mine = loops[(loops["phase"] == "Forward") & (loops["rows"] >= ctx.threshold("min_rows"))]
    # Where the run knows its batch, a loop over some other count of rows walks something
    # else (time steps, a sample's parts), which batching over the batch does not remove.
    batch = ctx.model.session.meta.trace_metadata.get("batch_size")
    if isinstance(batch, int) and batch > 0:
        mine = mine[mine["rows"] == batch]
    spans = loop_spans(ctx.model.facts) if len(mine) else {}
    findings = []
    for key, row in mine.iterrows():
        if key not in spans:
            continue
        found = _finding(ctx, str(key), row, *spans[key])
        if found is not None:
            findings.append(found)
    return findings


def _keep(ctx: RuleContext, row, name: str, floor: float) -> float:
    """The share of the loop's time a batched form keeps: ``name`` calls of each body
    operator for the whole batch where the loop makes one a row, and never less than the
    arithmetic (``floor``, a share of the loop's time)."""
    return min(max(ctx.threshold(name) / max(float(row["rows"]), 1.0), floor), 1.0)


def _arithmetic_share(ctx: RuleContext, row) -> float:
    """The share of the loop's time (forward and its nodes, at the job's own pace) that its
    operators' bytes take at the device's memory bandwidth, twice (forward, backward): what
    no batching removes."""
    memory = float(row["memory_ns_per_step"])
    if math.isnan(memory):  # no bandwidth known: a modest one
        moved = float(row["bytes_per_step"])
        memory = 0.0 if math.isnan(moved) else moved / ctx.threshold("cpu_gb_per_s")
    recorded = float(row["forward_ns_per_step"]) + float(row["node_ns_per_step"])
    pace = ctx.run_step_ns / ctx.model.recorded_step_ns if ctx.model.recorded_step_ns else 1.0
    loop = recorded * min(pace, 1.0)
    return 2 * memory / loop if loop > 0 else 1.0


def _finding(ctx: RuleContext, key: str, row, extents, nodes) -> Finding | None:
    floor = _arithmetic_share(ctx, row)
    keep = _keep(ctx, row, "keep_ops", floor)

    def fix(kept: float, what: str) -> Fix:
        return Fix(what, host_spans=((extents, kept),) + (((nodes, kept),) if len(nodes) else ()))

    batched = fix(keep, "the loop batched")
    found = replayed(ctx, batched,
                     "the step replayed with the loop's forward time and its autograd nodes' backward time cut to "
                     f"what one pass over the batch keeps ({pct(keep)} of them: its operators called "
                     f"{ctx.threshold('keep_ops'):.0f} times, not once a row, and their arithmetic)",
                     low=fix(_keep(ctx, row, "keep_ops_low", 2 * floor), "the loop batched, at four times the cost"),
                     high=fix(_keep(ctx, row, "keep_ops_high", floor), "the loop batched, its body's operators once"),
                     remains="The step keeps the batched form's few operators over the whole batch (the same "
                             "arithmetic) and their few autograd nodes.")
    if found is None:
        return None
    estimate, _ = found
    if estimate.ms_per_step < ctx.threshold("min_saving_ms") or estimate.share_of_step < ctx.threshold("min_share"):
        return None
    rows, passes = int(row["rows"]), float(row["passes_per_step"])
    body = str(row["body"])
    op_name, _, rest = key.partition(" ")
    shape = rest.rpartition(" dim")[0]
    site = site_evidence(str(row["source"]), "the loop",
                         f"{int(row['source_samples'])} stack sample(s) inside the loop stopped here")
    where = f" at {site.file.rsplit('/', 1)[-1]}:{site.line}" if site is not None else ""
    each = "" if passes <= 1.05 else f" in each of {passes:.0f} forward passes"
    how = ("one row at a time with " + ("torch.unbind (for row in h)" if op_name == "aten::unbind"
                                        else f"{op_name.removeprefix('aten::')} (h[i])"))
    recorded = ctx.model.recorded_step_ns or 0.0
    forward_ns, node_ns = float(row["forward_ns_per_step"]), float(row["node_ns_per_step"])
    message = (f"The model's forward walks a batch of {rows} rows{where}{each}: it takes a {shape} tensor "
               f"{how}, then runs {float(row['body_ops_per_row']):.0f} operators on each row ({body} a row).")
    if float(row["node_calls_per_step"]) > 0:
        message += (f" Its operators leave {float(row['node_calls_per_step']):.0f} autograd nodes a step "
                    f"({row['nodes']}) that backward runs one by one.")
    if recorded:
        message += (f" In the recorded steps the loop took {pct(forward_ns / recorded)} of the step in forward"
                     + (f" and its nodes {pct(node_ns / recorded)} in backward" if node_ns else "") + ".")
    message += " The same arithmetic over the whole batch is a few operators and a few nodes."
    evidence = [e for e in (
        site,
        row_evidence("batch_loops", ctx.table("batch_loops"), key, "index_calls_per_step",
                     f"one {op_name} a row, {rows} rows"),
        row_evidence("batch_loops", ctx.table("batch_loops"), key, "forward_ns_per_step",
                     "the loop's host time in forward per step, as recorded"),
        row_evidence("batch_loops", ctx.table("batch_loops"), key, "node_ns_per_step",
                     "its autograd nodes' backward time per step, as recorded")
        if float(row["node_calls_per_step"]) > 0 else None,
    ) if e is not None]
    return Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.75,
        saving=estimate,
        message=message,
        recommendation=_advice(body),
        evidence=evidence,
        metrics={"rows": rows, "body_ops_per_row": float(row["body_ops_per_row"]), "kept_share": keep,
                 "loop": key},
    ).with_fix(batched)


def _advice(body: str) -> str:
    names = [part.split(" x")[0] for part in body.split(", ")]
    advice = ["Replace the loop with operations over the whole batch."]
    if "aten::slice" in names and any(n in _REDUCTIONS for n in names):
        advice.append("For a reduction over each row's first n[i] items (h[i, :n[i]].mean(0)), build a mask once "
                      "and reduce masked: mask = torch.arange(h.shape[1], device=h.device)[None, :] < n[:, None]; "
                      "pooled = (h * mask.unsqueeze(-1)).sum(1) / n[:, None] (or masked_fill with -inf before a "
                      "max).")
    elif any(n in _REDUCTIONS for n in names):
        advice.append("A reduction of each row is the same reduction over the batch with dim=1 (h.mean(dim=1), "
                      "h.amax(dim=1)).")
    if "aten::item" in names or "aten::_local_scalar_dense" in names:
        advice.append("Each row also reads a number back to Python (aten::item: a length used as a slice bound), "
                      "on a GPU a wait per row; the mask keeps the lengths a tensor.")
    advice.append("To pick one item per row, index with tensors (h[torch.arange(B), idx]); for any other function of "
                  "one row, torch.func.vmap(f)(h) runs it over the batch at once.")
    return " ".join(advice)

