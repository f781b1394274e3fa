"""The ledger: every saving advisor promised beside the saving measured when the fix was
applied, kept so that "can I trust the saving" has an answer per rule.

Each ``advisor verify`` run adds a record per fix it measured (the user's ledger,
``ledger_path()``), and each pair of ``benchmarks/savings.py`` adds one to the project's
own (``benchmarks/ledger.jsonl``, committed). A record is one JSON line: the rule, the
predicted saving and its range, the measured saving and its spread, the step before, the
machine, its load and the date. ``summarise`` turns records into a row per rule: how many,
the median of measured over predicted, how often the measurement fell inside the range,
and the records where the fix made the step slower while a saving was promised.

Records are data: read back with pydantic, never evaluated; a line that does not parse is
counted and skipped, never a reason to lose the others.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

__all__ = ["ENV_PATH", "LedgerEntry", "RuleRow", "append", "ledger_path", "load_per_core", "read", "summarise"]

ENV_PATH = "ADVISOR_LEDGER"
MAX_LINE_BYTES = 64 * 1024  # a record is a few hundred bytes; a longer line is not one of ours


class LedgerEntry(BaseModel):
    """One promise and its measurement."""

    rule: str
    source: str = Field(description="'verify' (advisor verify on the user's script) or 'savings' "
                                    "(benchmarks/savings.py, a planted example and its fixed twin).")
    target: str = Field(default="", description="The script (and its arguments) or the pair's name.")
    fix: str = Field(default="", description="The fix applied, in words.")
    predicted_ms: float = Field(description="The finding's saving, ms per step.")
    low_ms: float | None = None
    high_ms: float | None = None
    measured_ms: float = Field(description="The saving measured, ms per step (negative: the step got slower).")
    spread_ms: float | None = Field(default=None, ge=0, description="The measurement's spread (standard deviation "
                                                                      "over its runs), ms.")
    before_ms: float | None = Field(default=None, description="The step without the fix, as measured, ms.")
    machine: str = ""
    load_per_core: float | None = None
    date: str = ""
    version: str = ""

    @property
    def ratio(self) -> float | None:
        """measured / predicted (None where nothing was promised)."""
        return self.measured_ms / self.predicted_ms if self.predicted_ms > 0 else None

    @property
    def inside(self) -> bool:
        low = self.low_ms if self.low_ms is not None else self.predicted_ms
        high = self.high_ms if self.high_ms is not None else self.predicted_ms
        return low - 1e-9 <= self.measured_ms <= high + 1e-9

    @property
    def sign_wrong(self) -> bool:
        """A saving promised and the step measured slower, by more than its spread."""
        return self.predicted_ms > 0 and self.measured_ms < -(self.spread_ms or 0.0)


def ledger_path() -> Path:
    """$ADVISOR_LEDGER, else $XDG_DATA_HOME/advisor/ledger.jsonl, else
    ~/.local/share/advisor/ledger.jsonl."""
    explicit = os.environ.get(ENV_PATH, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    data = os.environ.get("XDG_DATA_HOME", "").strip()
    base = Path(data).expanduser() if data else Path.home() / ".local" / "share"
    return base / "advisor" / "ledger.jsonl"


def this_machine() -> str:
    """'Intel(R) Xeon(R) ..., 2 logical cores'."""
    from advisor.knowledge.cpu import this_processor

    return f"{this_processor()}, {os.cpu_count()} logical cores"


def load_per_core() -> float | None:
    """The 1-minute load average over the logical cores (None where the system has none)."""
    try:
        return round(os.getloadavg()[0] / (os.cpu_count() or 1), 2)
    except (AttributeError, OSError):
        return None


def stamp(entry: LedgerEntry) -> LedgerEntry:
    """The entry with the machine, its load, the date and advisor's version filled in where empty."""
    from advisor._version import __version__

    return entry.model_copy(update={
        "machine": entry.machine or this_machine(),
        "load_per_core": entry.load_per_core if entry.load_per_core is not None else load_per_core(),
        "date": entry.date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "version": entry.version or __version__,
    })


def append(entries: Iterable[LedgerEntry], path: str | Path | None = None) -> Path:
    """Add ``entries`` (stamped) to the ledger at ``path`` (default ``ledger_path()``), one
    line each, creating its folder; the file is only ever appended to."""
    target = Path(path) if path is not None else ledger_path()
    lines = [stamp(e).model_dump_json() + "\n" for e in entries]
    if not lines:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One write per call, in append mode: records of two runs do not interleave within a line.
    with open(target, "a", encoding="utf-8") as handle:
        handle.write("".join(lines))
    return target


@dataclass
class Read:
    """The records of a ledger, and how many lines were not records."""

    entries: list[LedgerEntry] = field(default_factory=list)
    skipped: int = 0


def read(path: str | Path) -> Read:
    """The ledger's records (a missing file: none)."""
    out = Read()
    target = Path(path)
    if not target.is_file():
        return out
    with open(target, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            if len(line) > MAX_LINE_BYTES:
                out.skipped += 1
                continue
            try:
                out.entries.append(LedgerEntry.model_validate(json.loads(line)))
            except (ValueError, ValidationError):
                out.skipped += 1
    return out


@dataclass(frozen=True)
class RuleRow:
    """A rule's record in the ledger."""

    rule: str
    records: int
    median_ratio: float | None  # measured / predicted, over the records that promised a saving
    inside: float  # share of records whose measurement fell inside the range
    sign_wrong: tuple[str, ...]  # the targets whose step got slower where a saving was promised


def summarise(entries: Iterable[LedgerEntry]) -> list[RuleRow]:
    """A row per rule, most records first."""
    by_rule: dict[str, list[LedgerEntry]] = {}
    for entry in entries:
        by_rule.setdefault(entry.rule, []).append(entry)
    rows = []
    for rule, mine in by_rule.items():
        ratios = [e.ratio for e in mine if e.ratio is not None]
        rows.append(RuleRow(rule=rule, records=len(mine),
                            median_ratio=statistics.median(ratios) if ratios else None,
                            inside=sum(e.inside for e in mine) / len(mine),
                            sign_wrong=tuple(e.target or e.fix or "?" for e in mine if e.sign_wrong)))
    return sorted(rows, key=lambda r: (-r.records, r.rule))
