"""Every door gives the same diagnosis of the same target: the command line, the Python
API (advisor.diagnose_target, which the notebook calls) and the MCP server's kept
diagnoses, over a trace, a saved session, a merged-ranks trace and a job's folder, all
classified and opened by advisor.targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.api.mcp_server import _Diagnoses
from advisor.api.target import diagnose_target
from advisor.errors import UsageError
from advisor.targets import classify

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "trace": REPO / "cases" / "synth_no_steps_loader" / "trace.json.gz",
    "session": REPO / "cases" / "cpu_loss_loop" / "session",
    "merged": REPO / "cases" / "synth_merged_ranks" / "trace.json.gz",
    "job": REPO / "cases" / "cpu_ddp_straggler" / "session",
}


def _findings(findings) -> list[tuple]:
    return [(f["rule"], f["severity"], round(f["saving"]["ms_per_step"], 4) if f.get("saving") else None)
            for f in findings]


def _by_the_command_line(target: Path) -> list[tuple]:
    done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--no-cache", "-f", "json", str(target)],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
                          env={**os.environ, "ADVISOR_NO_PROGRESS": "1"})
    assert done.returncode == 0, done.stderr[-500:]
    return _findings(json.loads(done.stdout)["findings"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_every_door_gives_the_same_findings(kind):
    target = TARGETS[kind]
    assert classify(target).kind == kind
    api = diagnose_target(target)
    through_api = _findings(json.loads(api.report.model_dump_json())["findings"])
    kept = _Diagnoses(budget_bytes=1 << 30)
    through_mcp = _findings(json.loads(kept.get(str(target), None, None).report.model_dump_json())["findings"])
    assert through_api == _by_the_command_line(target)
    assert through_mcp == through_api
    assert through_api, f"{kind}: no finding at all to compare"


def test_the_target_stage_says_what_each_target_is(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    found = classify(script, ["--steps", "3"])
    assert found.kind == "script" and found.args == ("--steps", "3")
    with pytest.raises(UsageError, match="only for scripts"):
        classify(TARGETS["trace"], ["--steps", "3"])
    with pytest.raises(UsageError, match="no such file"):
        classify(tmp_path / "missing.json")
    merged = classify(TARGETS["merged"])
    assert merged.kind == "merged" and len(merged.sources) == 2 and "merges the traces of 2 ranks" in merged.said[0]
    assert classify(TARGETS["job"]).is_job


def test_the_api_refuses_a_script_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(UsageError, match="is a script"):
        diagnose_target(script)
