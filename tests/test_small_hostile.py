"""Smaller inputs made to break advisor, each with its reproducer: a file name that is not
UTF-8 once cached, a verify budget that is not a time, a kernel file that blocks its
reader, an MCP target that is empty or a rule pack that is someone's secrets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from builders import write_trace
from conftest import REPO

from advisor.cli import main


def _steps(n: int = 4) -> list[dict]:
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
               "ts": i * 1000, "dur": 1000} for i in range(n)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": i * 1000 + 10, "dur": 500}
               for i in range(n)]
    return events


def advisor(*args: str, cwd: Path | None = None, env: dict | None = None, **run) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env={**os.environ, **(env or {})}, check=False, **run)


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0, done.stdout[-500:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advisor"), done.stderr
    return lines[0]


# -- a file name that is not UTF-8, once cached ------------------------------------------------------


def test_a_trace_whose_name_is_not_utf8_breaks_no_later_command(tmp_path, cache_dir, capsys):
    trace = write_trace(tmp_path / os.fsdecode(b"r\xe9sum\xe9.json"), _steps())
    other = write_trace(tmp_path / "other.json", _steps())
    for argv in (["diagnose", str(trace), "--format", "json"],  # read, and kept in the cache
                 ["summary", str(trace), "--table", "operator"],  # the cached Session's tables
                 ["compare", str(trace), str(other)],
                 ["timeline", str(trace), "-o", str(tmp_path / "timeline.json")],
                 ["diagnose", str(trace), "--format", "markdown"]):
        code = main(argv)
        said = capsys.readouterr()
        assert code == 0 and "internal error" not in said.err, (argv[0], said.err)


# -- verify's budget -----------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", ["inf", "1e9", "nan", "-inf"])
def test_a_verify_budget_that_is_not_a_time_is_refused_before_the_script_runs(tmp_path, budget):
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').close()\n")
    line = one_line(advisor("verify", f"--budget={budget}", str(script), cwd=tmp_path))
    assert "--budget must be a number of seconds above 0 and at most 604800" in line
    assert not (tmp_path / "ran").exists(), "the script ran before the budget was checked"


# -- files of the kernel's --------------------------------------------------------------------------


KMSG = Path("/proc/kmsg")


@pytest.mark.skipif(not KMSG.exists(), reason="no /proc/kmsg on this machine")
@pytest.mark.parametrize("command", [["diagnose"], ["summary"], ["compare", "{other}"], ["timeline", "-o", "{out}"]])
def test_proc_kmsg_is_refused_not_read(tmp_path, command):
    """/proc/kmsg says it is a regular file and blocks its reader until the kernel logs
    something: refused before anything reads it (the read ahead, the report cache's key)."""
    other = write_trace(tmp_path / "t.json", _steps())
    argv = [command[0], str(KMSG), *[w.replace("{other}", str(other)).replace("{out}", str(tmp_path / "o.json"))
                                    for w in command[1:]]]
    line = one_line(advisor(*argv, timeout=120))  # (a hang would end here, not in the test's own time)
    assert "/proc/kmsg is a file of the kernel's (/proc, /sys)" in line


def test_kernel_files_are_refused_as_traces_and_rule_packs(tmp_path, capsys):
    status = "/proc/self/status"
    assert main(["diagnose", status]) == 2
    assert "is a file of the kernel's (/proc, /sys), not a trace file" in capsys.readouterr().err
    assert main(["rules", "validate", status]) == 1
    assert "is a file of the kernel's (/proc, /sys), not a rule pack file" in capsys.readouterr().out


# -- the MCP server: an empty target, a rule pack that is someone's secrets -------------------------


SECRETS = "aws_secret_access_key: AKIAVERYSECRET\npassword: hunter2\nnested:\n  token: abc123\n"


def test_the_mcp_server_refuses_an_empty_target_and_quotes_no_pack_content(tmp_path):
    mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'advisor[mcp]')")
    anyio = pytest.importorskip("anyio")
    secrets = tmp_path / "credentials.yaml"
    secrets.write_text(SECRETS)
    trace = write_trace(tmp_path / "t.json", _steps())
    server = mcp.StdioServerParameters(command=sys.executable, args=["-m", "advisor", "mcp"], cwd=str(REPO),
                                       env={"ADVISOR_NO_PROGRESS": "1", "PYTHONPATH": str(REPO)})
    got: dict = {}

    async def talk() -> None:
        async with mcp.Client(server, read_timeout_seconds=300) as client:
            got["empty"] = await client.call_tool("diagnose", {"target": ""})
            got["blank"] = await client.call_tool("summary", {"target": "  ", "table": "overview"})
            got["secrets"] = await client.call_tool("diagnose", {"target": str(trace), "rules": [str(secrets)]})

    anyio.run(talk)
    for name in ("empty", "blank"):
        assert got[name].is_error and "no target" in got[name].content[0].text, got[name].content[0].text
    said = got["secrets"].content[0].text
    assert got["secrets"].is_error and "not a valid rule pack (5 problems" in said, said
    for secret in ("aws_secret_access_key", "AKIAVERYSECRET", "password", "hunter2", "nested", "token", "abc123"):
        assert secret not in said, said


def test_diagnose_target_refuses_an_empty_target_and_quotes_no_pack_content(tmp_path):
    from advisor.api.target import diagnose_target
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match="no target"):
        diagnose_target("")
    secrets = tmp_path / "credentials.yaml"
    secrets.write_text(SECRETS)
    trace = write_trace(tmp_path / "t.json", _steps())
    with pytest.raises(AdvisorError) as refused:
        diagnose_target(trace, rules=[str(secrets)])
    assert f"{secrets}:1: not a valid rule pack" in str(refused.value)
    assert "hunter2" not in str(refused.value) and "password" not in str(refused.value)
