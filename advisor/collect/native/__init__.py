"""advisor's native op recorder: compiled from its C++ source on first use, loaded with ctypes.

The CUPTI collector records every op the script runs (advisor.collect.op_recorder). In C++,
through torch's RecordFunction callbacks, that costs about what torch.profiler's recording
costs and leaves torch.compile alone; in Python it costs tens of microseconds an op. The
source (``op_recorder.cpp``, beside this file) includes torch's headers, so it is built
against the torch that runs the script, by the C++ compiler torch extensions use (``$CXX``,
else ``c++``/``g++``), once per torch, Python and source version.

Where the library is kept: compiled code, so not in advisor's data cache (which holds data
only): ``$ADVISOR_NATIVE_DIR``, else ``$XDG_CACHE_HOME/advisor-native``, else
``~/.cache/advisor-native``, one folder per build key. The folder and the library must be the
user's own and writable by no one else (as the data cache's folders), and the library's
SHA-256 must match the one written when it was built; otherwise it is built again in a
fresh folder. A build runs in a temporary folder and is moved into place whole, under a
lock, so ranks of one job starting together build it once.

:func:`load` returns the loaded library or the one-line reason there is none (no compiler,
the build failed, an old torch); the collector then records ops in Python and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from advisor.importers.cache import not_private
from advisor.units import shown_safely

__all__ = ["ABI", "SOURCE", "build_key", "load", "native_dir"]

SOURCE = Path(__file__).with_name("op_recorder.cpp")
ABI = 1  # advisor_ops_abi() of the source this module drives
LIBRARY = "libadvisor_ops.so"
RECORD = "build.json"
BUILD_TIMEOUT_S = 600
# -DNDEBUG as torch's own release build: torch's headers lay some classes out differently
# without it (RecordFunction holds a debug-only member).
FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-w", "-DNDEBUG")
_loaded: dict[str, Any] = {}  # build key -> the CDLL, for the life of the process (a library is never unloaded)


def native_dir() -> Path:
    explicit = os.environ.get("ADVISOR_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "advisor-native"


def compiler() -> str | None:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def build_key(torch: Any, cxx: str) -> str:
    """What the library depends on: its source and flags, torch (version and place), the
    Python, the machine and the compiler."""
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    for part in (*FLAGS, torch.__version__, os.path.dirname(torch.__file__), sys.version, platform.machine(), cxx,
                 str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", ""))):
        digest.update(str(part).encode() + b"\0")
    return digest.hexdigest()[:24]


def load(torch: Any, *, say: Callable[[str], None] | None = None) -> tuple[Any, str | None]:
    """The native op recorder for ``torch`` (building it where none is kept), or None and
    the one-line reason."""
    if sys.platform != "linux":
        return None, f"the native op recorder is built on Linux only (this is {sys.platform})"
    cxx = compiler()
    if cxx is None:
        return None, "no C++ compiler (set CXX, or install g++) to build the native op recorder"
    key = build_key(torch, cxx)
    if key in _loaded:
        return _loaded[key], None
    folder = native_dir() / key
    problem = _trusted(folder)
    if problem is not None:
        try:
            with _build_lock(native_dir(), say):
                problem = _trusted(folder)  # another process may have built it meanwhile
                if problem is not None:
                    if say is not None:
                        say(f"building advisor's op recorder for torch {torch.__version__} (once; up to a minute)")
                    reason = _build(torch, cxx, folder)
                    if reason is not None:
                        return None, reason
                    problem = _trusted(folder)
        except OSError as exc:
            return None, f"the native op recorder could not be built in {native_dir()} ({exc.strerror or exc})"
        if problem is not None:
            return None, f"the native op recorder in {folder} is not used: {problem}"
    try:
        library = ctypes.CDLL(str(folder / LIBRARY))
        _declare(library)
        if library.advisor_ops_abi() != ABI:
            return None, "the native op recorder speaks another interface version; it will be built again"
    except (OSError, AttributeError) as exc:
        return None, f"the native op recorder could not be loaded ({' '.join(str(exc).split())[:200]})"
    _loaded[key] = library
    return library, None


def _trusted(folder: Path) -> str | None:
    """Why the library in ``folder`` may not be loaded, or None where it may: the folder,
    the library and its build record the user's own, and the library as it was built."""
    for path in (folder.parent, folder, folder / LIBRARY, folder / RECORD):
        problem = not_private(path)
        if problem == "absent":
            return "not built yet"
        if problem is not None:
            return f"{path} is {problem}"
    try:
        record = json.loads((folder / RECORD).read_text())
        actual = hashlib.sha256((folder / LIBRARY).read_bytes()).hexdigest()
    except (OSError, ValueError) as exc:
        return f"its build record cannot be read ({exc})"
    if not isinstance(record, dict) or record.get("sha256") != actual:
        return "the library is not the one that was built (its checksum differs)"
    return None


