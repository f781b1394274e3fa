"""Smaller inputs made to break advisor, each with its reproducer: a file name that is not
UTF-8 once cached, a verify budget that is not a time, a kernel file that blocks its
reader, an MCP target that is empty or a rule pack that is someone's secrets, a full
standard output, SIGTERM after the script ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from builders import one_line, write_trace
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


# -- a full standard output ---------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this machine")
@pytest.mark.parametrize("argv", [["rules", "list"], ["--help"], ["--version"], ["doctor"],
                                  ["calibrate", "--seconds", "0.2"], ["calibrate", "--help"]],
                         ids=lambda argv: " ".join(argv))
def test_a_full_standard_output_is_one_line_and_a_failure(tmp_path, argv):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "advisor", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, check=False,
                              env={**os.environ, "ADVISOR_CALIBRATION": str(tmp_path / "calibration.json")})
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == ["advisor: the output could not be written: No space left on device"]


# -- SIGTERM after the script ended -----------------------------------------------------------------


TRAIN = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""

# advisor as its command runs it, with SIGTERM arriving once the script has ended, while its
# profile is put on disk (sent from there: a scheduler's timing, made exact).
TERMINATED_AFTER = """
import os, signal, sys
import advisor.cli as cli
import advisor.cli.opening as opening
collect = opening._collect
def collected_then_terminated(*args, **kwargs):
    out = collect(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return out
opening._collect = collected_then_terminated
sys.argv = ["advisor", "diagnose", sys.argv[1]]
cli.console_main()
"""


def test_sigterm_after_the_script_ended_is_said_as_sigterm_with_its_exit_code(tmp_path):
    import signal

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    done = subprocess.run([sys.executable, "-c", TERMINATED_AFTER, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("advisor: stopped by SIGTERM; the profile collected is kept in "), done.stderr
    assert "Traceback" not in done.stderr
