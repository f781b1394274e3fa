"""The rule engine: run the rules over the tables and turn what they return into ranked
findings with symptoms nested under their causes.

A rule is a spec in a YAML pack (id, title, severity, thresholds, which rules' symptoms it
explains, documentation; the format is :mod:`advisor.rules.packs`). A *data rule* carries its
own condition, evaluated over one table by :mod:`advisor.rules.packs.evaluate`; any other rule
is a check function registered under the same id with :func:`register` (the built-in ones
in advisor.rules.checks, third-party ones in packages loaded through the ``advisor.rules`` entry
point). Checks read tables only, through a RuleContext. A rule that fails is reported and
skipped; the others still run. Its one-line error is in ``errors`` and, as
``failed: <error>``, in ``skipped`` under its id, so every report's notes say it failed.

Which rules run: every spec given, except those ``disabled``, preview rules unless
``preview`` is on or they are ``enabled``, deprecated rules unless ``enabled``, and rules
whose ``requires`` (steps, a measured GPU) the session does not meet.

The cause graph has an edge cause -> symptom for each ``explains`` entry (a few dozen rules:
the standard library's graphlib orders it; networkx, which every command would wait
0.25 s to import, is kept for the step graph's export). When both ends fire, the symptom
is nested under its cause instead of being ranked beside it; roots are ranked by estimated
saving per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from typing import TYPE_CHECKING, Any

import pandas as pd

import advisor.rules.checks  # noqa: F401  (importing the built-in checks registers them)
from advisor.findings import Finding, Severity
from advisor.rules.packs.catalog import builtin_pack
from advisor.rules.packs.evaluate import run_data_rule
from advisor.rules.packs.spec import Lifecycle, Requirement, RuleSpec
from advisor.rules.registry import Check, RuleContext, registered
from advisor.session import Session

if TYPE_CHECKING:
    from advisor.step import StepModel

__all__ = [
    "EXPLAINS_MIN_SHARE",
    "FAILED",
    "CauseGraph",
    "Combined",
    "EngineResult",
    "builtin_specs",
    "cause_graph",
    "checks",
    "combined_estimate",
    "failure",
    "rank",
    "run_job_rules",
    "run_rules",
    "session_facts",
]


def checks() -> dict[str, Check]:
    """The registered Python checks by rule id: the built-in ones, and those of plugins
    loaded so far."""
    return registered()


def builtin_specs() -> list[RuleSpec]:
    """The built-in rules (rules/builtin/, one file each)."""
    return list(builtin_pack().rules)


@dataclass(frozen=True)
class Combined:
    """Every finding's fix applied at once, replayed on the step model's graph: time two
    findings share is saved once, and the step after is never shorter than zero."""

    before_ns: float  # the step, per step
    after_ns: float  # the step with every fix applied
    rules: tuple[str, ...]  # the findings whose fixes it applies, in rank order
    beside_ns: float = 0.0  # of before_ns: work beside the steady steps (run every N steps), spread over them
    # The replay started from the job's step as a fix's base states it (advisor's own cost
    # in the recorded run taken out), not the step the report measured.
    based: bool = False

    @property
    def saved_ns(self) -> float:
        return max(self.before_ns - self.after_ns, 0.0)


@dataclass
class EngineResult:
    findings: list[Finding]
    errors: list[str]
    ran: list[str]
    # Rules given but not run, with why (disabled, preview, deprecated, needs steps...; a
    # rule that failed: FAILED followed by its error).
    skipped: dict[str, str] = field(default_factory=dict)
    combined: Combined | None = None


# How a rule that failed is marked in EngineResult.skipped, before its one-line error.
FAILED = "failed: "
# The longest error a failed rule is said with: one line, whatever the exception held.
_MAX_ERROR = 300


def failure(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message, and for a
    validation error (pydantic) the first field and what was wrong with it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            text += f" ({'.'.join(str(part) for part in first['loc'])}: {first['msg']}, got {first['input']!r})"
        except Exception:  # noqa: BLE001  (an errors() of another shape: the first line says enough)
            pass
    return text if len(text) <= _MAX_ERROR else text[:_MAX_ERROR - 3] + "..."


def session_facts(model: StepModel) -> dict[str, Any]:
    """Step count, mean step time and window length: the step model's (the mean step is
    ``StepModel.mean_step_ns``, advisor.step.timing; the job's own step where steps ran
    unrecorded)."""
    return {"step_count": model.steps, "mean_step_ns": model.mean_step_ns, "window_ns": model.window.duration_ns}


# A cause's saving must be at least this share of its symptom's for the symptom to be
# nested under it rather than ranked on its own.
EXPLAINS_MIN_SHARE = 0.25


@dataclass
class CauseGraph:
    """Rules as nodes, an edge cause -> symptom for each ``explains`` entry."""

    causes: dict[str, list[str]] = field(default_factory=dict)  # rule -> the rules that explain it, in order

    def add(self, rule: str) -> None:
        self.causes.setdefault(rule, [])

    def explains(self, cause: str, symptom: str) -> None:
        self.add(cause)
        self.add(symptom)
        if cause not in self.causes[symptom]:
            self.causes[symptom].append(cause)

    def __contains__(self, rule: object) -> bool:
        return rule in self.causes

    def order(self) -> list[str]:
        """Causes before their symptoms; the rules as added where the explains edges make
        a circle."""
        try:
            return list(TopologicalSorter(self.causes).static_order())
        except CycleError:
            return list(self.causes)

    def ancestors(self, rule: str) -> set[str]:
        """Every rule that explains ``rule``, however indirectly."""
        seen: set[str] = set()
        todo = list(self.causes.get(rule, ()))
        while todo:
            cause = todo.pop()
            if cause not in seen:
                seen.add(cause)
                todo.extend(self.causes.get(cause, ()))
        seen.discard(rule)
        return seen


def cause_graph(specs: list[RuleSpec]) -> CauseGraph:
    graph = CauseGraph()
    for spec in specs:
        graph.add(spec.id)
        for symptom in spec.explains:
            graph.explains(spec.id, symptom)
    return graph


def rank(findings: list[Finding], graph: CauseGraph, leading: frozenset[str] = frozenset()) -> list[Finding]:
    """Nest symptoms under their fired causes, then rank the roots by saving; findings of
    the ``leading`` rules (about the profile itself) come first."""
    fired = {f.rule for f in findings}
    roots: list[Finding] = []
    by_rule: dict[str, list[Finding]] = {}
    for finding in findings:
        by_rule.setdefault(finding.rule, []).append(finding)
    nested: set[int] = set()
    parent: dict[int, Finding] = {}  # id of a nested finding -> the finding it is nested under
    # A symptom goes under the fired cause with the largest saving; causes are visited
    # in topological order so a chain cause -> cause -> symptom nests fully.
    for rule_id in reversed(graph.order()):
        causes = [c for c in graph.causes.get(rule_id, ()) if c in fired]
        if not causes or rule_id not in by_rule:
            continue
        # Where one fired cause explains another, the symptom goes to the deeper cause (the
        # one nothing else fired explains), so a chain nests as a chain: queued work ->
        # the host's syncs waiting on it -> the idle GPU.
        deeper = {c: not any(a in causes for a in graph.ancestors(c)) for c in causes}
        best = max((f for c in causes for f in by_rule[c]), key=lambda f: (deeper[f.rule], f.saving.ms_per_step))
        for symptom in by_rule[rule_id]:
            # A cause explains a symptom only where it accounts for a real part of it: a
            # 26 us sync does not explain 170 ms of GPU idle time, and nesting it there
            # would hide the larger problem under the smaller.
            if best.saving.ms_per_step < EXPLAINS_MIN_SHARE * symptom.saving.ms_per_step:
                continue
            # Rules that explain each other (a circle in user packs) never nest two findings
            # under each other: both would leave the report.
            above, circle = best, False
            while above is not None and not circle:
                circle = above is symptom
                above = parent.get(id(above))
            if circle:
                continue
            best.explains.append(symptom)
            nested.add(id(symptom))
            parent[id(symptom)] = best
    for finding in findings:
        if id(finding) not in nested:
            roots.append(finding)

    def key(f: Finding) -> tuple[bool, float, int]:
        return (f.rule not in leading, -f.saving.ms_per_step, -f.severity.rank)

    for finding in findings:
        finding.explains.sort(key=key)
    return sorted(roots, key=key)


NOT_STEADY = "needs steady steps, and the profile is all start-up, compilation or graph capture"


def _why_not(spec: RuleSpec, disabled: set[str], enabled: set[str], preview: bool,
             facts: dict[str, Any], gpu_measured: bool) -> str | None:
    """Why ``spec`` does not run on this session, or None where it runs."""
    if spec.id in disabled:
        return "disabled"
    if spec.lifecycle is Lifecycle.preview and not (preview or spec.id in enabled):
        return "a preview rule (run it with --preview, or enable it)"
    if spec.lifecycle is Lifecycle.deprecated and spec.id not in enabled:
        return "deprecated (enable it to run it still)"
    if Requirement.ranks in spec.requires and not facts.get("ranks"):
        return "needs a job of two ranks or more"
    if Requirement.steps in spec.requires and not facts["step_count"]:
        return "needs steps, and the profile has none"
    if Requirement.gpu in spec.requires and not gpu_measured:
        return "needs a measured GPU"
    # A profile that is all warm-up: the rules that judge steady steps would judge the
    # warm-up; the rules about the profile itself still run.
    if facts.get("steady") is False and not spec.leads:
        return NOT_STEADY
    return None


# A finding whose replayed saving, at the job's own pace, is under this share of the step is
# low whatever its rule measured: a loader that takes 13 % of a recorded step but saves 1 %
# of the job's does not reach MEDIUM.
MEDIUM_MIN_SAVING_SHARE = 0.02


def _severity_follows_saving(finding: Finding, spec: RuleSpec) -> Finding:
    """A finding that saves nothing, or next to nothing of the job's step, is never more
    than low: it may point at something worth knowing, but a HIGH that saves 0 ms would rank
    a non-problem first. Findings about the profile itself (``leads``) keep theirs."""
    small = finding.saving.ms_per_step <= 0 or finding.saving.share_of_step < MEDIUM_MIN_SAVING_SHARE
    if not spec.leads and small and finding.severity.rank > Severity.low.rank:
        finding.severity = Severity.low
        for nested in finding.explains:
            _severity_follows_saving(nested, spec)
    return finding


def combined_estimate(model: StepModel | None, findings: list[Finding]) -> Combined | None:
    """The findings' fixes (those that made one, nested ones included) replayed at once."""
    if model is None:
        return None
    from advisor.step.whatif import combine, what_if

    chosen: list[Finding] = []

    def walk(items: list[Finding]) -> None:
        for finding in items:
            if finding._fix is not None and finding.saving.ms_per_step > 0:
                chosen.append(finding)
            walk(finding.explains)

    walk(findings)
    if not chosen:
        return None
    fix = combine([f._fix for f in chosen])
    replayed = what_if(model.graph, fix)
    return Combined(replayed.before_ns, replayed.after_ns, tuple(dict.fromkeys(f.rule for f in chosen)),
                    fix.beside_ns, based=fix.base is not None)


