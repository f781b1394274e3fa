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
    model: Any = None  # the StepModel, where the target is one profile (None: a job)

    @property
    def session(self) -> Any:
        """The steady Session every figure is of (None: a job)."""
        return self.model.session if self.model is not None else None


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


def diagnose_target(target: str | Path, *, rules: list[str] | None = None, gpu: str | None = None,
                    use_cache: bool | None = None) -> Diagnosed:
    """The diagnosis of the trace, saved session or job at ``target`` (see the module),
    classified and opened by the target stage (advisor.targets) as the command opens it:
    a merged trace split into its ranks, a saved folder's counters attached, the trace
    and its tables through the session cache unless ``use_cache`` is False (None: as
    ``ADVISOR_NO_CACHE`` says, as the command's own default)."""
    from advisor import targets

    if str(target).strip() and targets.is_script(target):
        raise UsageError(f"{target} is a script: this reads profiles only (a trace, a saved session, a job); "
                         "`advisor diagnose` or `advisor verify` runs a script")
    found = targets.classify(target)
    said: list[str] = list(found.said)
    chosen = selection(rules, said)
    target_gpu = targets.gpu_id(gpu)  # an unknown name is a UsageError
    from advisor.importers import cache

    use_cache = cache.wanted() if use_cache is None else use_cache
    if found.is_job:
        return _job(found.path, list(found.sources), chosen, target_gpu, said, use_cache)
    from advisor.diagnosis import cached_tables, diagnose

    session = targets.open_profile(found, gpu=target_gpu, use_cache=use_cache)
    read_from = found.path if use_cache and found.kind == "trace" else None
    diagnosis = diagnose(session, specs=chosen.specs, disabled=chosen.disabled, enabled=chosen.enabled,
                         preview=chosen.preview, tables=cached_tables(read_from))
    said.extend(str(error) for error in diagnosis.result.errors)
    return Diagnosed(diagnosis.report, diagnosis.tables, said, diagnosis.model)


def _job(path: Path, sources: list[Path], chosen: Any, gpu: str | None, said: list[str],
         use_cache: bool) -> Diagnosed:
    from advisor.job import RuleChoice, diagnose_job, order_ranks, summarise_job

    choice = RuleChoice.of(chosen)
    summaries = summarise_job(sources, choice=choice, gpu=gpu, say=lambda line: None, use_cache=use_cache)
    job = order_ranks(summaries, source=str(path))
    diagnosis = diagnose_job(job, choice, sources_kept=True)
    said.extend(str(error) for error in diagnosis.errors)
    return Diagnosed(diagnosis.report(), dict(diagnosis.tables), said)
