"""Measuring without disturbing: the window of recorded steps, the step clock, the stack
sampler, and the tables and rules built on them.

- The host collector records only the window's steps (2 to 6 by default) and times every
  step; the unrecorded steps give the job's own pace.
- A whole-run recording stops where the event budget is spent, and says so.
- The stack sampler lands where the time goes (a signal on the process's CPU time), in
  the main thread and in DataLoader workers, and gives the previous SIGPROF handler back.
- Python Hotspots shares each phase's clock time among the lines sampled in it.
- dataloader-starvation advises what holds for the loader; host-bound names the function;
  profile-incomplete leads the report and trips --fail-on.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from builders import Trace

from advisor.cli import FAIL_ON_EXIT, main
from advisor.collect import collect_script
from advisor.collect.stacks import StackSampler
from advisor.collect.steps import StepClock, StepWindow
from advisor.findings import Finding, Saving, Severity
from advisor.rules import RuleContext, builtin_specs, engine, run_rules
from advisor.session import CollectorInfo, Session, SessionMeta, TimedStep, conform_events
from advisor.step import build_step_model
from advisor.tables import compute_tables

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


LOOP = """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    steps = {steps}
    x = torch.randn(16 * steps, 8)
    y = torch.randint(0, 2, (16 * steps,))
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
"""


# -- the step clock and the window -----------------------------------------------------------


def test_the_step_clock_adds_up_phases_and_marks_what_was_recorded():
    ticks = iter(range(0, 10_000, 10))
    clock = StepClock(clock=lambda: next(ticks))
    clock.step_opened(0, recorded=False)
    clock.phase_opened("Dataloader")
    clock.phase_closed()
    clock.phase_opened("Forward")
    clock.phase_closed()
    clock.phase_opened("Dataloader")  # a second read in the same step adds up
    clock.phase_closed()
    clock.step_closed(partial=False)
    clock.step_opened(1, recorded=True)
    clock.step_closed(partial=True)
    rows = clock.as_records()
    assert [(r["step"], r["recorded"], r["partial"]) for r in rows] == [(0, False, False), (1, True, True)]
    assert rows[0]["phases"] == {"Dataloader": 20, "Forward": 10}
    assert rows[0]["duration_ns"] == 70


def test_windows_describe_themselves():
    assert StepWindow().describe() == "steps 2-6"
    assert StepWindow(3, 4).describe() == "step 3"
    assert StepWindow(5, None).describe() == "steps 5 on"


def test_only_the_window_is_recorded_and_every_step_is_timed(tmp_path):
    script = write(tmp_path, "loop.py", LOOP.format(steps=12))
    session = collect_script(script, [], gpu=False, steps=StepWindow(2, 5)).session
    steps = sorted(int(s) for s in session.steps()["step"])
    assert steps == [2, 3, 4]
    timed = session.meta.timed_steps
    assert [t.step for t in timed] == list(range(12))
    assert [t.step for t in timed if t.recorded] == [2, 3, 4]
    assert all(t.phases.get("Forward", 0) > 0 for t in timed)
    # each step's CPU time, the main thread's and the whole process's (torch's threads too)
    assert all(t.cpu_ns > 0 and t.process_cpu_ns > 0 for t in timed)
    timing = compute_tables(session, ["step_timing"])["step_timing"]
    # Steps 6..11: 0 and 1 are warm-up, 5 pays for stopping the profiler. On a loaded
    # machine a step slowed by other work can be set apart as periodic, recorded or not:
    # the window names it, and the table gives it a row of its own.
    periodic = build_step_model(session).window.periodic
    apart = set(periodic.steps) if periodic is not None and periodic.source == "timed steps" else set()
    recorded_apart = {2, 3, 4} & (set(periodic.steps) if periodic is not None else set())
    assert timing.at["ProfileStep", "recorded_steps"] == 3 - len(recorded_apart)
    assert timing.at["ProfileStep", "cpu_cores"] > 0 and timing["cpu_cores"].drop("ProfileStep").isna().all()
    assert timing.at["ProfileStep", "unrecorded_steps"] == len(set(range(6, 12)) - apart)
    assert ("PeriodicStep" in timing.index) == bool(apart)
    assert timing.at["ProfileStep", "source"] == "unrecorded steps"
    # The recorded steps' operators are in the trace, the others' are not.
    ops = session.events[session.events["kind"] == "op"]
    assert len(ops) and set(ops["step"][ops["step"] >= 0]) <= {2, 3, 4}


def test_a_whole_run_recording_stops_where_the_event_budget_is_spent(tmp_path):
    script = write(tmp_path, "loop.py", LOOP.format(steps=45))
    run = collect_script(script, [], gpu=False, steps=None, event_budget=50)
    session = run.session
    recording = session.meta.trace_metadata["advisor"]["recording"]
    assert "event budget of 50 events" in recording["stopped"]
    recorded = [t.step for t in session.meta.timed_steps if t.recorded]
    assert recorded == list(range(20))  # the first part of the run: 20 steps
    assert len(session.meta.timed_steps) == 45
    gaps = compute_tables(session, ["collection"])["collection"]
    assert any("recording stopped early" in why for why in gaps["why"])
    findings = run_rules(session, compute_tables(session)).findings
    assert findings[0].rule == "profile-incomplete"


def test_recording_in_parts_joins_the_parts(tmp_path):
    script = write(tmp_path, "loop.py", LOOP.format(steps=45))
    session = collect_script(script, [], gpu=False, steps=None).session
    steps = sorted(int(s) for s in session.steps()["step"])
    assert steps == list(range(45))
    assert len(session.meta.trace_metadata["advisor"]["recording"]["parts"]) == 3
    # Relations survive the joining: every op's top op is an op.
    ev = session.events
    tops = ev["top_op"].to_numpy()[(ev["kind"] == "op").to_numpy()]
    assert (ev["kind"].to_numpy()[tops[tops >= 0]] == "op").all()


def test_a_run_that_never_reaches_the_window_is_incomplete_and_fails_a_gate(tmp_path, capsys):
    script = write(tmp_path, "short.py", LOOP.format(steps=2))
    assert main(["diagnose", "--fail-on", "high", str(script)]) == FAIL_ON_EXIT
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if line.startswith("1. "))
    assert "[profile-incomplete]" in first
    assert "the script ran 2 steps" in out and "nothing was recorded" in out


# -- the stack sampler -----------------------------------------------------------------------


def busy_python(seconds: float) -> int:
    # Seconds of this thread's CPU time, not of the clock: the sampler's signal counts CPU
    # time, so the samples a test asks for come however busy the machine is.
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
        total += sum(len(str(i)) for i in range(200))
    return total


SAMPLES_WANTED = 20


def until_sampled(sampler: StackSampler, work, guard_s: float = 60.0) -> None:
    """Run ``work()``, a short stretch of CPU work, until the sampler holds SAMPLES_WANTED
    samples. Its signal counts CPU time, and on a busy machine fewer of its ticks land (3
    samples in 0.3 s of CPU time beside 8 spinning processes on 2 cores): the test waits
    for samples, not for a time."""
    end = time.monotonic() + guard_s
    while len(sampler.samples.time_ns) < SAMPLES_WANTED and time.monotonic() < end:
        work()


def test_samples_land_where_python_spends_its_time():
    sampler = StackSampler(interval_s=0.005).start()
    assert sampler.way == "signal"
    until_sampled(sampler, lambda: busy_python(0.05))
    samples = sampler.stop()
    assert len(samples) >= SAMPLES_WANTED
    innermost = [samples.stacks[i].split(";")[0] for i in samples.stack_id]
    mine = sum(1 for frame in innermost if "busy_python" in frame or "<genexpr>" in frame)
    assert mine / len(innermost) > 0.8, innermost[:5]
    assert signal.getsignal(signal.SIGPROF) in (signal.SIG_DFL, None)


def decode_bytes(blob: bytes, seconds: float) -> int:
    end = time.thread_time() + seconds  # CPU seconds, as busy_python
    acc = 0
    while time.thread_time() < end:
        for b in blob:  # a pure-Python loop ending in an if: its jump back has no line of its own
            acc = (acc * 31 + b) & 0xFF
            if acc == 7:
                acc = 0
    return acc


def test_samples_in_a_python_loop_name_the_loop_not_its_caller():
    sampler = StackSampler(interval_s=0.005).start()
    blob = bytes(range(256)) * 16
    until_sampled(sampler, lambda: decode_bytes(blob, 0.05))
    samples = sampler.stop()
    innermost = [samples.stacks[i].split(";")[0] for i in samples.stack_id]
    assert not [frame for frame in innermost if "(None)" in frame]
    loop = decode_bytes.__code__.co_firstlineno + 4  # the `for b in blob` line, or the one below it
    lines = [int(frame.split("(")[1].split(")")[0]) for frame in innermost if "decode_bytes" in frame]
    assert len(lines) / len(innermost) > 0.8, innermost[:5]
    assert sum(line in (loop, loop + 1) for line in lines) / len(lines) > 0.8, lines[:10]


def _nothing() -> int:
    return 1


def copy_then_call(big: list[int], seconds: float) -> int:
    end = time.thread_time() + seconds  # CPU seconds, as busy_python
    count = 0
    while time.thread_time() < end:
        tripled = big * 3  # an operator's C code: no check for a signal until the next call
        count += _nothing() + len(tripled) * 0
    return count


def test_a_sample_that_waited_out_an_operator_names_the_operators_line_not_the_next_call():
    # The handler runs at the first check after the timer fired: here the entry of _nothing,
    # which has run nothing yet. The time was the caller's, in its operator's line.
    big = list(range(400_000))
    sampler = StackSampler(interval_s=0.005).start()
    until_sampled(sampler, lambda: copy_then_call(big, 0.05))
    samples = sampler.stop()
    innermost = [samples.stacks[i].split(";")[0] for i in samples.stack_id]
    operator = copy_then_call.__code__.co_firstlineno + 4
    mine = [frame for frame in innermost if "copy_then_call" in frame or "_nothing" in frame]
    assert len(mine) >= SAMPLES_WANTED // 2
    assert not [frame for frame in mine if "_nothing" in frame], mine[:5]
    on_operator = [frame for frame in mine if f"({operator}): copy_then_call" in frame]
    assert len(on_operator) / len(mine) > 0.8, mine[:5]


def test_someone_elses_sigprof_handler_is_left_alone():
    def theirs(signum, frame):
        pass

    previous = signal.signal(signal.SIGPROF, theirs)
    try:
        sampler = StackSampler(interval_s=0.005).start()
        assert sampler.way == "thread"
        busy_python(0.05)
        sampler.stop()
        assert signal.getsignal(signal.SIGPROF) is theirs
    finally:
        signal.signal(signal.SIGPROF, previous)


def test_a_signal_that_comes_while_the_handler_runs_is_one_sample_not_a_nest():
    # A handler slower than the interval (the first sight of a large code object) is
    # interrupted by the next signal: that one is dropped, not handled inside the first.
    sampler = StackSampler(interval_s=3600)
    inner = sampler._record
    nested = []

    def record(frame):
        if not nested:
            nested.append(True)
            sampler._on_signal(signal.SIGPROF, frame)  # the next signal, mid-sample
        inner(frame)

    sampler._record = record
    sampler._on_signal(signal.SIGPROF, sys._getframe())
    assert len(sampler.samples) == 1 and nested


def test_a_signal_that_comes_as_the_handler_is_called_is_one_sample_in_the_users_code():
    # The next signal can be pending by the time Python calls the handler for the last one:
    # it is handled at the handler's own entry, with the handler's frame, before that call
    # has marked itself as running. Made certain here: as the handler is called, it is
    # called again with its own frame, as that signal would call it.
    sampler = StackSampler(interval_s=3600).start()
    handler = StackSampler._on_signal.__code__
    again = []

    def signal_again(frame, event, arg):
        if event == "call" and frame.f_code is handler and not again:
            again.append(frame)
            sampler._on_signal(signal.SIGPROF, frame)

    try:
        sys.setprofile(signal_again)
        signal.raise_signal(signal.SIGPROF)
        _nothing()
    finally:
        sys.setprofile(None)
        samples = sampler.stop()
    assert again
    innermost = [samples.stacks[i].split(";")[0] for i in samples.stack_id]
    assert len(innermost) == 1 and "test_a_signal_that_comes_as" in innermost[0], innermost


def test_a_sample_taken_as_a_compiled_call_starts_is_not_taken_for_the_users_function(tmp_path):
    # The timer fires just after torch.compile set its frame hook and before the compiled
    # function's frame starts (here made certain: the signal is raised right there). The
    # handler must run as plain Python, or a fullgraph call fails with "no compiled frames".
    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent(
        """
        import signal
        import torch
        import torch._dynamo.eval_frame as frames
        from advisor.collect.stacks import StackSampler

        sampler = StackSampler(interval_s=3600).start()
        assert sampler.way == "signal"
        original = frames._maybe_set_eval_frame

        def set_then_signal(callback):
            previous = original(callback)
            signal.raise_signal(signal.SIGPROF)
            return previous

        frames._maybe_set_eval_frame = set_then_signal
        model = torch.nn.Linear(4, 2)
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        for _ in range(3):
            compiled(torch.randn(2, 4)).sum().backward()
        samples = sampler.stop()
        print("samples", len(samples))
        """
    ))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) >= 3


def test_loader_workers_are_sampled_and_named(tmp_path):
    script = write(tmp_path, "workers.py", """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, Dataset

        def tokenize(n):
            words = []
            for i in range(4000 + n % 7):
                words.append(str(i * 31 % 977))
            return len(" ".join(words))

        class Texts(Dataset):
            def __len__(self):
                return 16 * 12
            def __getitem__(self, i):
                return torch.tensor([float(tokenize(i))]), i % 2

        model = nn.Linear(1, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in DataLoader(Texts(), batch_size=16, num_workers=1):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x / 1e4), y).backward()
            opt.step()
    """)
    session = collect_script(script, [], gpu=False).session
    stacks = session.events[session.events["kind"] == "stack"]
    assert set(stacks["category"].astype(str)) == {"main", "loader worker"}
    tables = compute_tables(session, ["dataloaders", "python_hotspots"])
    loader = tables["dataloaders"].iloc[0]
    assert loader["num_workers"] == 1 and loader["kind"] == "map-style"
    assert loader["top_function"].startswith("tokenize (") and loader["workers_busy"] > 0.5
    worker_rows = tables["python_hotspots"][tables["python_hotspots"]["role"] == "loader worker"]
    assert "tokenize" in set(worker_rows["function"])
    # its busiest lines are the loop's: def tokenize is line 6, the loop body lines 8-9
    assert set(int(n) for n in loader["top_lines"].split(",")) <= {7, 8, 9, 10}
    assert loader["top_caller"] == ""  # called by __getitem__, where the loader calls in


def test_loading_names_the_caller_of_its_busiest_function(tmp_path):
    script = write(tmp_path, "caller.py", """
        import torch
        from torch.utils.data import DataLoader, Dataset

        def pieces(word):
            out = []
            for i in range(len(word)):
                out.append(word[:i + 1])
            return out

        def tokenize(n):
            total = 0
            for i in range(300 + n % 5):
                total += len(pieces(str(i) * 40))
                for _ in range(10):  # work of its own, a few times less than pieces': its
                    total += 1       # share is then always past its callee's, not equal to it
            return total

        class Texts(Dataset):
            def __len__(self):
                return 8 * 10
            def __getitem__(self, i):
                return torch.tensor([float(tokenize(i))])

        for x in DataLoader(Texts(), batch_size=8):
            (x * 2).sum()
    """)
    session = collect_script(script, [], gpu=False).session
    loader = compute_tables(session, ["dataloaders"])["dataloaders"].iloc[0]
    assert loader["top_function"].startswith("pieces (")
    assert loader["top_caller"].startswith("tokenize (") and loader["top_caller_share"] > loader["top_function_share"]


def test_a_comprehension_s_work_is_the_function_around_it_s(tmp_path):
    # decode's work is all in its list comprehension, a frame of its own: loading's busiest
    # function is decode, with the comprehension's share, not "<listcomp>"
    script = write(tmp_path, "comprehension.py", """
        import torch
        from torch.utils.data import DataLoader, Dataset

        def decode(n):
            rows = [sum(j * j for j in range(300)) + i for i in range(40 + n % 3)]
            return float(len(rows))

        class Images(Dataset):
            def __len__(self):
                return 8 * 10
            def __getitem__(self, i):
                return torch.tensor([decode(i)])

        for x in DataLoader(Images(), batch_size=8):
            (x * 2).sum()
    """)
    session = collect_script(script, [], gpu=False).session
    tables = compute_tables(session, ["dataloaders", "python_hotspots"])
    loader = tables["dataloaders"].iloc[0]
    # (without it, decode's own lines hold next to nothing: the work is the comprehension's)
    assert loader["top_function"].startswith("decode (") and loader["top_function_share"] > 0.5
    # busiest first: the comprehension's line leads (a stray sample on line 7, `return`, may
    # follow it on a loaded machine; top_lines lists up to three)
    assert int(loader["top_lines"].split(",")[0]) == 6
    # the per-line table names the comprehension's line by its function too
    functions = set(tables["python_hotspots"]["function"])
    assert "decode" in functions and not functions & {"<listcomp>", "<genexpr>"}


def test_a_main_process_loader_gets_its_worker_hand_over_timed_and_its_reads_of_items_are_no_waits(tmp_path):
    script = write(tmp_path, "padded.py", """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Padded(Dataset):
            def __init__(self):
                self.x = torch.randn(64, 8, 4)
                self.mask = torch.rand(64, 8) > 0.3
            def __len__(self):
                return 64
            def __getitem__(self, i):
                length = int(self.mask[i:i + 1].sum(1).max())  # a CPU tensor read, no wait
                return self.x[i, :max(length, 1)].mean(0), i % 2

        torch.set_num_threads(1)
        model = torch.nn.Linear(4, 2)
        for x, y in DataLoader(Padded(), batch_size=8):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            print(float(loss.item()))  # the loop's own read, outside loading
    """)
    session = collect_script(script, [], gpu=False).session
    (entry,) = session.meta.trace_metadata["advisor"]["loaders"]
    assert entry["batch_tensors"] == [[[8, 4], "float32"], [[8], "int64"]]
    assert entry["handoff"]["batches"] >= 1 and entry["handoff"]["tensors"] == 2
    tables = compute_tables(session, ["dataloaders", "host_sync"])
    loader = tables["dataloaders"].iloc[0]
    assert loader["handoff_main_ns"] > 0 and loader["handoff_wall_ns"] > 0
    assert loader["torch_threads"] == 1  # as the script set them
    # Each read's and fetch's own time kept beside the sums, for the table to see a stall.
    assert len(entry["read_each_ns"]) == entry["reads"] == 8 and sum(entry["read_each_ns"]) == entry["read_ns"]
    assert [f[2] for f in entry["fetch_each"]] == [8] * 8
    assert all(0 < collate <= fetch for fetch, collate, _ in entry["fetch_each"])
    # The Dataset's int(tensor) is no host-blocking call; the loop's loss.item() is one.
    sources = set(tables["host_sync"]["source"])
    assert len(sources) == 1 and sources.pop().endswith("padded.py:20")


def _loader_entry(reads: int, stall_at: list[int], *, stall_ns: int = 190_000_000) -> dict:
    """A main-process loader's entry as the collector writes it: each read 6.5 ms, of
    which the fetch 5.5 (64 items of 82 us and a collation of 0.25 ms); the reads at
    ``stall_at`` held up ``stall_ns`` inside their collation."""
    read_each, fetch_each = [], []
    for n in range(reads):
        extra = stall_ns if n in stall_at else 0
        read_each.append(6_500_000 + extra)
        fetch_each.append([5_500_000 + extra, 250_000 + extra, 64])
    return {"dataset": "data.Packed", "dataset_name": "Packed", "num_workers": 0, "batch_size": 64,
            "auto_collation": True, "collate_fn": "default_collate", "reads": reads, "read_ns": sum(read_each),
            "fetches": reads, "fetch_ns": sum(f[0] for f in fetch_each), "collate_ns": sum(f[1] for f in fetch_each),
            "fetch_cpu_ns": sum(f[0] for f in fetch_each), "items": 64 * reads, "random_fetches": 0,
            "read_each_ns": read_each, "fetch_each": fetch_each}


@pytest.mark.parametrize("stall_at, set_apart", [([54], True), ([10, 25, 40, 54, 70], False), ([], False)])
def test_a_read_a_pause_held_up_is_set_apart_from_the_loader_s_means(stall_at, set_apart):
    """One read in 80 held up 190 ms (a full garbage collection inside torch's collation):
    in the sums it made the mean collation 2.6 ms against 0.25, and the script's own work 60 %
    of a read against 82 %, which sized the fix. Set apart, the means are the loader's;
    slow reads that recur (5 in 80) are its own and stay."""
    t = Trace()
    t.step(1, 0, 10)
    session = t.session(gpu_measured=False, advisor={"loaders": [_loader_entry(80, stall_at)]})
    loader = compute_tables(session, ["dataloaders"])["dataloaders"].iloc[0]
    assert loader["reads"] == 80
    if set_apart:
        assert loader["stalled_reads"] == 1 and loader["stalled_ns"] == pytest.approx(190_000_000)
        assert loader["read_avg_ns"] == pytest.approx(6_500_000)
        assert loader["collate_avg_ns"] == pytest.approx(250_000)
        assert loader["item_avg_ns"] == pytest.approx(5_250_000 / 64)
    else:
        assert loader["stalled_reads"] == 0 and loader["stalled_ns"] == 0
        assert loader["read_avg_ns"] == pytest.approx(6_500_000 + 190_000_000 * len(stall_at) / 80)
        assert loader["collate_avg_ns"] == pytest.approx(250_000 + 190_000_000 * len(stall_at) / 80)


def test_a_loader_entry_without_each_read_s_time_is_read_from_its_sums():
    """Sessions saved before each read's time was kept (cases/) give the means of the sums."""
    entry = _loader_entry(80, [54])
    del entry["read_each_ns"], entry["fetch_each"]
    t = Trace()
    t.step(1, 0, 10)
    loader = compute_tables(t.session(gpu_measured=False, advisor={"loaders": [entry]}),
                            ["dataloaders"])["dataloaders"].iloc[0]
    assert loader["stalled_reads"] == 0
    assert loader["collate_avg_ns"] == pytest.approx(250_000 + 190_000_000 / 80)


def test_the_hand_over_probe_says_why_it_did_not_run():
    from advisor.collect.handoff import MAX_BYTES, probe_handoff

    assert probe_handoff(torch, [])["skipped"] == "the batches hold no tensors"
    assert "not probed" in probe_handoff(torch, [[[MAX_BYTES], "float32"]])["skipped"]
    assert "could not be described" in probe_handoff(torch, [[[4], "no_such_dtype"]])["skipped"]


# -- Python Hotspots ----------------------------------------------------------------------------


def sampled_session(rows: list[dict], timed: list[TimedStep], roots: list[str]) -> Session:
    events = conform_events(pd.DataFrame(rows))
    meta = SessionMeta(source="hand-made", source_format="test", collector=CollectorInfo(name="test"),
                       timed_steps=timed, trace_metadata={"advisor": {"library_roots": roots}})
    return Session(meta, events)


def stack_row(t: int, weight: int, stack: str, step: int, phase: str, role: str = "main") -> dict:
    return {"name": "python stack", "kind": "stack", "category": role, "start_ns": t - weight, "end_ns": t,
            "pid": 1, "tid": 1, "step": step, "phase": phase, "call_stack": stack}


def test_each_phase_s_clock_time_is_shared_among_its_samples():
    lib = "/usr/lib/python3/"
    augment = f"/home/me/train.py(12): augment;/home/me/train.py(40): main;{lib}runpy.py(88): _run_code"
    loop = f"{lib}torch/nn/functional.py(5): linear;/home/me/train.py(44): main;{lib}runpy.py(88): _run_code"
    rows, t = [], 1_000_000
    for step in range(4):
        # Few samples in the Python phase, many in the model's (as the GIL would have it).
        rows += [stack_row(t, 5_000_000, augment, step, "")]
        rows += [stack_row(t + i, 1_000_000, loop, step, "Forward") for i in range(1, 9)]
        t += 20_000_000
    timed = [TimedStep(step=s, start_ns=s * 20_000_000, duration_ns=20_000_000, recorded=s < 2,
                       phases={"Forward": 8_000_000}) for s in range(4)]
    session = sampled_session(rows, timed, [lib])
    table = compute_tables(session, ["python_hotspots"])["python_hotspots"]
    by_function = table.set_index("function")
    # Others is 12 ms of each 20 ms step by the clock, all of it augment's.
    assert by_function.at["augment", "per_step_ns"] == pytest.approx(12_000_000)
    assert by_function.at["augment", "other_ns"] == pytest.approx(12_000_000)
    assert by_function.at["main", "forward_ns"] == pytest.approx(8_000_000)
    assert by_function.at["augment", "share_of_step"] == pytest.approx(0.6)
    assert by_function.at["augment", "own_code_share"] == 1.0
    assert by_function.at["main", "own_code_share"] == 0.0  # its time is torch's linear


# -- the rules ---------------------------------------------------------------------------------


def loader_session(*, share: float, steps: int = 15, gpu_busy_ms: float | None = None) -> Session:
    """``steps`` CPU steps of 100 ms: the data loader's read for ``share`` of each, the model
    the rest. With ``gpu_busy_ms``, where loading ends the host launches a kernel that runs
    that long, queued behind the one before (a GPU-bound step when it is longer than the
    host's)."""
    from builders import Trace

    t = Trace()
    for i in range(steps):
        base = 100.0 * i
        t.step(i, base, base + 100)
        t.phase("Dataloader", base, base + 100 * share)
        t.phase("Forward", base + 100 * share, base + 100)
        op = t.op("aten::mm", base + 100 * share, base + 100 * share + 1)
        if gpu_busy_ms is not None:
            launch = t.call("cudaLaunchKernel", base + 100 * share + 0.1, base + 100 * share + 0.2, parent=op)
            start = max(base + 100 * share + 0.21, (i * gpu_busy_ms + 100 * share + 0.21))
            t.gpu("gemm", "kernel", start, start + gpu_busy_ms, launch=launch)
    return t.session(gpu_measured=gpu_busy_ms is not None)


def loader_context(*, kind: str, workers: int, item_ns: float, usable_cores: float = 4.0, share: float = 0.4,
                   top: str = "tokenize (train.py)", cpu_share: float = 1.0, runnable_share: float = float("nan"),
                   gpu_busy_ms: float | None = None, collate_fn: str | None = None,
                   collate_ns: float = 1e5, handoff: tuple[float, float] | None = None,
                   torch_threads: int | None = None, length: int | None = None,
                   persistent: bool | None = None, random_share: float | None = None) -> RuleContext:
    from advisor.step import build_step_model

    spec = next(s for s in builtin_specs() if s.id == "dataloader-starvation")
    step = 100e6
    timing = pd.DataFrame({"best_ratio": [share], "best_avg_ns": [share * step], "source": ["unrecorded steps"],
                           "unrecorded_steps": [10], "recorded_steps": [5], "overhead_ratio": [0.1]},
                          index=["Dataloader"])
    loaders = pd.DataFrame({
        "dataset": ["m.Data"], "kind": [kind], "batched_fetch": [False], "num_workers": [workers],
        "batch_size": [32], "pin_memory": [False], "reads": [40], "read_avg_ns": [share * step],
        "fetch_avg_ns": [share * step * 0.95 if not workers else np.nan],
        "item_avg_ns": [item_ns if not workers else np.nan],
        "collate_avg_ns": [collate_ns if not workers else np.nan],
        "machinery_avg_ns": [1e5], "items_per_batch": [32.0 if not workers else np.nan],
        "workers_busy": [0.97 if workers else np.nan], "top_function": [top], "top_function_share": [0.8],
        "fetch_cpu_share": [cpu_share if not workers else np.nan],
        "fetch_runnable_share": [runnable_share if not workers else np.nan],
    }, index=["Data"])
    if random_share is not None:  # the fetches that drew random numbers
        loaders["random_share"] = random_share
    if persistent is not None:  # persistent_workers=
        loaders["persistent_workers"] = persistent
    if length is not None:  # the dataset's items
        loaders["length"] = float(length)
    if torch_threads is not None:  # the main process's operator threads as the script set them
        loaders["torch_threads"] = float(torch_threads)
    if collate_fn is not None:
        loaders["collate_fn"] = collate_fn
    if handoff is not None:  # the worker hand-over timed after the run: (main process, worker) per batch
        loaders["handoff_main_ns"], loaders["handoff_wall_ns"] = handoff
    # The cores the job may use (its affinity and quota); the machine has 4.
    device = pd.DataFrame({"logical_cores": [4.0], "usable_cores": [usable_cores]}, index=["cpu"])
    tables = {"step_timing": timing, "dataloaders": loaders, "device": device}
    model = build_step_model(loader_session(share=share, gpu_busy_ms=gpu_busy_ms))
    return RuleContext(tables=tables, spec=spec, step_count=15, mean_step_ns=step, window_ns=int(15 * step),
                       gpu_measured=gpu_busy_ms is not None, model=model)


def advise(**kwargs) -> Finding:
    (finding,) = engine.checks()["dataloader-starvation"](loader_context(**kwargs))
    return finding


def test_in_memory_tensors_get_batched_indexing_not_workers():
    finding = advise(kind="in-memory tensors", workers=0, item_ns=3_000)
    assert "__getitems__" in finding.recommendation and "BatchSampler" in finding.recommendation
    assert "num_workers=" not in finding.recommendation
    assert finding.metrics["advice"] == "batched indexing"


def test_cheap_items_of_any_dataset_get_batched_indexing():
    assert advise(kind="map-style", workers=0, item_ns=8_000).metrics["advice"] == "batched indexing"


def test_a_collate_function_of_the_scripts_own_that_is_most_of_a_batch_is_not_replaced_by_a_batched_index():
    # Cheap items (3 us x 32) and 30 ms of the script's own collation a batch: a batched index
    # would leave that work where it is; workers (4 cores free) take it off the step.
    own = advise(kind="map-style", workers=0, item_ns=3_000, collate_fn="collate", collate_ns=30e6,
                 top="collate (train.py)")
    assert own.metrics["advice"] == "num_workers=1" and "__getitems__" not in own.recommendation
    assert "collate (train.py)" in own.recommendation
    # torch's own collation (stacking the items) is what a batched index replaces.
    stacked = advise(kind="map-style", workers=0, item_ns=3_000, collate_fn="default_collate", collate_ns=30e6)
    assert stacked.metrics["advice"] == "batched indexing"


def test_workers_that_would_take_the_model_s_cores_are_said_to_be_why_they_do_not_pay():
    # 2 cores, torch's operators on both, a cheap hand-over (2 ms against 20 ms to make a
    # batch): the reason is the cores the worker takes, said first, not the hand-over alone
    # (which read as a reason for workers).
    finding = advise(kind="map-style", workers=0, item_ns=1.2e6, share=0.2, usable_cores=2.0, torch_threads=2,
                     handoff=(2e6, 3e6))
    assert finding.metrics["workers_do_not_pay"] and finding.metrics["advice"] == "cheaper per-item work"
    assert ("Worker processes would not make the step shorter here: the job may use 2.0 cores, and a worker's CPU "
            "work would take them from the model's operators (torch runs them on 2 threads): the rest of the step up "
            "to 2.00x as long; handing a batch over") in finding.recommendation


def test_workers_are_not_advised_where_handing_a_batch_over_costs_more_than_they_save():
    # 40 ms of per-item work a 100 ms step, 4 cores: free hand-overs, one worker hides it.
    assert advise(kind="map-style", workers=0, item_ns=1.2e6, handoff=(0.0, 0.0)).metrics["advice"] == "num_workers=1"
    # Receiving each batch takes the main process 30 ms and sending it a worker 45 ms (timed on
    # the machine): with the rest 30 % slower beside the workers (at worst), the main process
    # alone needs 60 x 1.3 + 30 = 108 ms, more than the step now.
    finding = advise(kind="map-style", workers=0, item_ns=1.2e6, handoff=(30e6, 45e6))
    assert finding.metrics["advice"] == "cheaper per-item work" and finding.metrics["workers_do_not_pay"]
    assert "num_workers=" not in finding.recommendation
    assert "handing a batch over from a worker costs the main process 30.0 ms" in finding.recommendation
    assert "tokenize (train.py)" in finding.recommendation
    assert any(e.table == "dataloaders" and e.column == "handoff_main_ns" for e in finding.evidence)
    # The per-item work (32 x 1.2 ms of the 40 ms read) goes; the rest of the read stays.
    assert finding.saving.ms_per_step == pytest.approx(40 * 32 * 1.2 / 40, abs=0.01)
    assert finding.saving.high_ms_per_step == pytest.approx(40, abs=0.01)
    # A collate function of the script's own is its work too: cheaper, it saves its time.
    collated = advise(kind="map-style", workers=0, item_ns=3_000, collate_fn="collate", collate_ns=30e6,
                      top="collate (train.py)", handoff=(30e6, 45e6))
    assert collated.metrics["advice"] == "cheaper per-item work"
    assert collated.saving.ms_per_step == pytest.approx(32 * 0.003 + 30, abs=0.01)
    # A cheaper hand-over (1 ms and 2 ms a batch) leaves the workers their saving.
    cheap = advise(kind="map-style", workers=0, item_ns=1.2e6, handoff=(1e6, 2e6))
    assert cheap.metrics["advice"] == "num_workers=1"
    # The main process still receives the batch: the point saves that much less than free.
    assert cheap.saving.ms_per_step == pytest.approx(100 - 60 * 1.05 - 1, abs=0.01)


def test_workers_that_take_cores_from_the_models_own_threads_slow_it_at_worst():
    # 6 cores; the model's operators run on 6 threads (torch's default). One worker leaves
    # them 5 cores: at worst they had scaled perfectly and run 6 / 5 times longer, beside the
    # worker 30 % slower on top. At best they had not scaled at all; the point takes the
    # geometric middle, sqrt(6 / 5), beside the worker 5 % slower.
    finding = advise(kind="map-style", workers=0, item_ns=1.2e6, usable_cores=6.0, torch_threads=6)
    assert finding.metrics["advice"] == "num_workers=1" and finding.metrics["rest_threads"] == 6
    assert finding.saving.ms_per_step == pytest.approx(100 - 60 * 1.05 * math.sqrt(6 / 5), abs=0.01)
    assert finding.metrics["rest_slowdown_point"] == pytest.approx(math.sqrt(6 / 5))
    assert "counts it 1.10 times as long" in finding.recommendation
    assert finding.saving.low_ms_per_step == pytest.approx(100 - 60 * 1.3 * 6 / 5, abs=0.01)
    # the main process's operators get the cores the worker leaves
    assert "torch.set_num_threads(5)" in finding.recommendation and finding.metrics["fix_torch_threads"] == 5
    assert any(e.table == "dataloaders" and e.column == "torch_threads" for e in finding.evidence)
    # Operators on threads that fit in what the worker leaves lose nothing to it.
    roomy = advise(kind="map-style", workers=0, item_ns=1.2e6, usable_cores=8.0, torch_threads=6)
    assert roomy.saving.low_ms_per_step == pytest.approx(100 - 60 * 1.3, abs=0.01)
    assert "set_num_threads" not in roomy.recommendation


def test_a_model_whose_threads_fill_the_cores_gets_one_thread_beside_its_worker():
    # 2 cores, the model's operators on 2 threads: beside a worker they would compete with
    # it; at worst, on one thread, the step does not get shorter at all. Items augmented at
    # random cannot be made once: the workers lead.
    finding = advise(kind="map-style", workers=0, item_ns=1.2e6, usable_cores=2.0, torch_threads=2, random_share=1.0,
                     top="__getitem__ (train.py)")
    assert finding.metrics["advice"] == "num_workers=1"
    assert "torch.set_num_threads(1)" in finding.recommendation and "run on 2 threads" in finding.recommendation
    assert finding.saving.low_ms_per_step == 0.0
    # The point: the rest on one thread sqrt(2) times as long (between not scaling and
    # scaling perfectly with its threads), 5 % slower beside the worker.
    assert finding.saving.ms_per_step == pytest.approx(100 - 60 * 1.05 * math.sqrt(2), abs=0.01)
    assert "counts it 1.41 times as long (as long as it is at best, 2.00 times at worst" in finding.recommendation
    assert "the host's other work (1.41 times as long on the threads the workers leave it)" in finding.saving.remains
    # Items that can be made once: that saves clearly more than the worker on one thread.
    made_once = advise(kind="map-style", workers=0, item_ns=1.2e6, usable_cores=2.0, torch_threads=2)
    assert made_once.metrics["advice"] == "cheaper per-item work"
    assert made_once.metrics["other_ms_per_step"] == pytest.approx(finding.saving.ms_per_step, abs=0.01)
    # On one thread already (or not recorded): no thread advice, the usual low end.
    for plain in (advise(kind="map-style", workers=0, item_ns=1.2e6, usable_cores=2.0, torch_threads=1),
                  advise(kind="map-style", workers=0, item_ns=1.2e6, usable_cores=2.0)):
        assert "set_num_threads" not in plain.recommendation
        assert plain.saving.low_ms_per_step == pytest.approx(100 - 60 * 1.3, abs=0.01)
    # Where the workers' CPU work fills both cores, a script on one thread is told to keep it.
    already = advise(kind="map-style", workers=0, item_ns=1.8e6, usable_cores=2.0, share=0.6, torch_threads=1)
    assert already.metrics["advice"].startswith("num_workers=")
    assert "already keeps the main process's operators to 1 thread" in already.recommendation
    assert "set_num_threads(1)" not in already.recommendation.replace("(torch.set_num_threads)", "")


def test_per_item_work_with_free_cores_gets_workers_and_names_the_function():
    finding = advise(kind="map-style", workers=0, item_ns=1.5e6)
    assert finding.metrics["advice"] == "num_workers=1"  # 40 ms of loading hides under 60 ms of compute
    # the cores the job may use: the main process idles while it waits for a batch
    assert "tokenize (train.py)" in finding.recommendation and "the job may use 4.0 cores" in finding.recommendation
    saving = finding.saving
    # one worker hides the 40 ms under the other 60 ms, which run 5% slower beside it: the
    # step replayed without the loading
    assert saving.ms_per_step == pytest.approx(100 - 60 * 1.05, abs=0.01)
    assert saving.low_ms_per_step == pytest.approx(100 - 60 * 1.3, abs=0.01)
    assert saving.high_ms_per_step == pytest.approx(40, abs=0.01)
    assert "the host's other work" in saving.remains


def test_loading_that_mostly_waits_gets_more_workers_than_cores():
    # 40 ms per batch of which 5% is CPU work (reading files): the cores do not bound the workers
    finding = advise(kind="map-style", workers=0, item_ns=1.5e6, usable_cores=2.0, share=0.9, cpu_share=0.05)
    workers = int(finding.metrics["advice"].partition("=")[2])
    assert workers > 2 and "Only 5.0% of making a batch is CPU work" in finding.message


def test_cpu_bound_loading_is_held_to_the_cores():
    # 90 ms of CPU work per batch and 10 ms of compute on 2 usable cores: more workers
    # than the cores only share them; the step cannot beat (10 + 90) / 2 ms
    finding = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9)
    assert finding.metrics["other_advice"].startswith("num_workers=")
    assert int(finding.metrics["other_advice"].partition("=")[2]) <= 2
    assert finding.metrics["other_ms_per_step"] <= 100 - (10 + 90) * 1.05 / 2 + 1e-6


