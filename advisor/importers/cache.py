"""The Session of a trace file, kept so the next command on the same trace need not read it.

Reading a large Kineto trace and attributing its events is most of what a command costs;
the result, a Session, saves to Parquet in a fraction of that and loads in less. A cached
Session is keyed by what identifies the file's contents cheaply: its resolved path, size
and modification time, a hash of its first and last 64 KiB, the advisor version, the
session format and the reading code's files. A changed or replaced file misses; so does a
new advisor, or an edited reader or attribution.

The summary tables of that Session are kept beside it (``tables``): after the read they
are most of what is left. They are pure functions of the Session, so they are keyed by
the Session as the command sees it (its metadata: the window, a --gpu target, the notes
of a start-up step left out) and by advisor's own code and knowledge files, so an edited
table or hardware entry misses. They are pickles (a table's attrs hold objects Parquet
cannot), written by and for the user whose cache folder it is (created private).

Where: ``$ADVISOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/advisor``, else
``~/.cache/advisor``. At most ``$ADVISOR_CACHE_MAX_MB`` (default 4096) MiB are kept,
least recently used first out. ``ADVISOR_NO_CACHE=1`` (or ``--no-cache``) reads the trace
afresh and keeps nothing. A cache that cannot be written (a read-only or full disk) is
passed over: the command goes on with the Session it read.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor._version import __version__
from advisor.paths import knowledge_dir
from advisor.session.layout import SESSION_FORMAT

if TYPE_CHECKING:
    from advisor.session import Session

__all__ = ["cache_dir", "cache_key", "cached", "code_fingerprint", "enabled", "holds", "reading_fingerprint", "store",
           "tables"]

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
    digest.update(reading_fingerprint().encode())
    with path.open("rb") as handle:
        digest.update(handle.read(EDGE_BYTES))
        if stat.st_size > 2 * EDGE_BYTES:
            handle.seek(-EDGE_BYTES, os.SEEK_END)
            digest.update(handle.read(EDGE_BYTES))
    return digest.hexdigest()[:32]


def holds(path: Path) -> bool:
    """Whether an entry for ``path`` is kept (not read: ``cached`` reads it)."""
    try:
        return (cache_dir() / cache_key(path) / "session.json").is_file()
    except OSError:
        return False


def cached(path: Path) -> Session | None:
    """The cached Session of ``path``, or None (no entry, or one that cannot be read)."""
    try:
        entry = cache_dir() / cache_key(path)
        if not (entry / "session.json").is_file():
            return None
        from advisor.session import Session

        session = Session.load(entry)
        os.utime(entry)  # recently used
        session.cache_entry = entry
        return session
    except Exception:  # noqa: BLE001  (a damaged entry is a miss, never an error)
        return None


def store(path: Path, session: Session) -> None:
    """Keep ``session`` as the Session of ``path``; quietly nothing where it cannot."""
    try:
        root = cache_dir()
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        entry = root / cache_key(path)
        if entry.exists():
            session.cache_entry = entry
            return
        # Written aside and renamed into place, so a reader never sees half an entry and
        # two commands storing the same trace at once do not collide.
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
        session.save(staging)
        try:
            staging.rename(entry)
        except OSError:  # another command stored it first
            shutil.rmtree(staging, ignore_errors=True)
        session.cache_entry = entry
        _evict(root)
    except Exception:  # noqa: BLE001  (a cache that cannot be written is passed over)
        return


def tables(session: Session, compute: Callable[[Session, list[str] | None], dict[str, Any]],
           names: Iterable[str] | None = None) -> dict[str, Any]:
    """``compute(session, names)``, the summary tables, taken from the cache where the
    session came from it and its tables were kept, else computed (and kept when all were
    asked for). A session from no cache entry, or a cache that cannot be read or written,
    is computed as usual."""
    wanted = list(names) if names is not None else None
    entry = getattr(session, "cache_entry", None)
    if entry is None or not enabled():
        return compute(session, wanted)
    try:
        file = entry / f"tables-{_tables_key(session)}.pkl"
        if file.is_file():
            with file.open("rb") as handle:
                kept = pickle.load(handle)  # the user's own cache, written by advisor
            if wanted is None:
                return kept
            if set(wanted) <= set(kept):
                return {name: kept[name] for name in wanted}
    except Exception:  # noqa: BLE001  (a damaged entry is a miss)
        file = None
    out = compute(session, wanted)
    if wanted is None and file is not None:
        _write_aside(file, out)
    return out


def _tables_key(session: Session) -> str:
    digest = hashlib.sha256(session.meta.model_dump_json().encode())
    digest.update(code_fingerprint().encode())
    return digest.hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def reading_fingerprint() -> str:
    """The code that turns a trace into a Session (advisor.importers, advisor.session) as
    installed: a Session kept by an earlier reader or attribution misses, as the same
    version number would not tell."""
    root = Path(__file__).resolve().parent.parent  # the advisor package
    return _files_fingerprint([*(root / "importers").glob("*.py"), *(root / "session").glob("*.py")])


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """advisor's source and knowledge files as installed: an edited table or hardware
    entry changes it. A few milliseconds over some 200 files."""
    root = Path(__file__).resolve().parent.parent  # the advisor package
    return _files_fingerprint([*root.rglob("*.py"), *knowledge_dir().rglob("*.yaml")])


def _files_fingerprint(paths: list[Path]) -> str:
    """A digest of the advisor version and the files' paths, sizes and mtimes."""
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(paths):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _write_aside(file: Path, value: Any) -> None:
    """Pickle ``value`` to ``file`` through a temporary file renamed into place; quietly
    nothing where it cannot (a full disk, an entry evicted meanwhile)."""
    try:
        with tempfile.NamedTemporaryFile(dir=file.parent, prefix=".tables-", delete=False) as handle:
            pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(handle.name, file)
    except Exception:  # noqa: BLE001
        try:
            os.unlink(handle.name)
        except Exception:  # noqa: BLE001, S110
            pass


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
