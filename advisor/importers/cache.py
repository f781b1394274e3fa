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
table or hardware entry misses. They are kept as JSON data (advisor.importers.frames).

The cache holds data, never code, and only the user's own: nothing in it is unpickled or
imported. The folder, each entry and each file in it must belong to the user and be
writable by no one else; a folder that is not (a shared ``ADVISOR_CACHE_DIR``, a
group-writable ``$XDG_CACHE_HOME``) is not used, said in one line, and the command goes on
uncached; an entry or record that is not is a miss. Every record carries a SHA-256 of
its contents (``checksums.json`` for a Session's files, a first line for the tables and
the reports of advisor.cli.report_cache); a damaged one is dropped and computed again,
never served.

Where: ``$ADVISOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/advisor``, else
``~/.cache/advisor``. At most ``$ADVISOR_CACHE_MAX_MB`` (default 4096) MiB are kept,
least recently used first out. ``ADVISOR_NO_CACHE=1`` (or ``--no-cache``) reads the trace
afresh and keeps nothing: the doors (the command line, the Python API) read that choice
once, ``wanted()``, and pass it down as ``use_cache``; nothing below them reads the
environment. A cache that cannot be written (a read-only or full disk) is
passed over: the command goes on with the Session it read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor._version import __version__
from advisor.paths import knowledge_dir
from advisor.session.layout import SESSION_FORMAT

if TYPE_CHECKING:
    from advisor.session import Session

__all__ = ["cache_dir", "cache_key", "cached", "code_fingerprint", "holds", "read_record", "reading_fingerprint",
           "root", "store", "tables", "wanted", "write_record"]

EDGE_BYTES = 64 * 1024
DEFAULT_MAX_MB = 4096
CHECKSUMS = "checksums.json"  # an entry's manifest: each file of the Session it holds, hashed


def wanted() -> bool:
    """The user's standing choice: False where ``ADVISOR_NO_CACHE`` is set. Read by the
    doors only, which pass it down as ``use_cache``."""
    return os.environ.get("ADVISOR_NO_CACHE", "").strip() not in ("1", "true", "yes")