def test_cpu_bound_loading_on_two_cores_leads_with_cheaper_work_and_sizes_the_workers_beside_it():
    # 90 ms of CPU work per batch (32 items of 2.8 ms), 10 ms of compute, the job's affinity
    # two cores. One worker would only move the 90 ms off the main process (a 10 ms saving);
    # two share it (the step bound by the two cores, about 50 ms). Made once before
    # training, the items' 89.6 ms go: that leads, the workers' figure beside it.
    finding = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9)
    assert finding.metrics["job_cores"] == pytest.approx(2.0)
    assert finding.metrics["advice"] == "cheaper per-item work"
    assert finding.saving.ms_per_step == pytest.approx(32 * 2.8, abs=0.01)
    assert finding.recommendation.startswith("Make the per-item work cheaper: 80.0% of loading is in tokenize")
    assert finding.metrics["other_advice"] == "num_workers=2" and finding.metrics["other_ms_per_step"] > 40
    workers = f"Worker processes would save less here, {finding.metrics['other_ms_per_step']:.1f} ms a step"
    assert workers in finding.recommendation
    # the workers fill the cores: beside them the main process's torch threads must leave them be
    assert "DataLoader(num_workers=2, persistent_workers=True) and torch.set_num_threads(1)" in finding.recommendation
    # a pass over the dataset's items before training is the price, where its length is known
    assert "costs a pass over the dataset" not in finding.recommendation
    sized = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9, length=5000)
    assert "costs a pass over the dataset before training (5000 items at 2.80 ms: 14.0 s)" in sized.recommendation
    # nothing of the advice's choice changes the workers' own settings for `advisor verify`
    assert "fix_num_workers" not in finding.metrics