def _with_symptoms(findings: list[Finding]) -> list[Finding]:
    """The findings and every symptom nested under them."""
    out: list[Finding] = []
    for finding in findings:
        out.append(finding)
        out.extend(_with_symptoms(list(finding.explains)))
    return out


def run_rules(session: Session, tables: dict[str, pd.DataFrame], specs: list[RuleSpec] | None = None,
              *, disabled: set[str] | None = None, enabled: set[str] | None = None,
              preview: bool = False, model: StepModel | None = None) -> EngineResult:
    """Run the rules (the built-in ones by default) that are not ``disabled`` and whose
    lifecycle and requirements allow; a rule that fails is reported and skipped. The
    checks read ``model`` (the step model of ``session``, built here where not given)."""
    if model is None:
        from advisor.step import build_step_model

        model = build_step_model(session)
    specs = builtin_specs() if specs is None else specs
    disabled = disabled or set()
    enabled = enabled or set()
    registry = checks()
    facts = session_facts(model)
    facts["steady"] = model.steady
    recurs = model.window.recurs
    gpu_measured = session.meta.collector.gpu_measured
    findings: list[Finding] = []
    errors: list[str] = []
    ran: list[str] = []
    skipped: dict[str, str] = {}
    for spec in specs:
        reason = _why_not(spec, disabled, enabled, preview, facts, gpu_measured)
        if reason:
            skipped[spec.id] = reason
            continue
        check = run_data_rule if spec.is_data_rule else registry.get(spec.id)
        if check is None:
            errors.append(f"rule {spec.id}: no check is registered for it")
            continue
        context = RuleContext(
            tables=tables,
            spec=spec,
            step_count=facts["step_count"],
            mean_step_ns=facts["mean_step_ns"],
            window_ns=facts["window_ns"],
            gpu_measured=gpu_measured,
            facts=facts,
            model=model,
        )
        try:
            produced = check(context)
        except Exception as exc:  # noqa: BLE001  (a broken rule must not take the others down)
            errors.append(f"rule {spec.id} failed and was skipped: {failure(exc)}")
            skipped[spec.id] = FAILED + failure(exc)
            continue
        ran.append(spec.id)
        if not recurs and not spec.leads:  # a cost seen once in the window is sized as if it recurred
            for finding in _with_symptoms(produced):
                finding.saving.per = "pass"
                finding.saving.basis += ("; per pass: this profile shows its work once, so the saving assumes the "
                                         "pass recurs (see the report's headline)")
                # Seen once, a cost is not known to recur: never HIGH (a first pass pays for
                # lazy initialisation, autotuning, caches filling that the job pays once).
                if finding.severity.rank > Severity.medium.rank:
                    finding.severity = Severity.medium
        findings.extend(_severity_follows_saving(f, spec) for f in produced)
    leading = frozenset(spec.id for spec in specs if spec.leads)
    ranked = rank(findings, cause_graph(specs), leading)
    try:
        combined = combined_estimate(model, ranked)
    except Exception as exc:  # noqa: BLE001  (the findings stand without it)
        errors.append(f"the combined estimate failed: {failure(exc)}")
        combined = None
    return EngineResult(findings=ranked, errors=errors, ran=ran, skipped=skipped, combined=combined)


