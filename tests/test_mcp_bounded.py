"""`advisor mcp`: a call that runs a script is bounded and ends whole; the server's memory is
bounded in bytes; every tool error says its cause in one line.

The scripts here never end, or leave a helper running; each writes the ids of the processes
that run it, and a test passes once those are gone. The waits are hang guards only: each
test's own limits are what it checks, and a busy machine makes it slower, never wrong.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'advisor[mcp]')")
anyio = pytest.importorskip("anyio")
psutil = pytest.importorskip("psutil")

from mcp import Client, StdioServerParameters  # noqa: E402

HANG_GUARD_S = 300.0

# A script that never ends, with a helper it started: both ids written once they run.
NEVER_ENDS = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open(sys.argv[1] + ".part", "w") as ids:
    ids.write(f"{os.getpid()} {helper.pid}")
os.replace(sys.argv[1] + ".part", sys.argv[1])
while True:
    time.sleep(0.05)
"""

# A script that ends at once, leaving a helper that holds its output open.
LEAVES_A_HELPER = """
import os, subprocess, sys
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open(sys.argv[1] + ".part", "w") as ids:
    ids.write(f"{os.getpid()} {helper.pid}")
os.replace(sys.argv[1] + ".part", sys.argv[1])
print("done")
"""


def _environment() -> dict[str, str]:
    return {**os.environ, "ADVISOR_NO_PROGRESS": "1", "PYTHONPATH": str(REPO)}


def _server() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "advisor", "mcp"], cwd=str(REPO),
                                 env=_environment())


def _script(tmp_path: Path, text: str) -> tuple[Path, Path]:
    script = tmp_path / "train.py"
    script.write_text(text)
    return script, tmp_path / "ids.txt"


def _ids(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_until_gone(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still running after the hang guard (none, where they end)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.2)
    left = [pid for pid in pids if _running(pid)]
    for pid in left:  # not to leave them running after a failed test
        os.kill(pid, signal.SIGKILL)
    return left


def _end_left(ids: Path) -> None:
    """After a test, whatever it left running (a failed test's script): ended."""
    if ids.is_file():
        for pid in _ids(ids):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


async def _until_written(path: Path) -> None:
    with anyio.fail_after(HANG_GUARD_S):
        while not path.is_file():
            await anyio.sleep(0.2)


def test_a_cancelled_verify_ends_the_script_and_what_it_started_and_the_server_goes_on(tmp_path):
    script, ids = _script(tmp_path, NEVER_ENDS)
    got: dict = {}

    async def main() -> None:
        async with Client(_server(), read_timeout_seconds=HANG_GUARD_S) as client:
            call = anyio.CancelScope()

            async def verify() -> None:
                with call:
                    got["result"] = await client.call_tool("verify", {"script": str(script), "args": [str(ids)]})

            async with anyio.create_task_group() as group:
                group.start_soon(verify)
                await _until_written(ids)
                call.cancel()  # the client sends notifications/cancelled
            got["left"] = await anyio.to_thread.run_sync(_wait_until_gone, _ids(ids))
            got["after"] = await client.call_tool("explain", {"rule": "host-bound"})

    try:
        anyio.run(main)
    finally:
        _end_left(ids)
    assert "result" not in got and got["left"] == []
    assert not got["after"].is_error


def test_verify_runs_within_its_time_limit_and_says_it_was_stopped(tmp_path):
    script, ids = _script(tmp_path, NEVER_ENDS)

    async def main() -> object:
        async with Client(_server(), read_timeout_seconds=HANG_GUARD_S) as client:
            return await client.call_tool("verify", {"script": str(script), "args": [str(ids)], "timeout_s": 20})

    try:
        result = anyio.run(main)
        # The call answers once the script's processes are ended (where it had started: a busy
        # machine may not have got that far within the limit).
        left = [pid for pid in _ids(ids) if _running(pid)] if ids.is_file() else []
    finally:
        _end_left(ids)
    assert left == []
    text = result.content[0].text
    # Stopped, it reports the diagnosis of what ran; where it had not got that far, an error.
    assert text.startswith("advisor verify ran past its time limit (20 s)") or (
        result.is_error and "ran past its time limit (20 s)" in text and "\n" not in text)
    assert "Traceback" not in text


def test_a_helper_the_script_leaves_running_does_not_hold_the_call(tmp_path):
    script, ids = _script(tmp_path, LEAVES_A_HELPER)

    async def main() -> object:
        async with Client(_server(), read_timeout_seconds=HANG_GUARD_S) as client:
            return await client.call_tool("verify", {"script": str(script), "args": [str(ids)]})

    try:
        result = anyio.run(main)  # (before, it waited for the helper: the whole budget and 600 s)
        assert ids.is_file() and "Traceback" not in result.content[0].text
        assert [pid for pid in _ids(ids) if _running(pid)] == []  # ended before the call answered
    finally:
        _end_left(ids)


def _rpc(server: subprocess.Popen, message: dict) -> None:
    server.stdin.write((json.dumps(message) + "\n").encode())
    server.stdin.flush()


@pytest.mark.parametrize("how", ["stdin closed", "SIGTERM"])
def test_when_the_client_goes_the_server_ends_the_script_and_itself(tmp_path, how):
    """A client that closes the server's input, or a server stopped by SIGTERM: no process of
    the script is left running, nor the server."""
    script, ids = _script(tmp_path, NEVER_ENDS)
    server = subprocess.Popen([sys.executable, "-m", "advisor", "mcp"], cwd=REPO, env=_environment(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        _rpc(server, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "test", "version": "0"}}})
        assert json.loads(server.stdout.readline())["id"] == 1
        _rpc(server, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _rpc(server, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "verify", "arguments": {"script": str(script), "args": [str(ids)]}}})
        deadline = time.monotonic() + HANG_GUARD_S
        while not ids.is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ids.is_file()
        if how == "stdin closed":
            server.stdin.close()
        else:
            server.send_signal(signal.SIGTERM)
        assert _wait_until_gone(_ids(ids)) == []
        server.wait(timeout=HANG_GUARD_S)
        assert server.returncode == (0 if how == "stdin closed" else -signal.SIGTERM)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        _end_left(ids)


