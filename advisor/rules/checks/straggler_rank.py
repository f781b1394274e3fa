"""straggler-rank: some ranks make the others wait at collectives.

Reads the job's `ranks` table. A collective cannot finish before its last rank arrives, so
the ranks that come early wait; the rank that arrives last at most calls is the
straggler, and the time the others wait (beyond the wait the straggler itself has, the
job's ordinary jitter) is what evening it out would give back to every rank's step. What
the straggler does differently is read from the same table: the phase, data loading or
host sync time where it spends more than the other ranks' median.
"""

from __future__ import annotations

import pandas as pd

from advisor.findings import Evidence, Finding, Severity
from advisor.rules.checks.common import ms, pct, saving, severity_by_share
from advisor.rules.registry import RuleContext, register

# Columns of the ranks table that say where a rank's step goes, in the user's words.
_WHERE = {
    "dataloader_ns": "the data loader",
    "forward_ns": "forward",
    "backward_ns": "backward",
    "optimization_ns": "the optimizer step",
    "host_other_ns": "host work outside forward, backward and the optimizer",
    "host_sync_ns": "host syncs",
    "compute_ns": "computation",
}


@register("straggler-rank")
def check(ctx: RuleContext) -> list[Finding]:
    ranks = ctx.table("ranks")
    step = ctx.mean_step_ns
    if ranks is None or len(ranks) < 2 or not step or "last_share" not in ranks.columns:
        return []
    judged = ranks[ranks["last_share"].notna() & ranks["wait_ns"].notna()]
    if len(judged) < 2:
        return []
    key = judged["last_share"].astype(float).idxmax()
    slow = judged.loc[key]
    others = judged.drop(index=key)
    fair = 1.0 / len(judged)
    last_share = float(slow["last_share"])
    if last_share < max(ctx.threshold("min_last_share"), ctx.threshold("fair_share_multiple") * fair):
        return []
    own_wait = float(slow["wait_ns"])
    waits = others["wait_ns"].astype(float) - own_wait
    excess = float(waits.mean())
    if excess <= 0 or excess / step < ctx.threshold("min_share") or excess < ctx.threshold("min_saving_ms") * 1e6:
        return []
    # Waits measured on recorded steps, scaled to the job's own pace where steps ran unrecorded.
    scale, scaled_note = _pace_scale(judged)
    excess *= scale
    rank = int(slow["rank"])
    differences = _differences(slow, others, excess)
    extra_passes = _extra_passes(slow, others)
    explained = sum(extra for _where, extra, _mine, _median in differences if _where != "computation") or \
        sum(extra for _where, extra, _mine, _median in differences)
    calls = float(slow["last_arrivals"] or 0) / last_share if last_share else 0.0
    unexplained = explained * scale < ctx.threshold("explained_share") * excess and extra_passes is None
    if unexplained and (last_share < ctx.threshold("unexplained_last_share") or calls < ctx.threshold("min_calls")):
        # Arriving last now and then with nothing that explains it is the job's jitter
        # (ranks sharing cores, the network), not a rank to fix.
        return []
    also = [int(others.at[r, "rank"]) for r, share in others["last_share"].items()
            if float(share) >= ctx.threshold("min_last_share") / 2]
    top_other = slow.get("host_other_top") if "host_other_top" in slow.index else None
    said = "; ".join(f"{ms(extra)} more per step in {where} ({ms(mine)} against {ms(median)}"
                     + (f", mostly {top_other}" if top_other and where == _WHERE["host_other_ns"] else "") + ")"
                     for where, extra, mine, median in differences)
    passes = (f" It runs the model's forward {extra_passes[0]:.3g} times per step against {extra_passes[1]:.3g} on "
              "the other ranks: an extra pass (evaluation, metrics) on this rank alone." if extra_passes else "")
    message = (f"Rank {rank} arrives last at {pct(last_share)} of the collectives matched across "
               f"{len(judged)} ranks; the other ranks wait {ms(excess)} per step for it on average "
               f"({pct(excess / step)} of the step), up to {ms(float(waits.max()) * scale)} on rank "
               f"{int(others.loc[waits.idxmax(), 'rank'])}.{scaled_note}" + passes
               + (f" Against the other ranks' median it spends {said}." if said else
                  " Its phases take no longer than the others': look at what its host does between them "
                  "(its own report) or at its device.")
               + (f" Ranks {', '.join(map(str, also))} also arrive last often." if also else ""))
    lead = "an extra pass" if extra_passes else (differences[0][0] if differences else "")
    return [Finding(
        rule=ctx.spec.id,
        title=f"{ctx.spec.title}: rank {rank}",
        severity=Severity.low if unexplained else severity_by_share(ctx, excess / step),
        confidence=0.4 if unexplained else 0.7,
        saving=saving(ctx, excess, "the time the other ranks wait for this rank at collectives, beyond the wait "
                                   "it has itself (the job's ordinary jitter)"
                                   + (", scaled to the pace of the steps run without recording" if scale < 1 else ""),
                      low_ns=excess * ctx.threshold("saving_low_share"), high_ns=float(waits.max()) * scale,
                      remains="Every rank keeps its own step's work and the collectives' own time; a rank that is "
                              "slower by hardware (a slower GPU, a shared host) stays slower."),
        message=message,
        recommendation=_advice(lead, rank, str(slow.get("source", "") or "")),
        evidence=[
            Evidence(kind="table_row", table="ranks", row=str(key), column="last_share", value=last_share,
                     note="collectives this rank arrives at last"),
            Evidence(kind="table_row", table="ranks", row=str(waits.idxmax()), column="wait_ns",
                     value=float(others.loc[waits.idxmax(), "wait_ns"]), unit="ns",
                     note="the longest wait per step on another rank, as recorded"),
            *([Evidence(kind="table_row", table="ranks", row=str(key), column="forward_calls",
                        value=extra_passes[0], note=f"against {extra_passes[1]:.3g} on the other ranks")]
              if extra_passes else []),
            *[Evidence(kind="table_row", table="ranks", row=str(key), column=column, value=float(slow[column]),
                       unit="ns", note=f"{ms(extra)} more per step than the other ranks' median")
              for column, extra in _columns(differences)],
        ],
        metrics={"rank": rank, "last_share": last_share, "others_wait_ns_per_step": excess,
                 "own_wait_ns_per_step": own_wait, "pace_scale": scale},
    )]


