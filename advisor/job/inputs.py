"""What makes a job: a folder of rank traces, several trace files, or a saved job.

``job_sources`` turns the command line's targets into one source per rank (a trace file
or a saved session folder), or None where the targets are one profile, not a job. The
rank itself comes from each trace's ``distributedInfo`` once a worker has read it
(:mod:`advisor.job.run`); ``rank_from_name`` is the fallback, from the file name.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from advisor.errors import UsageError
from advisor.paths import special_file
from advisor.session import is_session_dir

__all__ = ["JOB_FILE", "MAX_RANKS", "is_job_dir", "job_sources", "rank_from_name", "read_manifest"]

JOB_FILE = "job.json"
JOB_FORMAT = "advisor-job/1"
TRACE_SUFFIXES = (".json", ".json.gz")
# rank-3, rank_3, rank3, worker3, worker_3 (but not the 50 of resnet50), anywhere in the name.
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)


def is_job_dir(path: Path) -> bool:
    """A folder ``advisor diagnose --save`` wrote for a job (it has job.json)."""
    return (path / JOB_FILE).is_file()


def rank_from_name(path: str | Path) -> int | None:
    """The rank a file name gives (rank-3, rank_3, worker3), or None."""
    matches = _RANK_IN_NAME.findall(Path(path).name)
    return int(matches[-1]) if matches else None


def _is_trace(path: Path) -> bool:
    """Anything named like a trace: one that is not a regular file (a FIFO, a device, a
    folder) is kept too, so that its rank's reader says, in the job's notes, why it was
    not read."""
    return path.name.lower().endswith(TRACE_SUFFIXES) and os.path.lexists(path)


def job_sources(targets: list[Path]) -> list[Path] | None:
    """One source per rank, in a stable order, or None where ``targets`` is one profile
    (a single trace or a single saved session). A folder that is neither a session nor a
    job is read as a folder of rank traces: every .json / .json.gz in it, and every saved
    session folder directly inside it."""
    if len(targets) == 1:
        target = targets[0]
        if not target.is_dir() or is_session_dir(target):
            return None
        if is_job_dir(target):
            return [target / entry["session"] for entry in read_manifest(target)["ranks"]]
        found = sorted(p for p in target.iterdir() if _is_trace(p) or (p.is_dir() and is_session_dir(p)))
        if not found:
            raise UsageError(f"{target} holds no traces (.json, .json.gz) and no saved sessions: nothing to diagnose")
        return found
    for target in targets[1:]:
        if not (_is_trace(target) or (target.is_dir() and is_session_dir(target))):
            raise UsageError(f"arguments after {targets[0]} are only for scripts, and {targets[0]} is not a .py "
                             f"script ({target} is not a trace or saved session to read with it as one job)")
    return list(targets)


# More ranks than any job runs: a bound, so a damaged or hostile job.json cannot make
# advisor hold a row per rank of a world of 10^12.
MAX_RANKS = 1_000_000


class _RankEntry(BaseModel):
    """One rank of a saved job: its number and its session, a folder inside the job's."""

    model_config = ConfigDict(extra="ignore")
    rank: int = Field(ge=0, lt=MAX_RANKS)
    session: str = Field(min_length=1, max_length=255)
    rank_from: str | None = None
    source: str | None = None
    exit_code: int | None = Field(default=None, ge=-(2**31), lt=2**31)
    ending: str | None = None


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: str
    command: list[str] | None = None
    exit_code: int | None = Field(default=None, ge=-(2**31), lt=2**31)
    world_size: int | None = Field(default=None, ge=1, le=MAX_RANKS)
    ranks: list[_RankEntry] = Field(min_length=1, max_length=MAX_RANKS)


def read_manifest(folder: Path) -> dict:
    """A saved job's manifest (job.json), checked: its types, rank and world-size bounds,
    and each rank's session a folder directly inside the job's folder (never a path
    elsewhere, which a job copied from someone else could name)."""
    file = folder / JOB_FILE
    special = special_file(file)
    if special is not None:
        raise UsageError(f"{file} is {special}, not a job manifest")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"{file} cannot be read: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(raw, dict) or raw.get("format") != JOB_FORMAT:
        raise UsageError(f"{file} is not an advisor job manifest ({JOB_FORMAT})")
    try:
        manifest = _Manifest.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise UsageError(f"{file} is not a valid job manifest: {where}: {error['msg']}") from None
    seen: set[int] = set()
    folders: dict[Path, int] = {}  # each rank's session folder, resolved, and the rank that names it
    inside = folder.resolve()
    for entry in manifest.ranks:
        if entry.rank in seen:
            raise UsageError(f"{file} is not a valid job manifest: rank {entry.rank} is listed twice")
        seen.add(entry.rank)
        if manifest.world_size is not None and entry.rank >= manifest.world_size:
            raise UsageError(f"{file} is not a valid job manifest: rank {entry.rank} of a world of "
                             f"{manifest.world_size}")
        name = entry.session
        if name in (".", "..") or "/" in name or "\\" in name or "\0" in name \
                or (folder / name).resolve().parent != inside:
            raise UsageError(f"{file} is not a valid job manifest: rank {entry.rank}'s session must be a folder "
                             f"inside {folder}, not {name!r}")
        # Two ranks reading one session would be one rank's profile counted twice, a job that did not run.
        own = (folder / name).resolve()
        if own in folders:
            raise UsageError(f"{file} is not a valid job manifest: ranks {folders[own]} and {entry.rank} name the "
                             f"same session folder {name!r}")
        folders[own] = entry.rank
    return manifest.model_dump()


def write_manifest(folder: Path, ranks: list[dict], *, command: list[str] | None = None,
                   exit_code: int | None = None, world_size: int | None = None) -> Path:
    """Write job.json: the job's ranks, each with its saved session folder (relative), and
    where a launcher ran, its command and exit code."""
    path = folder / JOB_FILE
    path.write_text(json.dumps({"format": JOB_FORMAT, "command": command, "exit_code": exit_code,
                                "world_size": world_size, "ranks": ranks}, indent=2))
    return path