def test_workers_lead_where_making_the_items_cheaper_would_not_save_clearly_more():
    # 4 cores: one worker hides the 40 ms read under the other 60 ms (37 ms saved); made
    # cheaper, the per-item work would save 40 ms, not clearly more: the workers lead, and
    # the other fix's figure is said.
    finding = advise(kind="map-style", workers=0, item_ns=1.5e6)
    assert finding.metrics["advice"] == "num_workers=1" and finding.metrics["fix_num_workers"] == 1
    assert finding.metrics["other_advice"] == "cheaper per-item work"
    assert finding.metrics["other_ms_per_step"] == pytest.approx(40, abs=0.01)
    assert "made cheaper instead of moved to workers (precomputed once before training), it would save 40.0 ms a step" \
        in finding.recommendation
    # Loading that mostly waits (files, the network) is not CPU work to make cheaper.
    waiting = advise(kind="map-style", workers=0, item_ns=1.5e6, cpu_share=0.05)
    assert "other_advice" not in waiting.metrics and "made cheaper instead" not in waiting.recommendation


def test_the_cores_are_the_job_s_whatever_other_processes_do_meanwhile():
    """A busy machine changes nothing: the advice is sized from the cores the job may use
    (its affinity and quota), not from what other processes used while it was profiled."""
    quiet = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9)
    busy = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9, cpu_share=0.3,
                  runnable_share=0.65)
    assert quiet.metrics["other_advice"] == "num_workers=2"
    # Descheduled CPU work is not waiting: it is said so, and it still gets the same advice:
    # CPU work made cheaper, the workers held to the cores beside it.
    assert busy.metrics["advice"] == quiet.metrics["advice"] == "cheaper per-item work"
    assert busy.metrics["other_advice"] == "num_workers=2"
    assert "waited for one" in busy.message and "the rest is waiting" not in busy.message