def _pace_scale(ranks: pd.DataFrame) -> tuple[float, str]:
    """How much faster the job ran without recording than while recorded (<= 1), and a
    sentence saying so where it matters."""
    if "pace_ns" not in ranks.columns:
        return 1.0, ""
    pace = ranks["pace_ns"].astype(float)
    recorded = ranks["step_mean_ns"].astype(float)
    ok = pace.notna() & recorded.notna() & (recorded > 0)
    if not ok.any():
        return 1.0, ""
    scale = min(float(pace[ok].mean() / recorded[ok].mean()), 1.0)
    if scale > 0.95:
        return 1.0, ""
    return scale, (f" (Steps ran {pct(1 - scale)} faster without recording, so the waits recorded are scaled to "
                   "that pace.)")


def _extra_passes(slow: pd.Series, others: pd.DataFrame) -> tuple[float, float] | None:
    """(its forward calls per step, the others' median) where it runs the model more often."""
    if "forward_calls" not in others.columns or pd.isna(slow.get("forward_calls")):
        return None
    median = others["forward_calls"].astype(float).median()
    mine = float(slow["forward_calls"])
    if pd.isna(median) or mine < 1.5 * median + 0.5:
        return None
    return mine, float(median)


def _differences(slow: pd.Series, others: pd.DataFrame, excess: float) -> list[tuple[str, float, float, float]]:
    """Where the slow rank spends more than the others' median: (where, extra, its, median),
    largest first, those worth at least a tenth of the others' wait."""
    out = []
    for column, where in _WHERE.items():
        if column not in others.columns or pd.isna(slow.get(column)):
            continue
        median = others[column].astype(float).median()
        if pd.isna(median):
            continue
        extra = float(slow[column]) - float(median)
        if extra >= 0.1 * excess:
            out.append((where, extra, float(slow[column]), float(median)))
    out.sort(key=lambda d: -d[1])
    # computation is the sum of the phases on a CPU job: name it only where no phase explains it
    if len(out) > 1:
        out = [d for d in out if d[0] != "computation"] or out
    return out[:3]


def _columns(differences) -> list[tuple[str, float]]:
    names = {where: column for column, where in _WHERE.items()}
    return [(names[where], extra) for where, extra, _mine, _median in differences]


def _advice(lead: str, rank: int, source: str) -> str:
    where = f"; its own report: `advisor diagnose {source}`" if source else ""
    if lead == "an extra pass":
        return (f"Rank {rank} runs the model more often than the others each step: evaluation, metrics or a "
                f"logging pass on one rank inside the step{where}. Do it every N steps, outside the timed loop, "
                "or spread it over all ranks (each evaluates a shard); every other rank waits for it at the "
                "next collective.")
    if lead == "the data loader":
        return (f"Rank {rank} waits for data: give its DataLoader more workers or check its shard (a larger or "
                f"slower-to-read part of the data set, a cold cache){where}. Every rank waits for the slowest "
                "loader at the next collective.")
    if lead in ("host work outside forward, backward and the optimizer", "host syncs"):
        return (f"Rank {rank} does host work the others do not: logging, metrics, checkpointing or evaluation "
                f"run on one rank inside the step, or a .item() there{where}. Move it out of the step, do it "
                "every N steps, or spread it over ranks; the other ranks wait for it at every collective.")
    if lead:
        return (f"Rank {rank} spends longer in {lead} than the other ranks: uneven work (shards of different "
                f"lengths, variable sequence lengths without bucketing) or a slower device{where}. Balance "
                "the work per rank; every rank waits for the slowest at the next collective.")
    return (f"Rank {rank} arrives last without a phase that explains it: compare its host (CPU load, other "
            f"processes), its device and its network link with the others'{where}.")
