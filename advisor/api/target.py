"""A target diagnosed for a caller that is not the command line: a notebook, an agent.

``diagnose_target(path, rules=..., gpu=...)`` reads a trace file, a saved session folder or
a job (a folder of rank traces, a saved job folder) and diagnoses it as `advisor diagnose`
does, through the same facade (advisor.diagnosis) and, for a job, the same job stages. It
runs no script: a target that is one says so. Bad input raises advisor.errors.AdvisorError
with the command's one-line message. Only the rules and the figures change how it reads:
the session cache is used as by the command, nothing else is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from advisor.errors import UsageError

__all__ = ["Diagnosed", "diagnose_target", "selection"]


@dataclass
class Diagnosed:
    """What a target's diagnosis made: the report and the tables it was worded from."""

    report: Any  # advisor.reports.Report
    tables: dict[str, pd.DataFrame]
    said: list[str]  # what the rules said on the way (a pack's problems, a rule that failed)
    session: Any = None  # the steady Session, where the target is one profile (None: a job)


def selection(rules: list[str] | None, said: list[str]) -> Any:
    """The rules to run: the built-in ones, the packs named (validated; a bad one raises),
    and the configuration found in the working folder, as the command would choose them."""
    from advisor.rules.packs.catalog import load_rules
    from advisor.rules.packs.config import find_config, load_config

    from advisor.errors import RulePackError
    from advisor.rules.packs.validate import PackInvalid

    config = load_config(find_config([Path.cwd()]))
    try:
        ruleset = load_rules(list(rules or []), config=config)
    except PackInvalid as exc:
        # The caller may be an agent naming any file this user can read as a pack: what is
        # wrong is said by where, never by the file's keys and values.
        raise RulePackError(exc.without_content()) from None
    said.extend(str(problem) for problem in ruleset.problems)
    chosen = ruleset.configure(config, preview=False)
    said.extend(chosen.notes)
    return chosen


def diagnose_target(target: str | Path, *, rules: list[str] | None = None, gpu: str | None = None) -> Diagnosed:
    """The diagnosis of the trace, saved session or job at ``target`` (see the module)."""
    if not str(target).strip():  # Path("") is the working folder, which no caller meant
        raise UsageError("no target: name a trace file, a saved session folder or a job's folder")
    path = Path(target)
    if path.suffix == ".py":
        raise UsageError(f"{path} is a script: this reads profiles only (a trace, a saved session, a job); "
                         "`advisor diagnose` or `advisor verify` runs a script")
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    said: list[str] = []
    chosen = selection(rules, said)
    target_gpu = None
    if gpu:
        from advisor.knowledge.hardware import gpu_profile

        target_gpu = gpu_profile(gpu).id  # an unknown name is a UsageError
    from advisor.job import job_sources

    sources = job_sources([path])
    if sources is not None:
        return _job(path, sources, chosen, target_gpu, said)
    from advisor.diagnosis import diagnose
    from advisor.importers import load

    session = load(path)
    if target_gpu:
        session.meta = session.meta.model_copy(update={"target_gpu": target_gpu})
    diagnosis = diagnose(session, specs=chosen.specs, disabled=chosen.disabled, enabled=chosen.enabled,
                         preview=chosen.preview)
    said.extend(str(error) for error in diagnosis.result.errors)
    return Diagnosed(diagnosis.report, diagnosis.tables, said, diagnosis.session)


def _job(path: Path, sources: list[Path], chosen: Any, gpu: str | None, said: list[str]) -> Diagnosed:
    from advisor.job import RuleChoice, diagnose_job, order_ranks, summarise_job

    choice = RuleChoice.of(chosen)
    summaries = summarise_job(sources, choice=choice, gpu=gpu, say=lambda line: None)
    job = order_ranks(summaries, source=str(path))
    diagnosis = diagnose_job(job, choice, sources_kept=True)
    said.extend(str(error) for error in diagnosis.errors)
    return Diagnosed(diagnosis.report(), dict(diagnosis.tables), said)