def test_workers_that_leave_cores_free_get_no_thread_advice():
    finding = advise(kind="map-style", workers=0, item_ns=1.5e6)
    assert "set_num_threads" not in finding.recommendation and "fix_torch_threads" not in finding.metrics


def test_the_gpu_s_own_work_bounds_the_saving():
    # 40 ms of loading a step and 90 ms of GPU work queued back to back: with the loading
    # overlapped the step cannot get shorter than the GPU's 90 ms.
    finding = advise(kind="map-style", workers=0, item_ns=1.5e6, gpu_busy_ms=90.0)
    assert finding.saving.ms_per_step == pytest.approx(10, abs=0.5)
    assert any(e.table == "step_gpu" for e in finding.evidence) or finding.saving.ms_per_step < 11


def test_per_item_work_without_a_free_core_gets_cheaper_work():
    finding = advise(kind="map-style", workers=0, item_ns=1.5e6, usable_cores=1.0)
    assert finding.metrics["advice"] == "cheaper per-item work"
    assert "compete with training" in finding.recommendation and "num_workers=" not in finding.recommendation


def test_workers_that_cannot_keep_up_are_said_so():
    finding = advise(kind="map-style", workers=2, item_ns=1.5e6, usable_cores=4.0)
    assert "cannot keep up" in finding.recommendation and "raise num_workers from 2 to 3" in finding.recommendation
    assert finding.saving.low_ms_per_step <= finding.saving.ms_per_step <= finding.saving.high_ms_per_step


