"""A multi-rank trace merged into one file (TraceFusion's layout) is split back into its ranks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from advisor.importers.merged import merged_ranks, split

CASE = Path(__file__).resolve().parents[1] / "cases" / "synth_merged_ranks" / "trace.json.gz"


def test_a_merged_trace_is_told_from_its_head_and_an_ordinary_one_is_not(tmp_path):
    assert merged_ranks(CASE)
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
                                                  "dur": 1, "args": {"rank": 0}}]}))
    assert not merged_ranks(plain), "a rank alone is not a merge: the offset pid's original is the mark"


def test_each_rank_gets_its_own_events_with_the_offset_fields_restored(tmp_path):
    files = split(CASE, tmp_path)
    assert [f.name for f in files] == ["rank-0.json.gz", "rank-1.json.gz"]
    merged = json.load(gzip.open(CASE))["traceEvents"]
    for rank, file in enumerate(files):
        events = json.load(gzip.open(file))["traceEvents"]
        assert len(events) == sum(1 for e in merged if e["args"].get("rank") == rank)
        assert all("rank" not in e["args"] and "pid_raw" not in e["args"] for e in events)
        assert {e["pid"] for e in events} <= {4242, 0}, "the pids each rank's profiler wrote"
        correlations = [e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"]
        assert correlations and max(correlations) < 100_000


def test_process_names_by_rank_split_a_trace_without_rank_args(tmp_path):
    events = [{"ph": "M", "name": "process_name", "pid": 100_000_000 + r, "args": {"name": f"RANK {r} - CPU"}}
              for r in (0, 1)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100_000_000 + r, "tid": 1, "ts": 10 * r,
                "dur": 5, "args": {}} for r in (0, 1)]
    path = tmp_path / "merged.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert merged_ranks(path)
    files = split(path, tmp_path / "out")
    assert len(files) == 2
    # each rank: its own process name and its op
    assert [len(json.load(gzip.open(f))["traceEvents"]) for f in files] == [2, 2]
