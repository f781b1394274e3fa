"""The MCP ``verify`` tool's run of `advisor verify`: bounded, cancellable, ended whole.

The server (advisor.api.mcp_server) runs `advisor verify` on the user's script in a process
session of its own (advisor.verify.processes), its output to files, and waits for it
without holding the server: for at most the call's time limit (the diagnosis and the trials
together), then asks it to stop (SIGTERM: it reports what it measured) and, after a grace
period, kills what is left. A call cancelled by the client (``notifications/cancelled``),
or by the server when the client goes, ends the script and everything it started the same
way; so does a signal that stops the server (``end_runs_on_signal``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from functools import partial
from pathlib import Path
from typing import Any

__all__ = ["Runs", "end_runs_on_signal", "run_verify", "verify_command"]

# verify's budget covers its diagnosis too, but the diagnosis runs the script through its
# recorded window and up to a minute after it (advisor.collect.steps.StopAfter), which a
# slow start-up may take past the budget: the whole call runs for at most the budget and
# this, unless timeout_s says.
VERIFY_DIAGNOSIS_S = 180.0
MAX_VERIFY_BUDGET_S = 3600.0
MAX_VERIFY_TIMEOUT_S = MAX_VERIFY_BUDGET_S + VERIFY_DIAGNOSIS_S
# Out of time, advisor verify is asked to stop (SIGTERM: it ends its trial and reports what
# it measured) and killed, with all it started, after this long. A cancelled call, whose
# answer no one reads, gives it a few seconds; a finished one, for what the script left.
STOP_GRACE_S = 30.0
CANCEL_GRACE_S = 5.0
LEFTOVER_GRACE_S = 2.0
_POLL_S = 0.2


class Runs:
    """The `advisor verify` processes the server's calls have running, to end them all when
    the server is stopped by a signal."""

    def __init__(self) -> None:
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def add(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._running.add(process)

    def discard(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._running.discard(process)

    def end_all(self) -> None:
        from advisor.verify import processes

        with self._lock:
            running = list(self._running)
        for process in running:
            processes.end(process, grace_s=CANCEL_GRACE_S)


def verify_command(script: str, args: list[str], budget_s: float, max_fixes: int, timeout_s: float | None,
                    out: Path) -> tuple[list[str], float]:
    """The `advisor verify` command line for these arguments and how long it may run; a
    UsageError, before anything runs, where they are not a script and bounded times."""
    import math

    from advisor.errors import UsageError

    path = Path(script)
    if not script or not path.is_file():
        # Only a script that exists runs; a name starting with "-" is never read as an option.
        raise UsageError(f"script {script!r} is not a file")

    def bounded(value: Any, most: float) -> bool:
        return isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= most

    if not bounded(budget_s, MAX_VERIFY_BUDGET_S):
        raise UsageError(f"budget_s must be a number of seconds between 0 and {MAX_VERIFY_BUDGET_S:g}")
    if timeout_s is not None and not bounded(timeout_s, MAX_VERIFY_TIMEOUT_S):
        raise UsageError(f"timeout_s must be a number of seconds between 0 and {MAX_VERIFY_TIMEOUT_S:g}")
    # "--" ends advisor's options: the script and its arguments are never read as them.
    command = [sys.executable, "-m", "advisor", "verify", "--format", "json", "-o", str(out),
               "--budget", str(budget_s), "--max-fixes", str(int(max_fixes)), "--", str(path), *map(str, args)]
    return command, timeout_s if timeout_s is not None else budget_s + VERIFY_DIAGNOSIS_S


async def run_verify(script: str, args: list[str], budget_s: float, max_fixes: int, timeout_s: float | None,
                     runs: Runs) -> tuple[Any, str]:
    """`advisor verify` in a process session of its own (the script must not run in the
    server's), waited for without holding the server, ended whole however the call ends.
    Its report (advisor.reports.Report), and, where it ran out of time, a line saying so."""
    import anyio

    from advisor.errors import UsageError
    from advisor.reports import Report
    from advisor.verify import processes

    with tempfile.TemporaryDirectory(prefix="advisor-mcp-") as folder:
        out, said = Path(folder) / "report.json", Path(folder) / "stderr.txt"
        command, limit = verify_command(script, args, budget_s, max_fixes, timeout_s, out)
        # Its output goes to a file: a helper the script leaves running cannot hold the call open.
        with open(os.devnull, "wb") as nowhere, said.open("wb") as stderr:
            # verify is asked to stop if the server dies (it then ends its trial whole).
            process = processes.start(command, stdout=nowhere, stderr=stderr, env=_no_progress(),
                                      parent_death=signal.SIGTERM)
        runs.add(process)
        out_of_time = False
        try:
            with anyio.move_on_after(limit) as waited:
                while process.poll() is None:
                    await anyio.sleep(_POLL_S)
            out_of_time = waited.cancelled_caught
        finally:
            # Done, out of time, cancelled, or the client gone (the server cancels the call):
            # the script and whatever it started end with the call.
            grace = (STOP_GRACE_S if out_of_time else LEFTOVER_GRACE_S if process.poll() is not None
                     else CANCEL_GRACE_S)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(partial(processes.end, process, grace_s=grace))
            runs.discard(process)
        stopped = (f"advisor verify ran past its time limit ({limit:.3g} s) and was stopped; the script's "
                   "processes were ended") if out_of_time else ""
        if not out.is_file():  # the script's own last words too: an agent sees no terminal
            lines = said.read_text(errors="replace").strip().splitlines() or [f"exit code {process.returncode}"]
            last = " | ".join(line.strip() for line in lines[-4:] if line.strip()).removeprefix("advisor: ")
            raise UsageError(f"{stopped}: {last}" if stopped else last)
        return Report.model_validate_json(out.read_text()), stopped


def _no_progress() -> dict[str, str]:
    return {**os.environ, "ADVISOR_NO_PROGRESS": "1"}


async def end_runs_on_signal(runs: Runs) -> None:
    """On SIGTERM, SIGHUP or Ctrl-C: the runs ended, then the process ended as the signal says."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
        async for signum in signals:
            await anyio.to_thread.run_sync(runs.end_all)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