def cache_dir() -> Path:
    explicit = os.environ.get("ADVISOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "advisor"


def root(*, create: bool = False) -> Path | None:
    """The cache folder where it may be used: the user's own and writable by no one else
    (made so where ``create`` and it is absent). None where it is absent (and not made)
    or cannot be used; a folder that belongs to another user or that others may write
    is said once, on stderr."""
    folder = cache_dir()
    try:
        if create and not os.path.lexists(folder):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = not_private(folder)
    except OSError:
        return None
    if problem is None:
        return folder
    if problem != "absent":
        _said_not_used(str(folder), problem)
    return None


def not_private(path: Path) -> str | None:
    """Why ``path`` may not be trusted as the user's own (another owner, a link, group or
    others may write it), "absent" where there is nothing, or None where it may."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if info.st_uid != os.getuid():
        return f"owned by another user (uid {info.st_uid})"
    writers = [who for bit, who in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others")) if info.st_mode & bit]
    if writers:
        return f"writable by {' and '.join(writers)} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


@functools.lru_cache(maxsize=8)
def _said_not_used(folder: str, problem: str) -> None:
    # Once per folder and reason in a process: several stages ask for the cache.
    print(f"advisor: the cache folder {folder} is {problem}: not used, so nothing in it is read "
          "(the command goes on without a cache; make it your own with mode 700, or set ADVISOR_CACHE_DIR)",
          file=sys.stderr)


def cache_key(path: Path) -> str:
    """What identifies the trace's contents, hashed."""
    stat_ = path.stat()
    digest = hashlib.sha256()
    # The path as bytes: a file name need not be valid text.
    digest.update(os.fsencode(path.resolve()) + b"\0")
    digest.update(f"{stat_.st_size}\0{stat_.st_mtime_ns}\0{__version__}\0{SESSION_FORMAT}".encode())
    digest.update(reading_fingerprint().encode())
    with path.open("rb") as handle:
        digest.update(handle.read(EDGE_BYTES))
        if stat_.st_size > 2 * EDGE_BYTES:
            handle.seek(-EDGE_BYTES, os.SEEK_END)
            digest.update(handle.read(EDGE_BYTES))
    return digest.hexdigest()[:32]


def holds(path: Path) -> bool:
    """Whether an entry for ``path`` is kept (not read: ``cached`` reads it)."""
    try:
        folder = root()
        return folder is not None and (folder / cache_key(path) / CHECKSUMS).is_file()
    except OSError:
        return False


def cached(path: Path) -> Session | None:
    """The cached Session of ``path``, or None (no entry, one that is not the user's own,
    or one that is damaged: that one is dropped)."""
    try:
        folder = root()
        if folder is None:
            return None
        entry = folder / cache_key(path)
        if not_private(entry) is not None or not _intact(entry):
            return None
        from advisor.session import Session

        session = Session.load(entry)
        os.utime(entry)  # recently used
        return session
    except Exception:  # noqa: BLE001  (a damaged entry is a miss, never an error)
        return None


def _intact(entry: Path) -> bool:
    """Whether the entry's Session files are all the user's own and as written; a damaged
    entry (a file changed, missing or unreadable) is removed."""
    try:
        manifest = json.loads(_private_bytes(entry / CHECKSUMS))
        files = manifest["files"]
        if not files or not all(isinstance(n, str) and "/" not in n and n not in (".", "..") for n in files):
            raise ValueError("not a manifest")
        for name, digest in files.items():
            if hashlib.sha256(_private_bytes(entry / name)).hexdigest() != digest:
                raise ValueError(f"{name} changed")
        return True
    except PermissionError:  # not the user's own: left alone
        return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        shutil.rmtree(entry, ignore_errors=True)
        return False


def _private_bytes(file: Path) -> bytes:
    """The contents of ``file``, a regular file of the user's own that no one else may
    write; PermissionError where it is not."""
    problem = not_private(file)
    if problem == "absent":
        raise FileNotFoundError(file)
    if problem is not None:
        raise PermissionError(f"{file} is {problem}")
    if not file.is_file():
        raise PermissionError(f"{file} is not a regular file")
    return file.read_bytes()


def store(path: Path, session: Session) -> None:
    """Keep ``session`` as the Session of ``path``; quietly nothing where it cannot."""
    try:
        folder = root(create=True)
        if folder is None:
            return
        entry = folder / cache_key(path)
        if entry.exists():
            return
        # Written aside and renamed into place, so a reader never sees half an entry and
        # two commands storing the same trace at once do not collide.
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))
        try:
            _write_entry(staging, session)
            staging.rename(entry)
        except Exception:  # noqa: BLE001  (another command stored it first, a full disk)
            shutil.rmtree(staging, ignore_errors=True)
            if not entry.exists():
                return
        _evict(folder)
    except Exception:  # noqa: BLE001  (a cache that cannot be written is passed over)
        return


def _write_entry(staging: Path, session: Session) -> None:
    """The Session's files in ``staging``, the user's alone, and their checksums."""
    session.save(staging)
    files = {}
    for part in sorted(staging.iterdir()):
        part.chmod(0o600)  # whatever the umask
        files[part.name] = hashlib.sha256(part.read_bytes()).hexdigest()
    (staging / CHECKSUMS).write_text(json.dumps({"files": files}))
    (staging / CHECKSUMS).chmod(0o600)


