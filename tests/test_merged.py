"""A multi-rank trace merged into one file (TraceFusion's layout) is split back into its ranks."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.importers import merged
from advisor.importers.merged import merged_ranks, split

CASE = Path(__file__).resolve().parents[1] / "cases" / "synth_merged_ranks" / "trace.json.gz"


def test_a_merged_trace_is_told_from_its_head_and_an_ordinary_one_is_not(tmp_path):
    assert merged_ranks(CASE)
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
                                                  "dur": 1, "args": {"rank": 0}}]}))
    assert not merged_ranks(plain), "a rank alone is not a merge: the offset pid's original is the mark"


def test_each_rank_gets_its_own_events_with_the_offset_fields_restored(tmp_path):
    done = split(CASE, tmp_path)
    files = done.files
    assert done.left_out == {}
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
    files = split(path, tmp_path / "out").files
    assert len(files) == 2
    # each rank: its own process name and its op
    assert [len(json.load(gzip.open(f))["traceEvents"]) for f in files] == [2, 2]


REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"


def _events(path: Path) -> list[dict]:
    with gzip.open(path) as handle:
        return json.load(handle)["traceEvents"]


def _write(path: Path, events: list[dict]) -> Path:
    with gzip.open(path, "wt") as out:
        json.dump({"traceEvents": events}, out)
    return path


def _diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--no-cache", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300, check=False)


def test_a_damaged_compressed_trace_is_not_taken_for_a_merge_and_reaches_the_reader(tmp_path):
    data = bytearray(CASE.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the deflate stream
    damaged = tmp_path / "flip.json.gz"
    damaged.write_bytes(bytes(data))
    assert not merged_ranks(damaged)
    done = _diagnose(str(damaged))
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


def test_two_marked_events_do_not_make_an_ordinary_trace_a_merge(tmp_path):
    """The marks of a merge are on nearly every event: a trace with two events carrying a
    rank and a pid's original is read as the trace it is, whole."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 7, "tid": 7, "ts": i * 10, "dur": 5,
               "args": {}} for i in range(200)]
    events += [{"ph": "i", "name": "mark", "pid": 7, "tid": 7, "ts": 1, "s": "t", "args": {"rank": r, "pid_raw": 1}}
               for r in (0, 1)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "tagged", "pid": 7, "tid": 7, "ts": 2, "dur": 1,
                "args": {"rank": r, "pid_raw": 1}} for r in (0, 1)]
    assert not merged_ranks(_write(tmp_path / "t.json.gz", events))


@pytest.mark.skipif(not (SHARED / "bert_small_infer_h100.json.gz").is_file(),
                    reason="the real traces in ../shared/traces are absent")
def test_a_real_trace_with_two_marked_events_keeps_its_finding(tmp_path):
    real = SHARED / "bert_small_infer_h100.json.gz"
    events = _events(real)
    events += [{"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": events[0].get("ts", 0), "s": "t",
                "args": {"rank": r, "pid_raw": 1}} for r in (0, 1)]
    planted = _write(tmp_path / "planted.json.gz", events)
    before, after = _diagnose("-f", "json", str(real)), _diagnose("-f", "json", str(planted))
    assert after.returncode == before.returncode
    assert "merges the traces" not in after.stderr
    assert json.loads(after.stdout)["findings"][0]["rule"] == json.loads(before.stdout)["findings"][0]["rule"]


def test_ranks_that_are_not_ranks_are_left_out_and_counted(tmp_path):
    events = _events(CASE)
    events += [{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": 0, "dur": 1,
                "args": {"rank": rank, "pid_raw": 1}} for rank in (10 ** 40, -3, "2")]
    events.append({"ph": "X", "cat": "cpu_op", "name": "y", "pid": 99, "tid": 1, "ts": 0, "dur": 1, "args": {}})
    done = split(_write(tmp_path / "m.json.gz", events), tmp_path / "out")
    assert [f.name for f in done.files] == ["rank-0.json.gz", "rank-1.json.gz"]
    assert done.left_out == {"with a rank outside 0..999,999": 2, "with a rank that is not a whole number": 1,
                             "with no rank": 1}
    assert done.said().startswith("4 events of the merged trace were not read")


def test_a_split_into_too_many_ranks_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(merged, "MAX_SPLIT_RANKS", 8)
    events = [{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 10_000 * r + 1, "tid": 1, "ts": r, "dur": 1,
               "args": {"rank": r, "pid_raw": 1}} for r in range(20)]
    path = _write(tmp_path / "m.json.gz", events)
    assert merged_ranks(path)
    with pytest.raises(ValueError, match="more than 8 ranks"):
        split(path, tmp_path / "out")


def test_a_merge_past_the_bound_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(merged, "MAX_SPLIT_BYTES", 1000)
    with pytest.raises(ValueError, match="past the"):
        split(CASE, tmp_path / "out")
