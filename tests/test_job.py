"""Whole jobs: a folder of rank traces read rank by rank in workers (or on Dask), the
cross-rank tables, straggler-rank, findings merged across ranks, saved jobs, bad sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from builders import write_trace
from conftest import REPO, shared_trace

from advisor.errors import UsageError
from advisor.job import job_sources, order_ranks, rank_from_name, summarise_job, summarise_rank
from advisor.job.summarise import RankSummary
from advisor.reports.schema import report_schema

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

US = 1.0  # trace times are in microseconds


def gloo_rank(rank: int, world: int, *, extra_us: float = 0.0, steps: int = 6, forward_us: float = 3000.0,
              with_info: bool = True) -> dict:
    """A CPU data-parallel rank: each 10 ms step runs forward, backward and an all-reduce on
    gloo's thread. ``extra_us`` of host work after backward (or a longer forward) delays
    this rank's arrival, so the others' all-reduce lasts that much longer (they wait); the
    last rank's lasts 1 ms."""
    events, t = [], 1000.0
    main, gloo = 1, 7
    for step in range(steps):
        fwd, bwd = forward_us, 3000.0
        start = t
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": main, "ts": t,
                       "dur": fwd})
        t += fwd
        events.append({"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0",
                       "pid": 1, "tid": main, "ts": t, "dur": bwd})
        t += bwd
        if extra_us:
            events.append({"ph": "X", "cat": "user_annotation", "name": "log_metrics", "pid": 1, "tid": main,
                           "ts": t, "dur": extra_us})
        arrive = t + extra_us
        slowest_arrival = t - fwd - bwd + max_extra(world, extra_us_by_rank)
        end = slowest_arrival + 1000.0
        events.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": main,
                       "ts": arrive, "dur": 20.0})
        events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": gloo,
                       "ts": arrive + 20.0, "dur": end - arrive - 20.0})
        t = end + 200.0
        events.append({"ph": "X", "cat": "cpu_op", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": main,
                       "ts": t, "dur": 500.0})
        t += 600.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": main,
                       "ts": start, "dur": t - start})
    top = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}} if with_info else {}
    return {"events": events, **top}


# When each rank of the job being built arrives at its all-reduce, after the step's start
# (set by write_job).
extra_us_by_rank: dict[int, float] = {}


def max_extra(world: int, by_rank: dict[int, float]) -> float:
    return max(by_rank.get(r, 0.0) for r in range(world))


def write_job(folder: Path, world: int, extra: dict[int, float], *, names: str = "rank{r}.json",
              with_info: bool = True, forward_us: dict[int, float] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    forward_us = forward_us or {}
    extra_us_by_rank.clear()
    extra_us_by_rank.update({r: forward_us.get(r, 3000.0) + 3000.0 + extra.get(r, 0.0) for r in range(world)})
    for r in range(world):
        trace = gloo_rank(r, world, extra_us=extra.get(r, 0.0), with_info=with_info,
                          forward_us=forward_us.get(r, 3000.0))
        write_trace(folder / names.format(r=r), trace.pop("events"), **trace)
    return folder


def advisor(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "advisor", *args], check=False, capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=300)


@pytest.mark.parametrize("name, rank", [("rank-3.json", 3), ("trace_rank_12.pt.trace.json.gz", 12),
                                        ("worker3.json", 3), ("host1_worker_7.json", 7),
                                        ("resnet50_v100.json", None), ("trace.json", None)])
def test_a_rank_number_comes_from_the_file_name_where_the_trace_has_no_distributed_info(name, rank):
    assert rank_from_name(name) == rank