def test_workers_with_no_core_left_get_cheaper_work():
    finding = advise(kind="map-style", workers=2, item_ns=1.5e6, usable_cores=2.0)
    assert "no CPU core is left for more workers" in finding.recommendation
    # The two workers, busy 97 % of their time, and the main process's thread shared the two
    # cores: the rest of the step ran (2 x 0.97 + 1) / 2 = 1.47 times slower, and 5 % more
    # beside the workers (30 % at worst). Made cheap, the batches leave it the cores: the 40 ms
    # wait goes and the 60 ms of the rest run that much faster; at worst half the wait goes.
    assert finding.metrics["main_slowed_by_workers"] == pytest.approx(1.47)
    assert finding.saving.ms_per_step == pytest.approx(40 + 60 * (1 - 1 / (1.47 * 1.05)), abs=0.01)
    assert finding.saving.low_ms_per_step == pytest.approx(20, abs=0.01)
    assert finding.saving.high_ms_per_step == pytest.approx(40 + 60 * (1 - 1 / (1.47 * 1.3)), abs=0.01)
    assert "on the cores the workers no longer take" in finding.saving.remains
    # On torch's default two threads, the main process had a fairer share still to lose.
    threads = advise(kind="map-style", workers=2, item_ns=1.5e6, usable_cores=2.0, torch_threads=2)
    assert threads.saving.ms_per_step == pytest.approx(40 + 60 * (1 - 1 / (1.97 * 1.05)), abs=0.01)
    # The script did not keep its workers between epochs: it is asked to, not told to keep it.
    assert "Set persistent_workers=True too" in finding.recommendation and "Keep persistent" not in \
        finding.recommendation
    kept = advise(kind="map-style", workers=2, item_ns=1.5e6, usable_cores=2.0, persistent=True)
    assert "Keep persistent_workers=True" in kept.recommendation


