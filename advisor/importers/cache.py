"""The Session of a trace file, kept so the next command on the same trace need not read it.

Reading a large Kineto trace and attributing its events is most of what a command costs;
the result, a Session, saves to Parquet in a fraction of that and loads in less. A cached
Session is keyed by what identifies the file's contents cheaply: its resolved path, size
and modification time, a hash of its first and last 64 KiB, the advisor version and the
session format. A changed or replaced file misses; so does a new advisor.

Where: ``$ADVISOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/advisor``, else
``~/.cache/advisor``. At most ``$ADVISOR_CACHE_MAX_MB`` (default 4096) MiB are kept,
least recently used first out. ``ADVISOR_NO_CACHE=1`` (or ``--no-cache``) reads the trace
afresh and keeps nothing. A cache that cannot be written (a read-only or full disk) is
passed over: the command goes on with the Session it read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from advisor._version import __version__
from advisor.session import SESSION_FORMAT, Session

__all__ = ["cache_dir", "cache_key", "cached", "enabled", "store"]

EDGE_BYTES = 64 * 1024
DEFAULT_MAX_MB = 4096


def enabled() -> bool:
    return os.environ.get("ADVISOR_NO_CACHE", "").strip() not in ("1", "true", "yes")


def cache_dir() -> Path:
    explicit = os.environ.get("ADVISOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "advisor"


def cache_key(path: Path) -> str:
    """What identifies the trace's contents, hashed."""
    stat = path.stat()
    digest = hashlib.sha256()
    digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{__version__}\0{SESSION_FORMAT}".encode())
    with path.open("rb") as handle:
        digest.update(handle.read(EDGE_BYTES))
        if stat.st_size > 2 * EDGE_BYTES:
            handle.seek(-EDGE_BYTES, os.SEEK_END)
            digest.update(handle.read(EDGE_BYTES))
    return digest.hexdigest()[:32]


def cached(path: Path) -> Session | None:
    """The cached Session of ``path``, or None (no entry, or one that cannot be read)."""
    try:
        entry = cache_dir() / cache_key(path)
        if not (entry / "session.json").is_file():
            return None
        session = Session.load(entry)
        os.utime(entry)  # recently used
        return session
    except Exception:  # noqa: BLE001  (a damaged entry is a miss, never an error)
        return None


def store(path: Path, session: Session) -> None:
    """Keep ``session`` as the Session of ``path``; quietly nothing where it cannot."""
    try:
        root = cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        entry = root / cache_key(path)
        if entry.exists():
            return
        # Written aside and renamed into place, so a reader never sees half an entry and
        # two commands storing the same trace at once do not collide.
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
        session.save(staging)
        try:
            staging.rename(entry)
        except OSError:  # another command stored it first
            shutil.rmtree(staging, ignore_errors=True)
        _evict(root)
    except Exception:  # noqa: BLE001  (a cache that cannot be written is passed over)
        return


def _evict(root: Path) -> None:
    """Drop the least recently used entries beyond the size limit."""
    limit = float(os.environ.get("ADVISOR_CACHE_MAX_MB", DEFAULT_MAX_MB)) * 2**20
    entries = []
    for entry in root.iterdir():
        if entry.is_dir() and not entry.name.startswith("."):
            size = sum(p.stat().st_size for p in entry.iterdir() if p.is_file())
            entries.append((entry.stat().st_mtime, size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries):
        if total <= limit:
            break
        shutil.rmtree(entry, ignore_errors=True)
        total -= size
