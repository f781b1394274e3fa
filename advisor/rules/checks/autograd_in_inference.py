"""autograd-in-inference: a loop that never runs backward records autograd's graph in
every forward, judged from the inference_autograd table.

A scoring, evaluation or serving loop that calls the model outside ``torch.no_grad()`` or
``torch.inference_mode()`` makes an autograd node for each differentiable operator (the
model's parameters require grad in eval mode too) and saves the tensors its backward would
need. The saving is that bookkeeping replayed out of the forwards: the nodes a step makes
times what one node costs on this CPU (a probe after the run; a typical figure for a
trace), taken off the Forward phase (the operators that ran with grad mode on, where the
profile has no phases).
"""

from __future__ import annotations

import math

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share, site_evidence, value
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.session import intervals as iv
from advisor.step.load import weighed_per_step
from advisor.step.whatif import Fix

TABLE = "inference_autograd"
ROW = "forward with autograd"


def _measure(ctx: RuleContext) -> dict | None:
    """The nodes a step makes, what one costs (and whence), and the spans it is taken off."""
    table = ctx.table(TABLE)
    if table is None or ROW not in table.index or ctx.model is None:
        return None
    row = table.loc[ROW]
    nodes = float(row["nodes_per_step"])
    probed = float(row["probed_node_ns"])
    node_ns = probed if not math.isnan(probed) else ctx.threshold("typical_node_us") * 1e3
    forward_ns = float(row["forward_per_step_ns"])
    spans = ctx.model.facts.phase_intervals("Forward")
    if not len(spans) or math.isnan(forward_ns) or forward_ns <= 0:
        # No phases: the operators that ran with grad mode on, as recorded.
        facts = ctx.model.facts
        ev = facts.events
        lo, hi = facts.window
        graded = ((ev["kind"] == "op").to_numpy() & (ev["sequence"].to_numpy() >= 0)
                  & (ev["parent_op"].to_numpy() < 0) & (ev["start_ns"].to_numpy() >= lo)
                  & (ev["start_ns"].to_numpy() < hi))
        spans = iv.union(iv.Intervals(ev["start_ns"].to_numpy()[graded], ev["end_ns"].to_numpy()[graded]))
        forward_ns = float(row["graded_per_step_ns"])
    if not len(spans) or forward_ns <= 0:
        return None
    # On a busy machine the forwards' time is weighed as on a quiet one (advisor.step.load),
    # as the probe's node cost is: the load stretched the recorded forwards, not the nodes.
    forward_ns = weighed_per_step(ctx.model, spans) or forward_ns
    return {"table": table, "nodes": nodes, "node_ns": node_ns, "probed": not math.isnan(probed),
            "forward_ns": forward_ns, "spans": spans, "cost_ns": min(nodes * node_ns, forward_ns)}


def _fix(m: dict, scale: float) -> Fix:
    kept = 1.0 - min(m["cost_ns"] * scale / m["forward_ns"], 0.95)
    return Fix("the forwards under torch.inference_mode()", host_spans=((m["spans"], kept),))


@register("autograd-in-inference")
def check(ctx: RuleContext) -> list[Finding]:
    m = _measure(ctx)
    if m is None or m["nodes"] < ctx.threshold("min_nodes_per_step"):
        return []
    # A probe of this CPU is good to about half either way of what a model's own nodes
    # cost (they save more or fewer tensors than the probe's); a typical figure, more.
    spread = ctx.threshold("probed_spread") if m["probed"] else ctx.threshold("typical_spread")
    found = replayed(ctx, _fix(m, 1.0), "the step replayed with its forwards' autograd bookkeeping gone",
                     low=_fix(m, 1.0 / spread), high=_fix(m, spread),
                     remains="The step keeps the forwards' operators themselves.")
    if found is None:
        return []
    estimate, _ = found
    if estimate.ms_per_step < ctx.threshold("min_saving_ms"):
        return []
    return [_word(ctx, m, estimate)]


def _word(ctx: RuleContext, m: dict, estimate) -> Finding:
    model = ctx.table("model")
    site = value(model, "Forward", "called_from", "") if model is not None and len(model) else ""
    how = (f"about {ms(m['node_ns'])} each on this CPU, by a probe after the run" if m["probed"]
           else f"about {ms(m['node_ns'])} each on a typical server CPU (a trace: not measured here)")
    message = (f"Nothing in this run calls backward, yet its forwards run with autograd on: they record "
               f"{m['nodes']:.0f} autograd nodes a step ({how}: {ms(m['cost_ns'])} a step, "
               f"{pct(m['cost_ns'] / m['forward_ns'])} of the forward), each saving the tensors a backward would "
               f"need and keeping them alive as long as the output is.")
    table = m["table"]
    return Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.8 if m["probed"] else 0.6,
        saving=estimate,
        message=message,
        recommendation=("Run the loop under torch.inference_mode() (or torch.no_grad() where its outputs must "
                        "later enter autograd): `with torch.inference_mode(): scores = model(batch)`, or decorate "
                        "the scoring function with @torch.inference_mode(). model.eval() changes dropout and batch "
                        "norm, not autograd."),
        evidence=[e for e in (
            row_evidence(TABLE, table, ROW, "nodes_per_step", "autograd nodes recorded per step, none run"),
            row_evidence(TABLE, table, ROW, "probed_node_ns", "one node's cost on this CPU") if m["probed"] else None,
            row_evidence(TABLE, table, ROW, "forward_per_step_ns", "the forward's time per step"),
            site_evidence(str(site or ""), "model call", "the model called here with autograd on"),
        ) if e is not None],
        metrics={"nodes_per_step": m["nodes"], "node_ns": m["node_ns"], "cost_per_step_ns": m["cost_ns"],
                 "probed": m["probed"]},
    ).with_fix(_fix(m, 1.0))