def test_a_folder_of_traces_is_a_job_and_one_trace_or_session_is_not(tmp_path):
    folder = write_job(tmp_path / "job", 2, {})
    assert [p.name for p in job_sources([folder])] == ["rank0.json", "rank1.json"]
    assert job_sources([folder / "rank0.json"]) is None
    assert [p.name for p in job_sources([folder / "rank0.json", folder / "rank1.json"])] == ["rank0.json",
                                                                                             "rank1.json"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no traces"):
        job_sources([tmp_path / "empty"])


def test_the_shared_ddp_rank_trace_still_reads_as_one_rank():
    assert job_sources([shared_trace("ddp_cnn_a100_rank0.json.gz")]) is None


def test_one_slow_rank_is_named_with_what_it_does_and_the_time_the_others_wait(tmp_path):
    folder = write_job(tmp_path / "job", 4, {2: 4000.0})
    done = advisor("diagnose", str(folder), "--format", "json", "--workers", "1")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    jsonschema.validate(report, report_schema())
    top = report["findings"][0]
    assert top["rule"] == "straggler-rank" and top["title"].endswith("rank 2")
    # The three others' all-reduce lasts 4 ms longer than rank 2's: they wait for it.
    assert top["saving"]["ms_per_step"] == pytest.approx(4.0, rel=0.02)
    assert "host work outside forward, backward and the optimizer" in top["message"]
    assert "logging, metrics" in top["recommendation"]
    ranks = {row["key"]: row for row in report["tables"]["ranks"]["rows"]}
    assert ranks["rank 2"]["last_share"] == 1.0 and ranks["rank 2"]["wait_ns"] == pytest.approx(0.0)
    assert ranks["rank 0"]["wait_ns"] == pytest.approx(4.0e6, rel=0.02)
    collectives = {row["key"]: row for row in report["tables"]["collectives"]["rows"]}
    assert collectives["all_reduce|default"]["last_rank"] == 2
    assert collectives["all_reduce|default"]["skew_mean_ns"] == pytest.approx(4.0e6, rel=0.02)
    # Every table row a finding cites is in the report.
    for finding in report["findings"]:
        for ev in finding["evidence"] + [e for s in finding["explains"] for e in s["evidence"]]:
            if ev["kind"] == "table_row":
                assert ev["table"] in report["tables"], ev
    assert report["job"]["world_size"] == 4 and [r["rank"] for r in report["job"]["ranks"]] == [0, 1, 2, 3]


def test_a_rank_with_a_longer_forward_has_uneven_work(tmp_path):
    folder = write_job(tmp_path / "job", 2, {}, forward_us={0: 9000.0})
    done = advisor("diagnose", str(folder), "--format", "json", "--workers", "1")
    top = json.loads(done.stdout)["findings"][0]
    assert top["rule"] == "straggler-rank" and top["title"].endswith("rank 0")
    assert "6.00 ms more per step in forward (9.00 ms against 3.00 ms)" in top["message"]
    assert top["saving"]["ms_per_step"] == pytest.approx(6.0, rel=0.02)
    assert "uneven work" in top["recommendation"]


def test_ranks_in_step_make_no_straggler(tmp_path):
    folder = write_job(tmp_path / "job", 2, {})
    done = advisor("diagnose", str(folder), "--format", "json", "--workers", "1")
    assert "straggler-rank" not in {f["rule"] for f in json.loads(done.stdout)["findings"]}


def test_worker_processes_and_a_dask_cluster_give_the_same_summaries(tmp_path):
    distributed = pytest.importorskip("distributed")
    folder = write_job(tmp_path / "job", 2, {1: 3000.0})
    sources = job_sources([folder])
    in_workers = summarise_job(sources, workers=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        on_dask = summarise_job(sources, dask_address=cluster.scheduler_address)
    for a, b in zip(in_workers, on_dask, strict=True):
        assert isinstance(b, RankSummary) and b.error is None
        assert a.rank == b.rank and a.figures == b.figures
        assert a.calls.equals(b.calls)
        assert [f.rule for f in a.report.findings] == [f.rule for f in b.report.findings]


def test_small_ranks_are_read_in_this_process_unless_workers_are_asked_for(tmp_path):
    """A worker's start-up costs more than a small rank: by default such ranks are read
    here, one after another; --workers N still gets N worker processes."""
    folder = write_job(tmp_path / "job", 3, {1: 3000.0})
    here = summarise_job(job_sources([folder]))
    assert {s.worker_pid for s in here} == {os.getpid()}
    in_workers = summarise_job(job_sources([folder]), workers=2)
    assert os.getpid() not in {s.worker_pid for s in in_workers}
    for a, b in zip(here, in_workers, strict=True):
        assert a.error is None and a.figures == b.figures and a.calls.equals(b.calls)


def test_a_large_first_rank_sends_every_rank_to_the_workers(tmp_path, monkeypatch):
    from advisor.job import run

    folder = write_job(tmp_path / "job", 2, {1: 3000.0})
    monkeypatch.setattr(run, "LARGE_RANK_BYTES", 1)  # every rank file is 'large'
    summaries = summarise_job(job_sources([folder]))
    assert os.getpid() not in {s.worker_pid for s in summaries} and all(s.error is None for s in summaries)


def test_a_rank_whose_summary_fails_here_is_lost_not_the_job(tmp_path, monkeypatch):
    from advisor.job import run

    folder = write_job(tmp_path / "job", 2, {1: 3000.0})
    real = run.summarise_rank

    def failing(source, **kwargs):
        if source.endswith("rank1.json"):
            raise RuntimeError("planted")
        return real(source, **kwargs)

    monkeypatch.setattr(run, "summarise_rank", failing)
    first, second = summarise_job(job_sources([folder]))
    assert first.error is None and second.error.endswith("its summary failed: RuntimeError: planted")


def test_the_pool_pays_only_for_ranks_that_outlast_a_workers_start():
    from advisor.job.run import WORKER_START_S, _pool_pays

    assert not _pool_pays(100.0, 1, 8)  # one rank left: nothing to share
    assert not _pool_pays(WORKER_START_S / 10, 4, 2)  # four small ranks: 0.4 s here
    assert _pool_pays(WORKER_START_S, 4, 2)  # 4 s here, 1 + 2 s in two workers
    assert not _pool_pays(WORKER_START_S, 2, 2)  # 2 s here, 1 + 1 s in two workers: no faster
    assert not _pool_pays(10.0, 4, 1)  # one worker: never faster than here


def test_a_saved_job_renders_again_with_the_same_findings(tmp_path):
    folder = write_job(tmp_path / "job", 2, {1: 3000.0})
    first = advisor("diagnose", str(folder), "--format", "json", "--save", str(tmp_path / "saved"))
    assert first.returncode == 0, first.stderr
    manifest = json.loads((tmp_path / "saved" / "job.json").read_text())
    assert [r["session"] for r in manifest["ranks"]] == ["rank-0", "rank-1"]
    again = advisor("diagnose", str(tmp_path / "saved"), "--format", "json")
    assert again.returncode == 0, again.stderr
    rules = [[f["rule"], f["saving"]["ms_per_step"]] for f in json.loads(first.stdout)["findings"]]
    assert [[f["rule"], f["saving"]["ms_per_step"]] for f in json.loads(again.stdout)["findings"]] == rules
    into_it_again = advisor("diagnose", str(folder), "--save", str(tmp_path / "saved"))
    assert into_it_again.returncode == 2 and "not empty" in into_it_again.stderr


def test_ranks_numbered_from_file_names_and_missing_ranks_are_said(tmp_path):
    folder = write_job(tmp_path / "job", 3, {}, names="worker_{r}.json", with_info=False)
    (folder / "worker_1.json").unlink()
    done = advisor("diagnose", str(folder), "--format", "json")
    report = json.loads(done.stdout)
    assert [r["rank"] for r in report["job"]["ranks"]] == [0, 2]
    assert {r["rank_from"] for r in report["job"]["ranks"]} == {"file name"}
    assert report["job"]["missing_ranks"] == [1]
    assert any("Ranks numbered by file name" in n for n in report["notes"])


def test_sets_that_are_not_one_job_are_refused_in_one_line(tmp_path):
    a = write_job(tmp_path / "a", 2, {})
    b = write_job(tmp_path / "b", 4, {})
    done = advisor("diagnose", str(a / "rank0.json"), str(b / "rank1.json"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "ranks of different jobs" in done.stderr
    twice = advisor("diagnose", str(a / "rank0.json"), str(a / "rank0.json"))
    assert twice.returncode == 2 and "rank 0 appears twice" in twice.stderr


def test_a_rank_that_cannot_be_read_is_left_out_and_said(tmp_path):
    folder = write_job(tmp_path / "job", 3, {})
    (folder / "rank1.json").write_text('{"traceEvents": [')
    summaries = [summarise_rank(str(p)) for p in job_sources([folder])]
    job = order_ranks(summaries, source=str(folder))
    assert [r.rank for r in job.ranks] == [0, 2] and job.missing == [1]
    assert any("could not be read" in n for n in job.notes)


# -- a job advisor launches ---------------------------------------------------------------------

CRASHING_RANK = '''
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
for step in range(30):
    model(torch.randn(8, 64)).sum().backward()
    if rank == 1 and step == 4:
        raise RuntimeError("rank 1 fails at step 4")
    time.sleep(0.01)
dist.destroy_process_group()
'''


def test_torchrun_under_advisor_profiles_every_rank_and_names_the_straggler(tmp_path):
    pytest.importorskip("torch")
    done = advisor("diagnose", "--format", "json", "-o", str(tmp_path / "report.json"), "--save",
                   str(tmp_path / "job"), "torchrun", "--nproc-per-node=2", "examples/ddp_straggler.py", "--steps", "10")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ddp_straggler: 10 steps x2" in done.stdout  # the job's own output is kept
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, report_schema())
    assert [(r["rank"], r["rank_from"], r["exit_code"]) for r in report["job"]["ranks"]] == [
        (0, "launcher", 0), (1, "launcher", 0)]
    top = report["findings"][0]
    assert top["rule"] == "straggler-rank" and top["title"].endswith("rank 0")
    assert "The launcher exited with code 0." in report["notes"]
    # The saved job renders again, each rank's session included.
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["job.json", "rank-0", "rank-1"]
    again = advisor("diagnose", str(tmp_path / "job"), "--format", "json")
    assert json.loads(again.stdout)["findings"][0]["rule"] == "straggler-rank"


def test_a_rank_that_crashes_loses_nothing_the_others_collected(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_RANK)
    done = advisor("diagnose", "--format", "json", "-o", str(tmp_path / "report.json"),
                   "torchrun", "--nproc-per-node=2", str(script), cwd=tmp_path)
    assert done.returncode != 0  # torchrun's own exit code: a rank failed
    assert "rank 1 fails at step 4" in done.stderr  # the user's traceback, as torchrun shows it
    report = json.loads((tmp_path / "report.json").read_text())
    endings = {r["rank"]: (r["ending"], r["exit_code"]) for r in report["job"]["ranks"]}
    assert endings[1] == ("exception", 1)
    # Rank 0 is stopped by torchrun (an interrupt) or by gloo's lost peer (an exception) and saves what
    # it has; where torchrun had to kill it first (a loaded machine), the report names it as missing.
    if 0 in endings:
        assert endings[0][0] in ("interrupt", "exception", "normal")
    else:
        assert report["job"]["missing_ranks"] == [0] and any("saved no profile" in n for n in report["notes"])
    assert "rank 1: RuntimeError: rank 1 fails at step 4" in " ".join(report["notes"])
    assert any("exited with code" in n for n in report["notes"])
    assert not list(tmp_path.glob("advisor-job-*"))


def test_the_html_and_markdown_reports_open_on_the_job(tmp_path):
    folder = write_job(tmp_path / "job", 3, {1: 4000.0})
    html = advisor("diagnose", str(folder), "--format", "html", "-o", str(tmp_path / "r.html"))
    assert html.returncode == 0, html.stderr
    page = (tmp_path / "r.html").read_text()
    job, findings = page.index('<section id="job">'), page.index('<section id="findings">')
    assert job < findings and 'id="chart-ranks"' in page[job:findings]
    assert page[job:findings].count("<h3>Rank ") == 3
    assert '<section id="charts">' not in page  # a session's charts have no data in a job's report
    markdown = advisor("diagnose", str(folder), "--format", "markdown")
    assert "3 of 3 ranks" in markdown.stdout and "#### Ranks" in markdown.stdout
    assert "**Rank 1**" in markdown.stdout and "#### Collectives" in markdown.stdout


def test_compare_takes_two_jobs(tmp_path):
    before = write_job(tmp_path / "before", 2, {1: 4000.0})
    after = write_job(tmp_path / "after", 2, {})
    done = advisor("compare", str(before), str(after), "--format", "json")
    assert done.returncode == 0, done.stderr
    comparison = json.loads(done.stdout)
    gone = {f["rule"] for f in comparison["findings"] if f["status"] == "gone"}
    assert "straggler-rank" in gone
    waits = {r["key"]: r for r in comparison["rows"] if r["table"] == "ranks" and r["column"] == "wait_ns"}
    assert waits["rank 0"]["before"] == pytest.approx(4.0e6, rel=0.02) and not waits["rank 0"]["after"]


def test_ranks_a_script_spawns_itself_are_profiled_as_a_job(tmp_path):
    pytest.importorskip("torch")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--format", "json", "-o",
                           str(tmp_path / "r.json"), "--save", str(tmp_path / "job"), "examples/spawn_train.py",
                           "--steps", "12"], check=False, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "spawn_train: 12 steps on each of 2 ranks" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["rank"] for r in report["job"]["ranks"]] == [0, 1]
    # Each rank recorded the default window's five steps (what the collector did); the
    # report counts the steady ones among them, which a busy machine can make fewer.
    for rank in (0, 1):
        meta = json.loads((tmp_path / "job" / f"rank-{rank}" / "session.json").read_text())
        assert sum(1 for step in meta["timed_steps"] if step["recorded"]) == 5, rank
    assert all(1 <= r["steps"] <= 5 for r in report["job"]["ranks"])
    assert "profile-incomplete" not in {f["rule"] for f in report["findings"]}
    assert (tmp_path / "job" / "job.json").is_file()
    assert not [p for p in scratch.iterdir() if p.name.startswith("advisor-")]  # the ranks' own folder is gone
    assert all(r["source"].startswith(str(tmp_path / "job")) for r in report["job"]["ranks"])


def test_a_rank_trace_with_record_param_comms_gives_process_groups_and_message_sizes(tmp_path):
    trace = shared_trace("ddp_cnn_a100_rank0.json.gz")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / trace.name).symlink_to(trace)
    done = advisor("diagnose", str(tmp_path / "job"), "--format", "json")
    report = json.loads(done.stdout)
    assert report["job"]["world_size"] == 2 and report["job"]["missing_ranks"] == [1]
    rows = {r["key"]: r for r in report["tables"]["collectives"]["rows"]}
    assert set(rows) == {"all_reduce|default_pg", "broadcast|default_pg"}
    # DDP's gradient buckets: 2 M to 8 M floats each (8 to 32 MB), five a step.
    assert rows["all_reduce|default_pg"]["calls_per_step"] == 5
    assert 8e6 <= rows["all_reduce|default_pg"]["bytes_per_call"] <= 32e6


def test_summary_of_a_job_prints_its_cross_rank_tables(tmp_path):
    folder = write_job(tmp_path / "job", 2, {1: 3000.0})
    done = advisor("summary", str(folder), "--format", "json")
    assert done.returncode == 0, done.stderr
    tables = json.loads(done.stdout)
    assert {"ranks", "collectives"} <= set(tables)


def test_what_only_the_straggler_has_is_shown_under_it():
    from advisor.job.diagnose import diagnose_saved_job

    _, diagnosis = diagnose_saved_job(REPO / "cases" / "cpu_ddp_straggler" / "session")
    top = diagnosis.findings[0]
    assert top.rule == "straggler-rank"
    nested = {f.rule: f for f in top.explains}
    # rank 0's int() on the validation accuracy: on rank 0 alone, so part of what it does differently
    assert nested["sync-memcpy-stall"].metrics["ranks"] == [0]
    assert "sync-memcpy-stall" not in {f.rule for f in diagnosis.findings}