@contextlib.contextmanager
def _build_lock(root: Path, say: Callable[[str], None] | None = None,
                wait_s: float = BUILD_TIMEOUT_S + 30) -> Iterator[None]:
    """The build folder's lock. Where another process holds it (building the recorder),
    ``say`` says so once and the wait is bounded by ``wait_s`` (the other build's own
    bound and a margin): past it, an OSError, and the run goes on without the recorder."""
    import fcntl  # noqa: PLC0415  (Linux only, as the recorder)

    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = not_private(root)
    if problem is not None:
        raise OSError(0, f"{root} is {problem}")
    with open(root / ".lock", "a") as handle:
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and say is not None:
                    say(f"waiting for another advisor process building the op recorder (up to {wait_s:.0f} s)")
                    told = True
                if time.monotonic() > deadline:
                    raise OSError(0, f"another process held the build lock {root / '.lock'} for over {wait_s:.0f} s")
                time.sleep(0.25)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(torch: Any, cxx: str, folder: Path) -> str | None:
    """Compile the source into ``folder`` (replacing what is there); the reason it failed, or None."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    staging = Path(tempfile.mkdtemp(prefix="build-", dir=folder.parent))
    try:
        target = staging / LIBRARY
        command = [cxx, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes,
                   str(SOURCE), f"-L{lib_dir}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib_dir}", "-o", str(target)]
        began = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return f"building the native op recorder took over {BUILD_TIMEOUT_S} s and was stopped"
        except OSError as exc:
            return f"the C++ compiler {cxx} could not run ({exc.strerror or exc})"
        if done.returncode != 0 or not target.is_file():
            first = shown_safely(next((line.strip() for line in done.stderr.splitlines() if "error" in line), ""))
            return f"building the native op recorder failed ({first[:200] or f'{cxx} exited {done.returncode}'})"
        os.chmod(target, 0o700)  # the user's own, whatever the umask: _trusted checks it
        record = {"sha256": hashlib.sha256(target.read_bytes()).hexdigest(), "torch": torch.__version__,
                  "compiler": cxx, "seconds": round(time.monotonic() - began, 1),
                  "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (staging / RECORD).write_text(json.dumps(record))
        os.chmod(staging / RECORD, 0o600)
        os.chmod(staging, 0o700)
        if os.path.lexists(folder):
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
        return None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _declare(library: Any) -> None:
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    library.advisor_ops_abi.restype = ctypes.c_int
    library.advisor_ops_configure.argtypes = [ptr, ptr, ctypes.c_int, ctypes.c_int, i64]
    library.advisor_ops_configure.restype = None
    library.advisor_ops_start.restype = ctypes.c_int
    library.advisor_ops_stop.restype = None
    for name in ("advisor_ops_next_id", "advisor_ops_dropped", "advisor_ops_count", "advisor_ops_strings"):
        getattr(library, name).restype = i64
    library.advisor_ops_take.argtypes = [i64] + [ctypes.POINTER(i64)] * 4 + [ctypes.POINTER(i32)] * 4
    library.advisor_ops_take.restype = i64
    library.advisor_ops_string.argtypes = [i64]
    library.advisor_ops_string.restype = ctypes.c_char_p
