"""The rule engine: load rule specs (data), run their checks (code) over the tables, and
turn what they return into ranked findings with symptoms nested under their causes.

A rule is a spec in a YAML pack (id, title, severity, thresholds, which rules' symptoms it
explains, documentation) plus a check function registered under the same id in
advisor.checks. Checks read tables only, through a RuleContext.

The cause graph is a networkx DiGraph with an edge cause -> symptom for each
``explains`` entry. When both ends fire, the symptom is nested under its cause instead of
being ranked beside it; roots are ranked by estimated saving per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import pandas as pd
import yaml
from pydantic import BaseModel, Field, ValidationError

from advisor.errors import RulePackError
from advisor.findings import Finding, Severity
from advisor.paths import rules_dir
from advisor.session import Session


class RuleDocs(BaseModel):
    what: str
    why: str
    example: str = ""
    instead: str = ""


class RuleSpec(BaseModel):
    id: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    title: str
    severity: Severity
    lifecycle: str = Field(default="stable", pattern=r"^(stable|preview|deprecated)$")
    tables: list[str] = Field(default_factory=list)
    explains: list[str] = Field(default_factory=list)
    thresholds: dict[str, float] = Field(default_factory=dict)
    docs: RuleDocs


class RulePack(BaseModel):
    pack: str
    version: int = 1
    redirects: dict[str, str] = Field(default_factory=dict)
    rules: list[RuleSpec]


@dataclass
class RuleContext:
    """What a check may read: the tables, a few facts about the session, its spec."""

    tables: dict[str, pd.DataFrame]
    spec: RuleSpec
    step_count: int
    mean_step_ns: float
    window_ns: int
    gpu_measured: bool
    facts: dict[str, Any] = field(default_factory=dict)

    def threshold(self, name: str) -> float:
        return float(self.spec.thresholds[name])

    def table(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())


Check = Callable[[RuleContext], list[Finding]]
_CHECKS: dict[str, Check] = {}


def register(rule_id: str) -> Callable[[Check], Check]:
    """Decorator: register the check that evaluates rule ``rule_id``."""

    def wrap(func: Check) -> Check:
        _CHECKS[rule_id] = func
        return func

    return wrap


def checks() -> dict[str, Check]:
    import advisor.checks  # noqa: F401  (registers the built-in checks)

    return dict(_CHECKS)


def load_pack(path: Path) -> RulePack:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RulePackError(f"{path}: cannot be read as YAML ({str(exc).splitlines()[0]})") from None
    try:
        return RulePack.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise RulePackError(f"{path}: invalid rule pack: {problems}") from None


def builtin_specs() -> list[RuleSpec]:
    return load_pack(rules_dir() / "builtin.yaml").rules


@dataclass
class EngineResult:
    findings: list[Finding]
    errors: list[str]
    ran: list[str]


def session_facts(session: Session, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """Step count, mean step time and window length, from the tables where they exist."""
    start, end = session.window()
    window_ns = max(end - start, 0)
    model = tables.get("model")
    step_count = 0
    mean_step_ns = float(window_ns)
    if model is not None and "ProfileStep" in model.index:
        row = model.loc["ProfileStep"]
        step_count = int(row.get("calls", 0) or 0)
        if step_count and pd.notna(row.get("cpu_avg_ns")):
            mean_step_ns = float(row["cpu_avg_ns"])
    return {"step_count": step_count, "mean_step_ns": mean_step_ns, "window_ns": window_ns}


# A cause's saving must be at least this share of its symptom's for the symptom to be
# nested under it rather than ranked on its own.
EXPLAINS_MIN_SHARE = 0.25


def cause_graph(specs: list[RuleSpec]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for spec in specs:
        graph.add_node(spec.id)
        for symptom in spec.explains:
            graph.add_edge(spec.id, symptom)
    return graph


def rank(findings: list[Finding], graph: nx.DiGraph) -> list[Finding]:
    """Nest symptoms under their fired causes, then rank the roots by saving."""
    fired = {f.rule for f in findings}
    roots: list[Finding] = []
    by_rule: dict[str, list[Finding]] = {}
    for finding in findings:
        by_rule.setdefault(finding.rule, []).append(finding)
    nested: set[int] = set()
    # A symptom goes under the fired cause with the largest saving; causes are visited
    # in topological order so a chain cause -> cause -> symptom nests fully.
    order = list(nx.topological_sort(graph)) if nx.is_directed_acyclic_graph(graph) else list(graph.nodes)
    for rule_id in reversed(order):
        causes = [c for c in graph.predecessors(rule_id) if c in fired] if rule_id in graph else []
        if not causes or rule_id not in by_rule:
            continue
        best = max((f for c in causes for f in by_rule[c]), key=lambda f: f.saving.ms_per_step)
        for symptom in by_rule[rule_id]:
            # A cause explains a symptom only where it accounts for a real part of it: a
            # 26 us sync does not explain 170 ms of GPU idle time, and nesting it there
            # would hide the larger problem under the smaller.
            if best.saving.ms_per_step < EXPLAINS_MIN_SHARE * symptom.saving.ms_per_step:
                continue
            best.explains.append(symptom)
            nested.add(id(symptom))
    for finding in findings:
        if id(finding) not in nested:
            roots.append(finding)

    def key(f: Finding) -> tuple[float, int]:
        return (-f.saving.ms_per_step, -f.severity.rank)

    for finding in findings:
        finding.explains.sort(key=key)
    return sorted(roots, key=key)


def run_rules(session: Session, tables: dict[str, pd.DataFrame], specs: list[RuleSpec] | None = None,
              *, disabled: set[str] | None = None) -> EngineResult:
    """Run every enabled rule; a rule that fails is reported and skipped."""
    specs = builtin_specs() if specs is None else specs
    disabled = disabled or set()
    registry = checks()
    facts = session_facts(session, tables)
    findings: list[Finding] = []
    errors: list[str] = []
    ran: list[str] = []
    for spec in specs:
        if spec.id in disabled:
            continue
        check = registry.get(spec.id)
        if check is None:
            errors.append(f"rule {spec.id}: no check is registered for it")
            continue
        context = RuleContext(
            tables=tables,
            spec=spec,
            step_count=facts["step_count"],
            mean_step_ns=facts["mean_step_ns"],
            window_ns=facts["window_ns"],
            gpu_measured=session.meta.collector.gpu_measured,
            facts=facts,
        )
        try:
            produced = check(context)
        except Exception as exc:  # a broken rule must not take the others down
            errors.append(f"rule {spec.id} failed and was skipped: {type(exc).__name__}: {exc}")
            continue
        ran.append(spec.id)
        findings.extend(produced)
    return EngineResult(findings=rank(findings, cause_graph(specs)), errors=errors, ran=ran)
