"""advisor.diagnose() for notebooks: a trace, a job's folder, and bad input."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from builders import synth_trace

import advisor
from advisor.errors import AdvisorError


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return synth_trace(tmp_path_factory.mktemp("nb") / "loop.json", 3_000)


def test_a_trace_gives_findings_tables_json_and_a_cell(trace):
    d = advisor.diagnose(trace)
    assert isinstance(d, advisor.Diagnosis) and d.findings
    assert all(isinstance(frame, pd.DataFrame) for frame in d.tables.values()) and "operator" in d.tables
    assert json.loads(d.to_json())["findings"][0]["rule"] == d.findings[0].rule
    cell = d._repr_html_()
    assert d.findings[0].title in cell and "<script" not in cell.lower()
    assert repr(d).startswith(f"<advisor Diagnosis of {trace}")
    # The cell leaves the tables out, so nothing in it links to one: every in-page link has
    # its target in the cell.
    import re

    targets = set(re.findall(r'id="([^"]+)"', cell))
    links = re.findall(r'href="#([^"]+)"', cell)
    assert all(link in targets for link in links), sorted(set(links) - targets)[:5]


def test_a_folder_of_rank_traces_is_a_job(trace, tmp_path):
    for rank in (0, 1):
        shutil.copy(trace, tmp_path / f"rank{rank}.json")
    d = advisor.diagnose(tmp_path)
    assert d.report.job is not None and len(d.report.job.ranks) == 2
    assert d.findings and "ranks" in d.tables


def test_a_script_or_a_missing_path_is_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    for target, says in ((script, "is a script"), (tmp_path / "nowhere.json", "no such file")):
        with pytest.raises(AdvisorError, match=says) as raised:
            advisor.diagnose(target)
        assert "\n" not in str(raised.value)
