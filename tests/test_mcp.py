"""`advisor mcp`: the server started as an agent client starts it, driven by the SDK's client."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import REPO, SHARED_TRACES

mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'advisor[mcp]')")
anyio = pytest.importorskip("anyio")

from mcp import Client, StdioServerParameters  # noqa: E402

RESNET = SHARED_TRACES / "resnet50_v100_num_workers_0.pt.trace.json.gz"


def _server() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "advisor", "mcp"], cwd=str(REPO),
                                 env={"ADVISOR_NO_PROGRESS": "1", "PYTHONPATH": str(REPO)})


def _talk(conversation) -> dict:
    """Run ``conversation(client)`` against a fresh `advisor mcp`; what it returned."""
    out: dict = {}

    async def main() -> None:
        async with Client(_server(), read_timeout_seconds=300) as client:
            out.update(await conversation(client))

    anyio.run(main)
    return out


def test_the_server_lists_its_tools_explains_a_rule_and_survives_bad_input(tmp_path):
    bad = tmp_path / "not-a-trace.json"
    bad.write_text("this is not JSON")

    async def conversation(client) -> dict:
        tools = (await client.list_tools()).tools
        explained = await client.call_tool("explain", {"rule": "dataloader-starvation"})
        missing = await client.call_tool("diagnose", {"target": str(tmp_path / "nowhere.json")})
        broken = await client.call_tool("diagnose", {"target": str(bad)})
        unknown = await client.call_tool("explain", {"rule": "no-such-rule"})
        again = await client.call_tool("explain", {"rule": "host-bound"})  # still up
        return {"tools": tools, "explained": explained, "missing": missing, "broken": broken, "unknown": unknown,
                "again": again}

    got = _talk(conversation)
    tools = {tool.name: tool for tool in got["tools"]}
    assert set(tools) == {"diagnose", "summary", "compare", "explain", "verify"}
    assert "RUNS THE USER'S SCRIPT" in tools["verify"].description
    assert tools["verify"].annotations.read_only_hint is False and tools["diagnose"].annotations.read_only_hint
    assert tools["diagnose"].output_schema is not None  # the report's schema
    explained = got["explained"].structured_content
    assert explained["id"] == "dataloader-starvation" and explained["docs"]["why"]
    assert "dataloader_share" in explained["thresholds"] and "dataloader" in explained["verify"]
    for failed, says in ((got["missing"], "no such file"), (got["broken"], "not a trace advisor can read"),
                         (got["unknown"], "no rule 'no-such-rule'")):
        assert failed.is_error
        text = failed.content[0].text
        assert "advisor: " in text and says in text and "Traceback" not in text and "\n" not in text
    assert not got["again"].is_error


@pytest.mark.skipif(not RESNET.is_file(), reason="real trace not available: ../shared/traces is absent")
def test_diagnose_a_real_trace_then_page_its_tables_and_compare():
    async def conversation(client) -> dict:
        diagnosed = await client.call_tool("diagnose", {"target": str(RESNET)})
        first = await client.call_tool("summary", {"target": str(RESNET), "table": "operator", "limit": 5,
                                                   "sort": "cpu_total_ns"})
        second = await client.call_tool("summary", {"target": str(RESNET), "table": "operator", "limit": 5,
                                                    "offset": 5, "sort": "cpu_total_ns"})
        no_table = await client.call_tool("summary", {"target": str(RESNET), "table": "nope"})
        compared = await client.call_tool("compare", {"before": str(RESNET), "after": str(RESNET)})
        return {"diagnosed": diagnosed, "first": first, "second": second, "no_table": no_table,
                "compared": compared}

    got = _talk(conversation)
    report = got["diagnosed"].structured_content
    from advisor.reports.schema import load_report_schema

    import jsonschema

    jsonschema.validate(report, load_report_schema())
    top = report["findings"][0]
    assert top["rule"] == "dataloader-starvation" and top["saving"]["ms_per_step"] > 0 and top["evidence"]
    text = got["diagnosed"].content[0].text
    assert "1. HIGH dataloader-starvation" in text
    assert report["tables"] == {} and "operator" in text.split("Tables (page through one with summary): ")[1]
    first, second = got["first"].structured_content, got["second"].structured_content
    assert len(first["rows"]) == 5 and first["next_offset"] == 5 and first["total_rows"] > 10
    assert second["offset"] == 5 and first["rows"][0] != second["rows"][0]
    totals = [row["cpu_total_ns"] for row in first["rows"] + second["rows"]]
    assert totals == sorted(totals, reverse=True)
    assert got["no_table"].is_error and "its tables:" in got["no_table"].content[0].text
    compared = got["compared"].structured_content
    assert json.dumps(compared) and not got["compared"].is_error


@pytest.mark.parametrize("script, args", [("--output=OUT", ["train.py"]), ("--save=OUT", ["train.py"]),
                                          ("", []), ("no_such_train.py", [])],
                         ids=["--output", "--save", "empty", "missing"])
def test_verify_runs_only_a_script_that_is_a_file_and_takes_no_option_from_it(tmp_path, monkeypatch, script, args):
    """A script name that looks like one of advisor's options is not read as one: nothing is
    written where it points, and the tool says the script is not a file."""
    from advisor.api.mcp_verify import verify_command
    from advisor.errors import UsageError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('ran')\n")
    target = tmp_path / "written"
    with pytest.raises(UsageError, match="is not a file"):
        verify_command(script.replace("OUT", str(target)), args, 30.0, 1, None, tmp_path / "report.json")
    assert not target.exists()


@pytest.mark.parametrize("budget", [float("inf"), float("nan"), 0.0, -1.0, 1e9])
def test_verify_refuses_a_budget_that_is_not_a_bounded_time(tmp_path, budget):
    from advisor.api.mcp_verify import verify_command
    from advisor.errors import UsageError

    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    with pytest.raises(UsageError, match="budget_s"):
        verify_command(str(script), [], budget, 1, None, tmp_path / "report.json")
    with pytest.raises(UsageError, match="timeout_s"):
        verify_command(str(script), [], 30.0, 1, budget, tmp_path / "report.json")


def test_diagnoses_made_at_once_are_bounded(monkeypatch):
    """Each diagnosis holds a whole profile while it is read: the server makes at most a
    few at once, and the rest wait their turn."""
    import threading
    import time

    from advisor.api import mcp_server

    running, most = [0], [0]
    lock = threading.Lock()

    def slow(target, rules=None, gpu=None):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return object()

    monkeypatch.setattr(mcp_server, "diagnose_target", slow)
    kept = mcp_server._Diagnoses(budget_bytes=0, in_flight=2)
    calls = [threading.Thread(target=kept.get, args=(f"/nowhere/{i}.json", None, None)) for i in range(6)]
    for call in calls:
        call.start()
    for call in calls:
        call.join()
    assert most[0] == 2
