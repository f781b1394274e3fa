"""The script run once more under Nsight Compute, for the counters of the kernels that matter.

``advisor diagnose --kernel-counters [N|REGEX] train.py``: after the usual run, the kernels
the diagnosis puts at stake (the top N by GPU time, or those matching REGEX) are profiled
with hardware counters in a second run of the script under ``ncu``, limited to them: a
kernel-name regex, a launch skip past the warm-up steps and a launch count of a few each,
and the sections that say why a kernel is slow (SpeedOfLight, Occupancy, LaunchStats,
ComputeWorkloadAnalysis, MemoryWorkloadAnalysis). ncu replays each profiled launch some
tens of times, so the run is bounded in time and says what it costs before it starts; it
is skipped with one line where ncu is missing, where the GPU does not allow counters
(ERR_NVGPUCTRPERM, a virtualised GPU) or where it fails.

:func:`plan` chooses the kernels and builds the command (a pure function, tested without a
GPU); :func:`run` runs it and returns the exported report, or the one-line reason there is none.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

__all__ = ["NcuPlan", "SECTIONS", "find_ncu", "plan", "run"]

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")
LAUNCHES_EACH = 3  # launches profiled per chosen kernel
DEFAULT_TIMEOUT_S = 600
MAX_PATTERN = 2000  # characters of kernel-name regex


@dataclass(frozen=True)
class NcuPlan:
    kernels: tuple[str, ...]  # the kernels chosen (base names)
    pattern: str  # the kernel-name regex ncu filters on
    launch_skip: int
    launch_count: int
    command: tuple[str, ...]
    report: Path  # the .ncu-rep ncu writes
    cost: str  # what it costs, in words, said before it starts


def find_ncu() -> str | None:
    for candidate in (shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _base(name: str) -> str:
    """A kernel's name without its return type, namespaces, template and parameters
    ('void (anonymous namespace)::softmax_warp_forward<float>(...)' -> 'softmax_warp_forward');
    "" where nothing is left."""
    text = str(name).strip().removeprefix("void ").strip()
    text = text.replace("(anonymous namespace)", "").replace("`anonymous namespace'", "")
    cut = re.search(r"[<(]", text)
    return (text[:cut.start()] if cut else text).rsplit("::", 1)[-1].strip()


def _pattern(bases: tuple[str, ...]) -> str:
    """ncu's kernel-name regex: the bases as alternatives, as many as fit in MAX_PATTERN,
    never an empty one (which would match every kernel)."""
    pattern = ""
    for base in bases:
        if not base:
            continue
        part = re.escape(base)
        joined = f"{pattern}|{part}" if pattern else part
        if len(joined) > MAX_PATTERN:
            break
        pattern = joined
    return pattern


def plan(kernel_table: pd.DataFrame, choice: str, script: Path, args: list[str], out_dir: Path, *,
         steps: int, warmup_steps: int, ncu: str = "ncu", python: str = sys.executable,
         timeout_s: float = DEFAULT_TIMEOUT_S) -> NcuPlan | None:
    """The kernels to profile and the command that profiles them: ``choice`` is a number N
    (the top N kernels by GPU time in ``kernel_table``, the session's Kernel Summary) or a
    regex of kernel names. The launch skip passes the chosen kernels' launches in the
    ``warmup_steps`` before the steps the session recorded. None where no kernel is chosen."""
    if kernel_table is None or not len(kernel_table):
        return None
    names = kernel_table.sort_values("gpu_total_ns", ascending=False)
    if choice.isdigit():
        chosen = names.head(max(int(choice), 1))
    else:
        try:
            wanted = re.compile(choice)
        except re.error:
            return None
        chosen = names[[bool(wanted.search(str(n))) for n in names.index]]
    if not len(chosen):
        return None
    bases = tuple(b for b in dict.fromkeys(_base(n) for n in chosen.index) if b)
    pattern = _pattern(bases)
    if not pattern:
        return None
    bases = tuple(b for b in bases if re.search(f"^(?:{pattern})$", b))
    per_step = float(chosen["calls"].sum()) / max(steps, 1)
    skip = int(round(per_step * warmup_steps))
    count = LAUNCHES_EACH * len(bases)
    report = out_dir / "kernel_counters"
    command = (ncu, "--clock-control", "none", "--target-processes", "all", "-k", f"regex:{pattern}",
               "--launch-skip", str(skip), "--launch-count", str(count),
               *[word for section in SECTIONS for word in ("--section", section)],
               "--export", str(report), "-f", python, str(script), *args)
    cost = (f"profiling {len(bases)} kernel{'s' if len(bases) != 1 else ''} ({', '.join(bases[:4])}"
            f"{', ...' if len(bases) > 4 else ''}) with Nsight Compute: the script runs once more, and each of "
            f"its {count} profiled launches is replayed some tens of times (the run is stopped after "
            f"{timeout_s:.0f} s)")
    return NcuPlan(bases, pattern, skip, count, command, report.with_suffix(".ncu-rep"), cost)


def run(the_plan: NcuPlan, *, timeout_s: float = DEFAULT_TIMEOUT_S,
        say: Callable[[str], None] | None = None,
        confirm: Callable[[str], bool] | None = None) -> tuple[Path | None, str | None]:
    """Run the plan: the report, or None and the one-line reason there is none. ``confirm``,
    where given, is asked first with the cost (an interactive user may decline)."""
    if confirm is not None and not confirm(the_plan.cost):
        return None, "declined"
    if say is not None and confirm is None:
        say(the_plan.cost)
    # ncu starts the script as its own child: a session of their own, so that a run past
    # its time stops both.
    process = subprocess.Popen(list(the_plan.command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True) \
        if shutil.which(the_plan.command[0]) else None
    if process is None:
        return None, f"Nsight Compute could not run ({the_plan.command[0]} is not an executable)"
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(process)
        return None, f"Nsight Compute ran past {timeout_s:.0f} s and was stopped: choose fewer kernels"
    done = subprocess.CompletedProcess(process.args, process.returncode, output, "")
    said = (done.stdout or "") + (done.stderr or "")
    if "ERR_NVGPUCTRPERM" in said:
        return None, ("the GPU does not let this user read its performance counters (ERR_NVGPUCTRPERM): see "
                      "https://developer.nvidia.com/ERR_NVGPUCTRPERM, or run as an administrator")
    if not the_plan.report.is_file():
        last = [line for line in said.strip().splitlines() if line.strip()][-1:] or [f"exit {done.returncode}"]
        return None, f"Nsight Compute profiled nothing ({last[0][:200]})"
    return the_plan.report, None


def _stop(process: subprocess.Popen) -> None:
    """Stop ncu and the script it runs (their process group), then collect them."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            process.communicate(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