def run_job_rules(tables: dict[str, pd.DataFrame], rank_findings: list[Finding], *, ranks: int,
                  step_count: int, mean_step_ns: float, gpu_measured: bool, specs: list[RuleSpec] | None = None,
                  disabled: set[str] | None = None, enabled: set[str] | None = None,
                  preview: bool = False) -> EngineResult:
    """The rules that judge a whole job (``requires: [ranks]``) over its cross-rank tables,
    ranked together with ``rank_findings`` (the single-rank findings, merged across ranks),
    so a cause on one rank nests the symptoms it makes on the others."""
    specs = builtin_specs() if specs is None else specs
    registry = checks()
    facts = {"step_count": step_count, "mean_step_ns": mean_step_ns, "window_ns": 0, "ranks": ranks}
    findings: list[Finding] = list(rank_findings)
    errors: list[str] = []
    ran: list[str] = []
    skipped: dict[str, str] = {}
    for spec in specs:
        if Requirement.ranks not in spec.requires:
            continue
        reason = _why_not(spec, disabled or set(), enabled or set(), preview, facts, gpu_measured)
        check = None if reason else (run_data_rule if spec.is_data_rule else registry.get(spec.id))
        if reason or check is None:
            skipped[spec.id] = reason or "no check is registered for it"
            continue
        context = RuleContext(tables=tables, spec=spec, step_count=step_count, mean_step_ns=mean_step_ns,
                              window_ns=0, gpu_measured=gpu_measured, facts=facts)
        try:
            findings.extend(check(context))
        except Exception as exc:  # noqa: BLE001  (a broken rule must not take the others down)
            errors.append(f"rule {spec.id} failed and was skipped: {failure(exc)}")
            skipped[spec.id] = FAILED + failure(exc)
            continue
        ran.append(spec.id)
    leading = frozenset(spec.id for spec in specs if spec.leads)
    return EngineResult(findings=rank(findings, cause_graph(specs), leading), errors=errors, ran=ran, skipped=skipped)
