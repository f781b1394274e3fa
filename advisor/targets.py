"""What the user named, classified once, and opened the same way by every door.

The command line, the Python API (advisor.api.target), the MCP server and the notebook all
start from a target: a path, and for a script the arguments after it. ``classify`` says
once what it is:

    script    a ``.py`` file, run under the collectors (the command line and verify only)
    trace     one trace file (Kineto JSON, gzipped or not)
    session   a saved session folder (``session.json`` and ``events.parquet``)
    job       one source per rank: a folder of rank traces, a saved job, several traces
    merged    one trace that merges a job's ranks (TraceFusion's layout), split into a
              trace per rank in a folder of its own, then read as a job

and the helpers below are the one place where a profile is opened (``open_profile``: read
through the session cache), judged against a chosen GPU (``with_gpu``) and given Nsight
Compute's counters (``with_counters``: ``--ncu`` exports, or those a saved folder holds).
A door that skipped one of them would diagnose the same target differently from the
others.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import UsageError

__all__ = ["KINDS", "Target", "classify", "is_script", "open_profile", "with_counters", "with_gpu"]

KINDS = ("script", "trace", "session", "job", "merged")


@dataclass(frozen=True)
class Target:
    """A classified target: its path, its kind (KINDS), a job's rank sources (``job`` and
    ``merged``), the script's arguments, and what classifying it said (a merge's split)."""

    path: Path
    kind: str
    sources: tuple[Path, ...] = ()
    args: tuple[str, ...] = ()
    said: tuple[str, ...] = field(default=())

    @property
    def is_job(self) -> bool:
        return self.kind in ("job", "merged")


def is_script(path: Path | str) -> bool:
    """Whether ``path`` names a script advisor runs (rather than a profile it reads)."""
    return Path(path).suffix == ".py"


def classify(target: str | Path, more: Sequence[str] = (), *, split_merged: bool = True) -> Target:
    """What ``target`` is (the module docstring). ``more``: what the user typed after it (a
    script's arguments, or more traces of a job). A merged trace is split (where
    ``split_merged``) into a temporary folder removed at exit. UsageError, in one line,
    for what names nothing or is no target."""
    if not str(target).strip():  # Path("") is the working folder, which no caller meant
        raise UsageError("no target: name a script, a trace file, a saved session folder or a job's folder")
    path = Path(target)
    if is_script(path):
        return Target(path, "script", args=tuple(str(a) for a in more))
    from advisor.job import job_sources

    sources = job_sources([path, *(Path(a) for a in more)])
    if sources is not None:
        return Target(path, "job", tuple(sources))
    if more:
        raise UsageError(f"arguments after {path} are only for scripts, and {path} is not a .py script")
    if path.is_dir():
        return Target(path, "session")
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if split_merged:
        merged = _split_merged(path)
        if merged is not None:
            return merged
    return Target(path, "trace")


def _split_merged(path: Path) -> Target | None:
    """``path`` as a ``merged`` target where it merges two ranks or more, else None."""
    from advisor.importers.merged import merged_ranks, split

    if not path.is_file() or not merged_ranks(path):
        return None
    folder = Path(tempfile.mkdtemp(prefix="advisor-ranks-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    try:
        done = split(path, folder)
    except (OSError, ValueError, RecursionError, zlib.error, MemoryError) as exc:
        raise UsageError(f"{path} merges several ranks but cannot be split: {' '.join(str(exc).split())[:200]}") \
            from None
    if len(done.files) < 2:
        return None
    said = [(f"{path.name} merges the traces of {len(done.files)} ranks into one file: each rank is read as its "
             "own trace and diagnosed as a job")]
    if done.said():
        said.append(done.said())
    return Target(path, "merged", tuple(done.files), said=tuple(said))


def open_profile(target: Target, *, gpu: str | None = None, ncu: Sequence[Path] = (),
                 progress: Callable[..., Any] | None = None, ahead: Any = None,
                 processes: int | None = None, give_back: bool = False, use_cache: bool = True) -> Any:
    """The Session of a ``trace`` or ``session`` target, read through the session cache
    where ``use_cache`` (``progress``, ``ahead``, ``processes``, ``give_back`` and
    ``use_cache`` as advisor.importers.load takes them), judged against ``gpu`` and given
    its counters (``with_gpu``, ``with_counters``)."""
    if target.kind not in ("trace", "session"):
        raise UsageError(f"{target.path} is a {target.kind}, not one profile")
    from advisor.importers import load

    kwargs: dict[str, Any] = {"give_back": give_back, "use_cache": use_cache}
    if progress is not None:
        kwargs["progress"] = progress
    if ahead is not None:
        kwargs["ahead"] = ahead
    if processes is not None:
        kwargs["processes"] = processes
    session = load(target.path, **kwargs)
    return with_counters(with_gpu(session, gpu), target.path, ncu)


def gpu_id(gpu: str | None) -> str | None:
    """The knowledge base's id of the GPU named ``gpu`` (None for none); an unknown name
    is a UsageError, said before anything runs or is read."""
    if not gpu:
        return None
    from advisor.knowledge.hardware import gpu_profile

    return gpu_profile(gpu).id


def with_gpu(session: Any, gpu: str | None) -> Any:
    """``session`` judged against the GPU named ``gpu`` (the same session where None)."""
    chosen = gpu_id(gpu)
    if chosen:
        session.meta = session.meta.model_copy(update={"target_gpu": chosen})
    return session


def with_counters(session: Any, path: Path, ncu: Sequence[Path] = ()) -> Any:
    """``session`` with Nsight Compute's counters: the exports given (``--ncu``), or those
    a saved folder at ``path`` holds beside its session (ncu*.csv, *.ncu-rep)."""
    from advisor.importers.ncu import attach, exports_in

    paths = [Path(p) for p in ncu]
    if not paths and Path(path).is_dir():
        paths = exports_in(Path(path))
    return attach(session, paths) if paths else session
