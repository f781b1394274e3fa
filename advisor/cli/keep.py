"""What a run collected, kept on disk until its report is written.

A script's profile lives in memory until the report is written, and a launched job's
ranks in a temporary folder. When a step after the collection fails (out of memory, a
full disk, a report path that cannot be written, Ctrl-C), what was collected must not go
with it: a script's session is saved before the analysis starts, in the cache folder
(else the temporary one), and removed once the report is written; on a failure it stays,
and the one ``advisor:`` line that says what failed also says where it is and that
``advisor diagnose DIR`` reports it again.

--save folders are claimed by one run: a marker file made with O_EXCL, so two runs
started at once into one folder cannot both write there; the second stops with one line.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from advisor.errors import UsageError

__all__ = ["SAVING_MARK", "Kept", "check_save_dir", "save_whole"]

SAVING_MARK = ".advisor-saving"
_claimed: set[Path] = set()


def check_save_dir(folder: Path) -> None:
    """Claim ``folder`` for this run's --save: a new or empty folder, never over another
    profile nor beside another run saving into it. Claiming twice in one run is a no-op."""
    if folder.resolve() in _claimed:
        return
    if (folder / SAVING_MARK).exists():
        if _claimant_alive(folder / SAVING_MARK):
            raise UsageError(f"--save {folder}: another advisor run is saving into this folder; give a new folder")
        (folder / SAVING_MARK).unlink(missing_ok=True)  # left by a run that was killed: no claim
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--save {folder}: is a file; give a new folder")
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"--save {folder}: the folder exists and is not empty; give a new folder")
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mark = os.open(folder / SAVING_MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another run claimed it between the look and the claim
        raise UsageError(f"--save {folder}: another advisor run is saving into this folder; give a new "
                         "folder") from None
    except OSError as exc:
        raise UsageError(f"--save {folder}: cannot be written ({exc.strerror or exc})") from None
    os.write(mark, f"{os.getpid()}\n".encode())
    os.close(mark)
    _claimed.add(folder.resolve())
    atexit.register(_release, folder, made)


def _claimant_alive(mark: Path) -> bool:
    """Whether the process named in a claim's marker still runs (a run killed by a signal
    cannot take its marker away; this machine's pids only)."""
    try:
        pid = int(mark.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return True  # unreadable: being written this moment, or not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, another user's
        return True
    return True


def _release(folder: Path, made: bool) -> None:
    """The claim ends with the run; a folder this run made and left empty goes too."""
    try:
        (folder / SAVING_MARK).unlink()
        if made and not any(folder.iterdir()):
            folder.rmdir()
    except OSError:
        pass
    _claimed.discard(folder.resolve())


class Kept:
    """Where this run's collected profile waits for its report, if anywhere."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self._temporary = False

    def session(self, session, name: str) -> None:
        """Save a script's ``session`` before it is analysed; quietly nothing where no
        folder can be written (the failure, if one comes, then says so)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for root in _roots():
            try:
                root.mkdir(mode=0o700, parents=True, exist_ok=True)
                folder = Path(tempfile.mkdtemp(prefix=f"run-{name}-{stamp}-", dir=root))
                save_whole(session, folder)
            except OSError:
                continue
            except KeyboardInterrupt:  # raised once the save was whole: it is kept
                self.folder, self._temporary = folder, True
                raise
            self.folder, self._temporary = folder, True
            return

    def launch(self, folder: Path | str) -> None:
        """A launched job's ranks, already saved in their own temporary folder."""
        self.folder, self._temporary = Path(folder), True

    def saved(self, folder: Path) -> None:
        """Saved where the user asked (--save): kept whatever happens."""
        self.folder, self._temporary = Path(folder), False

    def done(self) -> None:
        """The report is written: what was kept for it goes."""
        if self.folder is not None and self._temporary:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def note(self) -> str:
        """What a failure line adds: where the profile is, or that none was kept."""
        if self.folder is None or not self.folder.exists():
            return ""
        how = "saved" if not self._temporary else "kept"
        return f"; the profile collected is {how} in {self.folder} (`advisor diagnose {self.folder}` reports it)"


def save_whole(session, folder: Path) -> None:
    """``session.save(folder)``, whole or not at all: a Ctrl-C meanwhile waits until the
    save is done (a session is written in well under a second; the KeyboardInterrupt then
    comes with the session whole on disk), and a save that fails (a
    full disk) takes away what it wrote, leaving the folder as it found it (empty) and
    raising the OS's error with the folder named."""
    try:
        with _interrupts_deferred():
            session.save(folder)
    except OSError as exc:
        for part in folder.iterdir() if folder.is_dir() else []:
            if part.name != SAVING_MARK:
                shutil.rmtree(part, ignore_errors=True) if part.is_dir() else part.unlink(missing_ok=True)
        raise OSError(exc.errno, f"cannot save the session in {folder} ({exc.strerror or exc})") from None


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """SIGINT held back for the duration (then raised as KeyboardInterrupt), where this is
    the main thread; elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if came:
        raise KeyboardInterrupt


def _roots() -> list[Path]:
    from advisor.importers.cache import cache_dir

    # Hidden from the cache's eviction: a kept profile stays until the user deals with it.
    return [cache_dir() / ".kept", Path(tempfile.gettempdir())]