def test_a_trace_s_loader_gets_the_advice_for_both_cases():
    from advisor.step import build_step_model

    spec = next(s for s in builtin_specs() if s.id == "dataloader-starvation")
    model = pd.DataFrame({"cpu_ratio": [0.4], "cpu_avg_ns": [40e6]}, index=["Dataloader"])
    ctx = RuleContext(tables={"model": model}, spec=spec, step_count=6, mean_step_ns=100e6, window_ns=600_000_000,
                      gpu_measured=True, model=build_step_model(loader_session(share=0.4, gpu_busy_ms=10.0)))
    (finding,) = engine.checks()["dataloader-starvation"](ctx)
    assert "in-memory tensors" in finding.recommendation and "does not show which" in finding.recommendation
    # the GPU measured idles while the loader runs; a CPU run has none to idle
    assert "the GPU sits idle for that time unless work is still queued on it." in finding.message
    cpu = advise(kind="map-style", workers=0, item_ns=1.5e6)
    assert cpu.message.split("); ", 1)[1].startswith("nothing else runs in the loop meanwhile. ")
    assert "GPU" not in cpu.message
    assert "1.50 ms per item, 32 items and 100 us of collation per batch" in cpu.message


def test_the_pass_that_makes_the_items_once_is_costed_at_the_job_s_own_pace():
    # The loader's reads, the recorded steps' among them, took 1.5 times the loading of the
    # steps run without the profiler: the pass over the dataset is costed at the latter.
    ctx = loader_context(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9, length=5000)
    (plain,) = engine.checks()["dataloader-starvation"](ctx)
    assert "(5000 items at 2.80 ms: 14.0 s)" in plain.recommendation
    ctx.tables["dataloaders"]["read_avg_ns"] *= 1.5
    (finding,) = engine.checks()["dataloader-starvation"](ctx)
    assert "(5000 items at 1.87 ms: 9.33 s)" in finding.recommendation


def test_a_batch_size_said_as_the_loader_s_not_as_a_mean_cut_by_the_short_last_batch():
    ctx = loader_context(kind="map-style", workers=0, item_ns=1.5e6)
    ctx.tables["dataloaders"]["items_per_batch"] = 31.4  # 32 a batch, each epoch's last one shorter
    (finding,) = engine.checks()["dataloader-starvation"](ctx)
    assert "32 items (31.4 on average, with each epoch's shorter last batch) and" in finding.message
    # a mean far below the batch size is not a short last batch: said as measured
    ctx.tables["dataloaders"]["items_per_batch"] = 12.0
    (finding,) = engine.checks()["dataloader-starvation"](ctx)
    assert "per item, 12 items and" in finding.message


def hotspots(other_ns: dict[str, float]) -> pd.DataFrame:
    rows = {}
    for i, (function, ns) in enumerate(other_ns.items()):
        rows[f"{function} (t.py:{10 + i})"] = {"role": "main", "function": function, "file": "t.py", "line": 10 + i,
                                               "other_ns": ns, "waiting_share": 0.0,
                                               "stack": f"main (t.py:1) > {function} (t.py:{10 + i})"}
    return pd.DataFrame.from_dict(rows, orient="index")


def host_bound(table: pd.DataFrame) -> list[Finding]:
    spec = next(s for s in builtin_specs() if s.id == "host-bound")
    ctx = RuleContext(tables={"python_hotspots": table}, spec=spec, step_count=10, mean_step_ns=20e6,
                      window_ns=200_000_000, gpu_measured=False)
    return engine.checks()["host-bound"](ctx)


def test_host_bound_names_the_functions_that_take_the_step():
    (finding,) = host_bound(hotspots({"augment": 9e6, "log": 0.2e6}))
    assert finding.severity is Severity.high  # 46% of the step
    assert "augment (t.py, line 10)" in finding.message and "log" not in finding.message  # under 2% is not named
    assert finding.saving.ms_per_step == pytest.approx(9.0)
    assert any(e.kind == "source_line" and e.line == 10 for e in finding.evidence)


def test_host_bound_s_evidence_says_which_figure_is_a_line_s_and_which_its_function_s():
    """The function's figure (all its lines) beside its busiest line's row: each says which
    it is, so 18.1 ms beside 19.0 ms reads as a part and its whole."""
    table = hotspots({"main": 7e6, "augment": 9e6})
    table.loc["main (t.py:30)"] = {"role": "main", "function": "main", "file": "t.py", "line": 30, "other_ns": 2e6,
                                   "waiting_share": 0.0, "stack": "main (t.py:30)"}
    (finding,) = host_bound(table)
    row = next(e for e in finding.evidence if e.kind == "table_row" and e.row == "main (t.py:10)")
    assert row.note.startswith("line 10 alone, per step, outside every phase; reached by ")
    line = next(e for e in finding.evidence if e.kind == "source_line" and e.function == "main")
    assert line.note == "9.00 ms per step of host Python outside the model in main, lines 10, 30"


def test_host_bound_leaves_out_the_time_the_phases_own_calls_spend_outside_their_marks():
    # loss.backward()'s and optimizer.step()'s lines, sampled in autograd's and the
    # optimizer's Python before their phases' marks: the phases' own work, not the script's
    table = hotspots({"augment": 9e6, "main": 2e6, "train": 1.5e6})
    table["calls"] = ["", "torch._tensor.backward", "torch.optim.optimizer.wrapper"]
    (finding,) = host_bound(table)
    assert finding.saving.ms_per_step == pytest.approx(9.0)
    assert "main (t.py" not in finding.message and "train (t.py" not in finding.message
    # the same lines calling anything else are the script's own work, and counted
    table["calls"] = ["", "torch.nn.Module.__call__", ""]
    (counted,) = host_bound(table)
    assert counted.saving.ms_per_step == pytest.approx(12.5)


