"""profile-incomplete: what the profile does not cover, said before anything else.

A run whose collection failed, stopped early or missed processes must never read as a
clean bill of health: this rule turns every incomplete row of the Collection Summary
into one finding, severity high, that leads the report (its rule is marked ``leads`` in
the pack) and trips ``--fail-on high``.
"""

from __future__ import annotations

from advisor.findings import Finding, Saving
from advisor.rules.checks.common import row_evidence
from advisor.rules.registry import RuleContext, register


@register("profile-incomplete")
def check(ctx: RuleContext) -> list[Finding]:
    gaps = ctx.table("collection")
    if gaps is None or not len(gaps):
        return []
    missing = gaps[gaps["incomplete"].astype(bool)]
    if not len(missing):
        return []
    parts = [f"{row['what']}: {row['why']}" for _, row in missing.iterrows()]
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=ctx.spec.severity,
        confidence=1.0,
        saving=Saving(ms_per_step=0.0, share_of_step=0.0,
                      basis="none: this finding says what the others could not see"),
        message=("This profile does not cover the whole job, so the findings below may miss what matters most. "
                 + " ".join(f"{i}. {part.rstrip('.')}." for i, part in enumerate(parts, 1))),
        recommendation="Fix the collection first (the lines above say how), then diagnose again.",
        evidence=[e for e in (row_evidence("collection", gaps, key, "why") for key in missing.index) if e is not None],
        metrics={"gaps": [{"what": row["what"], "why": row["why"]} for _, row in missing.iterrows()]},
    )]