def write_record(file: Path, text: str) -> None:
    """Keep ``text`` in ``file`` (in a cache entry) under a first line that is its SHA-256,
    through a temporary file renamed into place; quietly nothing where it cannot (a full
    disk, an entry evicted meanwhile)."""
    data = text.encode("utf-8", "surrogatepass")
    handle = None
    try:
        with tempfile.NamedTemporaryFile(dir=file.parent, prefix=".record-", delete=False) as handle:
            handle.write(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        os.replace(handle.name, file)
    except Exception:  # noqa: BLE001
        if handle is not None:
            try:
                os.unlink(handle.name)
            except OSError:
                pass


def read_record(file: Path) -> str | None:
    """The text ``write_record`` kept in ``file``; None where there is none, where it is not
    the user's own, or where it is damaged (then it is removed)."""
    try:
        raw = _private_bytes(file)
    except OSError:
        return None
    digest, _newline, data = raw.partition(b"\n")
    if hashlib.sha256(data).hexdigest().encode() != digest:
        try:
            file.unlink()
        except OSError:
            pass
        return None
    return data.decode("utf-8", "surrogatepass")


def tables(session: Session, compute: Callable[[Session, list[str] | None], dict[str, Any]],
           names: Iterable[str] | None = None, *, read_from: Path | None = None) -> dict[str, Any]:
    """``compute(session, names)``, the summary tables, kept in the cache entry of the trace
    file ``read_from``: the caller says the session is (or was derived from) the one read
    from that file through the cache, so its tables are kept beside it. Taken from the entry
    where they were kept, else computed (and kept when all were asked for). No
    ``read_from`` (a session built in memory, read with the cache off, collected from a
    script), no entry for it, or a cache that cannot be read or written: computed as usual."""
    from advisor.importers import frames

    asked = list(names) if names is not None else None
    entry = _entry_of(read_from)
    if entry is None:
        return compute(session, asked)
    file = entry / f"tables-{_tables_key(session)}.json"
    text = read_record(file)
    if text is not None:
        try:
            kept = frames.loads(text)
        except (ValueError, KeyError, TypeError):  # a record of another shape: computed again
            kept = None
        if kept is not None and asked is None:
            return kept
        if kept is not None and set(asked) <= set(kept):
            return {name: kept[name] for name in asked}
    out = compute(session, asked)
    if asked is None:
        try:
            write_record(file, frames.dumps(out))
        except frames.NotData:  # a table that JSON cannot hold exactly: computed each time
            pass
    return out


def _entry_of(read_from: Path | None) -> Path | None:
    """The cache entry kept for the trace file ``read_from``: None where there is none (or
    it is not the user's own, or the file cannot be read)."""
    if read_from is None:
        return None
    try:
        folder = root()
        if folder is None or not read_from.is_file():
            return None
        entry = folder / cache_key(read_from)
    except OSError:
        return None
    return entry if entry.is_dir() and not_private(entry) is None else None


def _tables_key(session: Session) -> str:
    digest = hashlib.sha256(session.meta.json_text().encode())
    digest.update(code_fingerprint().encode())
    return digest.hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def reading_fingerprint() -> str:
    """The code that turns a trace into a Session (advisor.importers, advisor.session) as
    installed: a Session kept by an earlier reader or attribution misses, as the same
    version number would not tell."""
    package = Path(__file__).resolve().parent.parent  # the advisor package
    return _files_fingerprint([*(package / "importers").glob("*.py"), *(package / "session").glob("*.py")])


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """advisor's source and knowledge files as installed: an edited table or hardware
    entry changes it. A few milliseconds over some 200 files."""
    package = Path(__file__).resolve().parent.parent  # the advisor package
    return _files_fingerprint([*package.rglob("*.py"), *knowledge_dir().rglob("*.yaml")])


def _files_fingerprint(paths: list[Path]) -> str:
    """A digest of the advisor version and the files' paths, sizes and mtimes."""
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(paths):
        stat_ = path.stat()
        digest.update(os.fsencode(path) + f"\0{stat_.st_size}\0{stat_.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _evict(folder: Path) -> None:
    """Drop the least recently used entries beyond the size limit."""
    limit = float(os.environ.get("ADVISOR_CACHE_MAX_MB", DEFAULT_MAX_MB)) * 2**20
    entries = []
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."):
            size = sum(p.stat().st_size for p in entry.iterdir() if p.is_file())
            entries.append((entry.stat().st_mtime, size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries):
        if total <= limit:
            break
        shutil.rmtree(entry, ignore_errors=True)
        total -= size