def test_host_bound_counts_backward_s_nodes_of_the_outside_work_only_where_they_are_a_share_of_the_step():
    # a loss looped over the batch: 64 nodes a step, one forward pass
    nodes = pd.DataFrame({"calls_per_step": [64.0], "ns_per_step": [50e3], "outside_calls_per_step": [64.0],
                          "outside_share": [1.0]}, index=["MseLossBackward0"])
    spec = next(s for s in builtin_specs() if s.id == "host-bound")

    def with_backward(phase_ns: float) -> Finding:
        timing = pd.DataFrame({"best_avg_ns": [phase_ns]}, index=["Backward"])
        ctx = RuleContext(tables={"python_hotspots": hotspots({"augment": 9e6}), "autograd_nodes": nodes,
                                  "step_timing": timing}, spec=spec, step_count=10, mean_step_ns=20e6,
                          window_ns=200_000_000, gpu_measured=False)
        (finding,) = engine.checks()["host-bound"](ctx)
        return finding

    # the loss's one node, 0.1 ms of a 20 ms step: not the named work's, not said
    small = with_backward(0.1e6)
    assert "autograd nodes" not in small.message and "backward_ns_per_step" not in small.metrics
    # 4 ms of backward a step of nodes the outside work made: said and counted
    large = with_backward(4e6)
    assert "Its operators also leave autograd nodes that loss.backward() runs: 4.00 ms" in large.message
    assert "64 MseLossBackward0 a step" in large.message
    # the loss called once a pass on the model's output: the step's ordinary work however
    # long its backward takes (a DDP job's NllLossBackward0 and LogSoftmaxBackward0, 0.25 ms
    # of 11 ms, were listed as work to vectorise)
    nodes.loc["MseLossBackward0", ["calls_per_step", "outside_calls_per_step"]] = 1.0
    once = with_backward(4e6)
    assert "autograd nodes" not in once.message and "backward_ns_per_step" not in once.metrics
    # twice a pass where the model runs forward twice a step (two micro-batches): still the loss's
    nodes.loc["MseLossBackward0", ["calls_per_step", "outside_calls_per_step"]] = 2.0
    timing = pd.DataFrame({"best_avg_ns": [4e6]}, index=["Backward"])
    model = pd.DataFrame({"calls": [20]}, index=["Forward"])
    ctx = RuleContext(tables={"python_hotspots": hotspots({"augment": 9e6}), "autograd_nodes": nodes,
                              "step_timing": timing, "model": model}, spec=spec, step_count=10, mean_step_ns=20e6,
                      window_ns=200_000_000, gpu_measured=False)
    (twice,) = engine.checks()["host-bound"](ctx)
    assert "backward_ns_per_step" not in twice.metrics


def test_host_bound_stays_quiet_below_its_share():
    assert host_bound(hotspots({"augment": 1e6})) == []  # 5% of the step


def test_the_profile_s_gaps_lead_whatever_the_others_save():
    gap = Finding(rule="profile-incomplete", title="t", severity=Severity.high, confidence=1.0,
                  saving=Saving(ms_per_step=0.0, share_of_step=0.0, basis="none: n/a"), message="m",
                  recommendation="r")
    big = Finding(rule="host-bound", title="t", severity=Severity.high, confidence=0.7,
                  saving=Saving(ms_per_step=50.0, share_of_step=0.5), message="m", recommendation="r")
    ranked = engine.rank([big, gap], engine.cause_graph(builtin_specs()), frozenset({"profile-incomplete"}))
    assert [f.rule for f in ranked] == ["profile-incomplete", "host-bound"]


def test_spawned_processes_are_named_as_missed(tmp_path):
    script = write(tmp_path, "spawner.py", """
        import multiprocessing as mp
        import torch

        def work(n):
            return sum(range(n))

        if __name__ == "__main__":
            context = mp.get_context("fork")
            children = [context.Process(target=work, args=(1000,)) for _ in range(2)]
            for child in children:
                child.start()
            for child in children:
                child.join()
    """)
    session = collect_script(script, [], gpu=False).session
    gaps = [g for g in session.meta.collector.gaps if g.what == "child processes"]
    assert len(gaps) == 1 and "2 processes started by multiprocessing.Process(target=work)" in gaps[0].why
    assert gaps[0].incomplete


def test_a_cpu_run_s_read_backs_promise_nothing_and_say_where_they_would_cost():
    spec = next(s for s in builtin_specs() if s.id == "sync-memcpy-stall")
    sync = pd.DataFrame({"calls": [256 * 6], "host_total_ns": [6 * 1.3e6], "reason": ["tensor to host"],
                         "source": ["train.py:30 main"], "name": ["int"], "example_event_ids": [[]]},
                        index=["int @ train.py:30"])
    ctx = RuleContext(tables={"host_sync": sync}, spec=spec, step_count=6, mean_step_ns=2.5e6,
                      window_ns=int(15e6), gpu_measured=False)
    (finding,) = engine.checks()["sync-memcpy-stall"](ctx)
    assert finding.saving.ms_per_step == 0 and finding.severity.value == "low"
    assert "on this CPU run they wait for nothing" in finding.message
    # Nothing blocks here: the title does not say the host blocks on a GPU, and the advice
    # is for the GPU run.
    assert finding.title == "Tensors are read back to Python inside the loop (each read would wait on a GPU)"
    # 256 reads a step of one line: once per sample, so the advice batches them.
    assert finding.recommendation.startswith("Before running on a GPU, at train.py:30, a tensor is read back once "
                                             "per sample: decide for the whole batch with tensor ops")
    assert "loss.detach()" not in finding.recommendation
    assert "int (tensor to host) at train.py:30 main: 256 calls a step, 1.30 ms a step" in finding.message
    assert any(e.kind == "source_line" and e.line == 30 for e in finding.evidence)


def test_a_read_back_once_a_step_is_told_to_read_every_n_steps_and_one_per_sample_to_batch():
    """A loss logged with .item() each step reads once a step: read it every N steps. An `if
    torch.rand(1) < 0.5` per sample reads 128 times a step: reading it less often is no
    fix; deciding for the whole batch at once is (a new user applied the first advice to
    the second and the step got 8 ms slower on a CPU)."""
    spec = next(s for s in builtin_specs() if s.id == "sync-memcpy-stall")
    sync = pd.DataFrame({"calls": [6, 128 * 6], "host_total_ns": [6 * 2e5, 6 * 3.6e5],
                         "reason": ["tensor to host", "tensor to host"], "source": ["train.py:40 main", "b.py:18 make"],
                         "name": ["aten::item", "aten::item"], "example_event_ids": [[], []]},
                        index=["aten::item @ train.py:40", "aten::item @ b.py:18"])
    ctx = RuleContext(tables={"host_sync": sync}, spec=spec, step_count=6, mean_step_ns=25e6,
                      window_ns=int(150e6), gpu_measured=True)
    (finding,) = engine.checks()["sync-memcpy-stall"](ctx)
    assert finding.recommendation == (
        "Remove the waits from the loop: at b.py:18, a tensor is read back once per sample: decide for the whole "
        "batch with tensor ops (a mask or torch.where on a batch of values drawn at once) instead of a Python branch "
        "or read per sample; keep values on the device (loss.detach(), accumulate on the GPU) and read them every N "
        "steps instead of calling .item()/.cpu()/.tolist() each step.")


def test_the_workers_fix_replays_from_the_step_at_the_jobs_own_pace_once():
    # Every replay runs the host at the job's own pace (advisor.step.pace scales the recorded
    # Dataloader phase to its unrecorded time); the rule's fix adds no second scaling of its
    # own, so the step it saves from is the graph's paced step. Scaled twice, the step before
    # the fix was shorter than the job's (38.8 against 40.2 ms on cpu_custom_collate) and the
    # saving smaller.
    from advisor.diagnosis import diagnose
    from advisor.importers.loader import load
    from advisor.step.whatif import what_if

    case = Path(__file__).resolve().parents[1] / "cases" / "cpu_tokenize_dataset" / "session"
    done = diagnose(load(case))
    finding = next(f for f in done.result.findings if f.rule == "dataloader-starvation")
    assert finding.metrics["advice"].startswith("num_workers=")
    graph = done.model.graph
    replay = what_if(graph, finding._fix)
    assert replay.before_ns == pytest.approx(graph.baseline)
    assert finding.saving.ms_per_step * 1e6 == pytest.approx(replay.saved_ns, rel=1e-3)


