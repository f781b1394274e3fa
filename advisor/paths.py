"""Where advisor's data folders (rules/, knowledge/, cases/) are, installed or not.

A wheel carries rules/ and knowledge/ inside the package as advisor/_data/...; a checkout
(and an editable install) has all three at the top of the repository, beside the package.
cases/ is test data and stays in the repository.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder ``name`` (``rules``, ``knowledge`` or ``cases``)."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"advisor's {name}/ folder is missing from this installation")


def rules_dir() -> Path:
    return data_dir("rules")


def knowledge_dir() -> Path:
    return data_dir("knowledge")


def cases_dir() -> Path:
    return data_dir("cases")


def table_columns_file() -> Path:
    """The summary tables' columns as a file (advisor/schemas/table_columns.json), written
    by ``python -m advisor.tables.columns``: rule packs are checked against it without
    importing the tables (and pandas)."""
    return _PACKAGE / "schemas" / "table_columns.json"


def special_file(path: str | Path) -> str | None:
    """What ``path`` is where it is not a regular file or folder of data ("a FIFO", "a
    character device"...), told without opening it: reading a FIFO blocks until someone
    writes to it, and a device never ends. Files of the kernel's own file systems (/proc,
    /sys) are refused too: they call themselves regular, are made as they are read, and
    some block until the kernel has something to say (/proc/kmsg). None for a file, a
    folder, or nothing there."""
    try:
        mode = (info := os.stat(path)).st_mode
    except (OSError, ValueError):  # absent, unreadable, a NUL in the name: the reader says so
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        if _of_the_kernel(path, info):
            return f"a {'file' if stat.S_ISREG(mode) else 'folder'} of the kernel's (/proc, /sys)"
        return None
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


# The kernel's pseudo-file systems, where they are mounted on every Linux system.
_KERNEL_MOUNTS = ("/proc", "/sys")


def _of_the_kernel(path: str | Path, info: os.stat_result) -> bool:
    """Whether ``path`` (whose stat is ``info``) lies on /proc or /sys: the same device as
    either mount, or a path inside either once links are followed."""
    for mount in _KERNEL_MOUNTS:
        try:
            if os.stat(mount).st_dev == info.st_dev:
                return True
        except OSError:
            continue
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    return any(real == mount or real.startswith(mount + os.sep) for mount in _KERNEL_MOUNTS)
