"""What makes a job: a folder of rank traces, several trace files, or a saved job.

``job_sources`` turns the command line's targets into one source per rank (a trace file
or a saved session folder), or None where the targets are one profile, not a job. The
rank itself comes from each trace's ``distributedInfo`` once a worker has read it
(:mod:`advisor.job.run`); ``rank_from_name`` is the fallback, from the file name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from advisor.errors import UsageError
from advisor.session import is_session_dir

__all__ = ["JOB_FILE", "is_job_dir", "job_sources", "rank_from_name", "read_manifest"]

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
    return path.is_file() and path.name.lower().endswith(TRACE_SUFFIXES)


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


def read_manifest(folder: Path) -> dict:
    """A saved job's manifest (job.json), checked enough to render it again."""
    try:
        manifest = json.loads((folder / JOB_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{folder / JOB_FILE} cannot be read: {exc}") from None
    if manifest.get("format") != JOB_FORMAT or not isinstance(manifest.get("ranks"), list):
        raise UsageError(f"{folder / JOB_FILE} is not an advisor job manifest ({JOB_FORMAT})")
    return manifest


def write_manifest(folder: Path, ranks: list[dict], *, command: list[str] | None = None,
                   exit_code: int | None = None, world_size: int | None = None) -> Path:
    """Write job.json: the job's ranks, each with its saved session folder (relative), and
    where a launcher ran, its command and exit code."""
    path = folder / JOB_FILE
    path.write_text(json.dumps({"format": JOB_FORMAT, "command": command, "exit_code": exit_code,
                                "world_size": world_size, "ranks": ranks}, indent=2))
    return path