def test_the_call_a_user_line_makes_is_named_past_advisors_own_wrappers():
    from advisor.tables.python_hotspots import library_call

    roots = ("/usr/lib/python3.11/", "/opt/advisor/")  # advisor installed in place (pip install -e)
    user = "/home/me/train.py(40): main;/usr/lib/python3.11/runpy.py(88): _run_code"
    # .tolist() counted by advisor's sync hook: a C method behind advisor's wrapper, no name
    # of advisor's (it was named "syncs.counted"), and none of its own to give.
    assert library_call("/opt/advisor/collect/hooks/syncs.py(170): counted;" + user, roots) == ""
    # A library function behind a hook is named as the user called it.
    assert library_call("/usr/lib/python3.11/site-packages/torch/serialization.py(5): save;"
                        "/opt/advisor/collect/hooks/saves.py(3): wrapped;" + user, roots) == "torch.save"
    assert library_call("/usr/lib/python3.11/site-packages/torch/serialization.py(5): save;" + user,
                        roots) == "torch.save"


def test_a_hot_line_that_deep_copies_gets_the_in_place_update_not_vectorising():
    lib = "/usr/lib/python3/"
    ema = f"{lib}copy.py(128): deepcopy;/home/me/train.py(12): ema;/home/me/train.py(40): main;{lib}runpy.py(88): _run_code"
    loop = f"{lib}torch/nn/functional.py(5): linear;/home/me/train.py(44): main;{lib}runpy.py(88): _run_code"
    rows, t = [], 1_000_000
    for step in range(4):
        rows += [stack_row(t + i, 1_000_000, ema, step, "") for i in range(12)]
        rows += [stack_row(t + 20 + i, 1_000_000, loop, step, "Forward") for i in range(8)]
        t += 20_000_000
    timed = [TimedStep(step=s, start_ns=s * 20_000_000, duration_ns=20_000_000, recorded=s < 2,
                       phases={"Forward": 8_000_000}) for s in range(4)]
    session = sampled_session(rows, timed, [lib])
    tables = compute_tables(session)
    hot = tables["python_hotspots"].set_index("function")
    assert hot.at["ema", "calls"] == "copy.deepcopy" and hot.at["main", "calls"] == "torch.nn.functional.linear"
    finding = next(f for f in run_rules(session, tables).findings if f.rule == "host-bound")
    assert finding.recommendation.startswith("copy.deepcopy at ema (train.py:12)")
    assert "torch._foreach_lerp_" in finding.recommendation and finding.metrics["calls"] == ["copy.deepcopy"]


# -- items augmented at random cannot be made once ------------------------------------------------


RANDOM_ITEMS = """
    import random, sys
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Items(Dataset):
        def __init__(self, how):
            self.how = how
        def __len__(self):
            return 320  # 40 batches: the first 32 checked
        def __getitem__(self, i):
            x = torch.arange(8, dtype=torch.float32) + i
            if self.how == "torch":
                x = x + torch.rand(8)
            elif self.how == "python":
                x = x * random.random()
            elif self.how == "numpy":
                x = x + float(np.random.rand())
            return x

    torch.manual_seed(0); random.seed(0); np.random.seed(0)
    for x in DataLoader(Items(sys.argv[1]), batch_size=8):
        pass
    # what the job draws next: advisor only reads the generators' states
    print("next", torch.rand(1).item(), random.random(), float(np.random.rand()))
"""


@pytest.mark.parametrize("how", ["torch", "python", "numpy", "none"])
def test_batches_that_draw_random_numbers_are_told_apart_and_the_job_draws_its_own_numbers(tmp_path, capfd, how):
    script = write(tmp_path, "items.py", RANDOM_ITEMS)
    run = collect_script(script, [how], gpu=False)
    under_advisor = [line for line in capfd.readouterr().out.splitlines() if line.startswith("next ")]
    (loader,) = compute_tables(run.session, ["dataloaders"])["dataloaders"].itertuples()
    assert loader.random_share == (0.0 if how == "none" else 1.0)
    (entry,) = run.session.meta.trace_metadata["advisor"]["loaders"]
    assert (entry["fetches"], entry["random_checked"]) == (40, 32), "the generators are read for the first 32 only"
    plain = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, check=True)
    assert under_advisor == [plain.stdout.strip().splitlines()[-1]]


def test_items_augmented_at_random_are_not_told_to_be_made_once():
    # On two cores the items made once would lead (see above); drawn at random every time,
    # they cannot be where their busiest function is __getitem__ itself, where the draws are
    # made: the workers lead, and no figure is given for making them once.
    finding = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9, random_share=1.0,
                     top="__getitem__ (train.py)")
    assert finding.metrics["advice"] == "num_workers=2" and "other_advice" not in finding.metrics
    assert "precomputed once" not in finding.recommendation and "made once" not in finding.recommendation
    # Where workers do not pay either, the per-item work is to be made cheaper, not made once.
    cheaper = advise(kind="map-style", workers=0, item_ns=1.5e6, usable_cores=1.0, random_share=1.0,
                     top="__getitem__ (train.py)")
    assert cheaper.metrics["advice"] == "cheaper per-item work"
    assert "it draws random numbers for every item, so it cannot be made once" in cheaper.recommendation
    assert "precompute" not in cheaper.recommendation and "costs a pass over the dataset" not in \
        cheaper.recommendation


def test_a_function_of_its_own_in_items_augmented_at_random_is_told_to_be_made_once():
    # A decode of its own takes 80 % of loading; the items are flipped at random in
    # __getitem__. The decode's results can be made once, the flip kept per item: on two
    # cores that saves clearly more than the workers, and leads.
    finding = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9, random_share=1.0,
                     top="decode (train.py)", length=5000)
    assert finding.metrics["advice"] == "cheaper per-item work" and finding.metrics["made_once_function"] == "decode"
    # the decode's share of the loading goes: 80 % of 90 ms
    assert finding.saving.ms_per_step == pytest.approx(0.8 * 90, abs=0.01)
    assert finding.saving.low_ms_per_step == pytest.approx(0.4 * 90, abs=0.01)
    assert "make decode's results once before training, or cache them, where they do not depend on those draws, " \
           "and keep the random part per item" in finding.recommendation
    assert "Use the workers where decode's results depend on the random draws." in finding.recommendation
    assert finding.metrics["other_advice"] == "num_workers=2"
    # its pass over the dataset: 72 ms a batch of 32 items, 2.25 ms an item
    assert "Making decode's results for every item once costs a pass over the dataset before training (5000 items " \
           "at 2.25 ms: 11.2 s)" in finding.recommendation
    # On many cores the workers lead, the decode made once said beside them.
    roomy = advise(kind="map-style", workers=0, item_ns=1.5e6, usable_cores=8.0, random_share=1.0,
                   top="decode (train.py)")
    assert roomy.metrics["advice"] == "num_workers=1" and roomy.metrics["other_advice"] == "cheaper per-item work"
    assert "with decode's results made once before training (the random part kept per item), it would save" in \
        roomy.recommendation


def test_a_collate_function_of_its_own_beside_items_drawn_at_random_is_not_told_to_be_made_once():
    # The busiest function is the script's collate, which combines the items drawn at
    # random: its results change with them, so making them once is no fix; the workers lead.
    finding = advise(kind="map-style", workers=0, item_ns=2.8e6, usable_cores=2.0, share=0.9, random_share=1.0,
                     collate_fn="pad_batch", collate_ns=20e6, top="pad_batch (train.py)")
    assert finding.metrics["advice"] == "num_workers=2" and "made_once_function" not in finding.metrics
    assert "made once" not in finding.recommendation


def test_workers_that_keep_up_but_crowd_the_cores_of_a_cpu_run_are_a_finding():
    # Two workers busy 97 % of their time and torch's two operator threads on two cores: the
    # wait for batches is 5 % of the step, under the rule's share, but the rest of the step
    # ran (2 x 0.97 + 2) / 2 = 1.97 times as long. Made cheap, the batches give it the cores.
    finding = advise(kind="map-style", workers=2, item_ns=1.5e6, usable_cores=2.0, share=0.05, torch_threads=2)
    assert finding.metrics["workers_keep_up"] and finding.metrics["main_slowed_by_workers"] == pytest.approx(1.97)
    assert "keep up, busy 97.0% of their time, but they share the job's 2.0 cores" in finding.message
    assert finding.recommendation.startswith("The 2 worker processes crowd the cores")
    assert finding.saving.ms_per_step == pytest.approx(5 + 95 * (1 - 1 / (1.97 * 1.05)), abs=0.01)
    assert any(e.table == "dataloaders" and e.column == "workers_busy" for e in finding.evidence)
    # On one operator thread the crowding is under the threshold (1.47), and a short wait is no finding.
    assert not engine.checks()["dataloader-starvation"](loader_context(
        kind="map-style", workers=2, item_ns=1.5e6, usable_cores=2.0, share=0.05, torch_threads=1))
    # On a GPU run the model's operators are the GPU's: the cores they share say nothing.
    assert not engine.checks()["dataloader-starvation"](loader_context(
        kind="map-style", workers=2, item_ns=1.5e6, usable_cores=2.0, share=0.05, torch_threads=2,
        gpu_busy_ms=10.0))