# -- the server's memory and its errors, in this process ---------------------------------------------


def test_kept_diagnoses_stay_within_a_memory_budget_in_bytes(make_trace):
    from advisor.api.mcp_server import _Diagnoses, diagnosis_bytes

    traces = [make_trace([{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}_{k}", "pid": 1, "tid": 1,
                           "ts": 10 * k, "dur": 5} for k in range(50 * (i + 1))], name=f"trace{i}.json")
              for i in range(3)]
    sizes = [diagnosis_bytes(_Diagnoses(1 << 40).get(str(trace), None, None)) for trace in traces]
    assert all(size > 0 for size in sizes)
    kept = _Diagnoses(budget_bytes=sizes[1] + sizes[2])
    first = kept.get(str(traces[0]), None, None)
    assert kept.get(str(traces[0]), None, None) is first  # kept: read once
    for trace in traces[1:]:
        kept.get(str(trace), None, None)
    assert kept.kept_bytes <= kept.budget_bytes
    assert kept.get(str(traces[0]), None, None) is not first  # the oldest was let go
    nothing = _Diagnoses(budget_bytes=0)
    nothing.get(str(traces[0]), None, None)
    assert nothing.kept_bytes == 0


@pytest.mark.parametrize("raised, says", [
    (RuntimeError("the frame\nhas no column 'x'"), "internal error (RuntimeError: the frame has no column 'x')"),
    (OSError(28, "No space left on device", "/tmp/cache"), "No space left on device: /tmp/cache"),
    (MemoryError(), "out of memory"),
], ids=["internal", "os", "memory"])
def test_every_tool_error_says_its_cause_in_one_line(monkeypatch, tmp_path, raised, says):
    from advisor.api import mcp_server

    def fails(*args, **kwargs):
        raise raised

    monkeypatch.setattr(mcp_server, "diagnose_target", fails)
    trace = tmp_path / "trace.json"
    trace.write_text("[]")

    async def main() -> object:
        async with Client(mcp_server.build_server()) as client:
            return await client.call_tool("diagnose", {"target": str(trace)})

    result = anyio.run(main)
    text = result.content[0].text
    assert result.is_error and says in text and "advisor: " in text and "\n" not in text


def test_a_memory_error_lets_the_kept_diagnoses_go_and_reads_again(make_trace, monkeypatch):
    from advisor.api import mcp_server

    first, second = (make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
                                  "dur": 5}], name=name) for name in ("a.json", "b.json"))
    kept = mcp_server._Diagnoses(1 << 40)
    kept.get(str(first), None, None)
    real, calls = mcp_server.diagnose_target, []

    def short_of_memory_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise MemoryError
        return real(*args, **kwargs)

    monkeypatch.setattr(mcp_server, "diagnose_target", short_of_memory_once)
    assert kept.get(str(second), None, None).report is not None
    assert len(calls) == 2 and kept.kept_bytes == mcp_server.diagnosis_bytes(kept.get(str(second), None, None))
