"""The profiler API's documentation runs as written.

- Every ```python block of docs/profiler_api.md runs, in a fresh folder (its assertions are
  part of the test), and what a block says it prints, it prints.
- Each examples/profiler_api_*.py script runs with small sizes (in a subprocess, one at a
  time: side by side they took each other's cores and the loader's share with them) and
  prints what its docstring promises; the Paddle DataLoader case finds the
  starving loader with num_workers=0 and less of it with workers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "profiler_api.md"
EXAMPLES = REPO / "examples"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_the_page_has_examples_of_every_part_of_the_api():
    text = "\n".join(python_blocks())
    for name in ("advisor.Profiler(", "scheduler=", "make_scheduler(", "on_trace_ready=", "timer_only=True",
                 "step_info(", "summary(", "diagnose(", "RecordEvent(", "region(", "save_session(",
                 "export_timeline(", "num_samples=", "prof.start()", "prof.stop()"):
        assert name in text, name


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_doc_block_runs(index, tmp_path, monkeypatch, capsys):
    block = python_blocks()[index]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"{DOC.name} block {index}", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    if "timer_only=True" in block and "DataLoader(SlowReads()" in block:
        # The page shows this block's output: the line's shape and the finding.
        assert re.search(r"^reader_cost: \d\.\d{5} s batch_cost: \d\.\d{5} s ips: \d+\.\d{3} images/s$", out, re.M)
        assert "['dataloader-starvation']" in out
        assert "Perf Summary (timer_only)" in out


RUNS = {
    # A 2 ms read a sample (the script's default is 0.5 ms): the loader then outweighs the
    # model's CPU work by enough that the share stays high when a busy machine slows the
    # model (and not the sleeps) down.
    "profiler_api_dataloader": ["--steps", "14", "--record", "3", "8", "--read-ms", "2",
                                "--workers", "0", "--workers", "2"],
    "profiler_api_schedules": ["--steps", "13"],
    "profiler_api_timer": ["--steps", "12", "--log-every", "6"],
}


# Only against a run that hangs: a script here takes seconds, and a slow machine must never
# be what fails it.
HANG_GUARD_S = 1800


@pytest.fixture(scope="module")
def spans_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("spans")


@pytest.fixture(scope="module")
def example_runs(spans_dir):
    """``example_runs(name)``: (exit code, stdout, stderr) of examples/``name``.py run with
    RUNS' arguments, on its own, the first time a test asks for it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done: dict[str, tuple[int, str, str]] = {}

    def run(name: str) -> tuple[int, str, str]:
        if name not in done:
            extra = ["--out", str(spans_dir)] if name == "profiler_api_schedules" else []
            process = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *RUNS[name], *extra],
                                     capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
            done[name] = (process.returncode, process.stdout, process.stderr)
        return done[name]

    return run


def test_the_paddle_dataloader_case(example_runs):
    code, out, err = example_runs("profiler_api_dataloader")
    assert code == 0, err
    assert out.count("profiled steps 3-7:") == 2
    before, after = out.split("=== num_workers=2 ===")
    assert "[dataloader-starvation]" in before and "HIGH" in before
    shares = re.search(r"Dataloader share \(profiled\)\s+([\d.]+)%\s+([\d.]+)%", out)
    assert shares and float(shares[1]) > float(shares[2]), out
    assert re.search(r"speed-up: [\d.]+x", out)
    assert re.search(r"ips \(timer_only, samples/s\)\s+[\d.]+\s+[\d.]+", out)


def test_the_schedules_example(example_runs, spans_dir):
    code, out, err = example_runs("profiler_api_schedules")
    assert code == 0, err
    # One augment and one loss range a step, counted over the span's steady steps: all three,
    # or two where the span's first step ran far slower than the others and was set apart.
    for span, steps in ((0, "[3, 4, 5]"), (1, "[9, 10, 11]")):
        found = re.search(rf"span {span}: steps {re.escape(steps)}, (\d) steady, user ranges "
                          r"\{'augment': (\d), 'loss': (\d)\}", out)
        assert found, out
        steady, augment, loss = (int(g) for g in found.groups())
        assert steady in (2, 3) and augment == loss == steady, found[0]
    assert sorted(p.name for p in (spans_dir / "sessions").iterdir()) == ["schedules_0", "schedules_1"]
    assert sorted(p.name for p in (spans_dir / "timelines").iterdir()) == [
        "schedules_span0.pt.trace.json", "schedules_span1.pt.trace.json"]


def test_the_timer_example(example_runs):
    code, out, err = example_runs("profiler_api_timer")
    assert code == 0, err
    assert len(re.findall(r"^step (6|12): loss \d\.\d{3} reader_cost: .* images/s$", out, re.M)) == 2
    assert "Perf Summary (timer_only)" in out and out.rstrip().splitlines()[-1].startswith("findings: ")
