"""The host collector: steps and phases found in a script without changing it, as
user_annotation ranges in the exported Chrome trace, balanced and nested; hooks removed
after the run; the example scripts run plainly and under the collector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import pytest

from advisor.collect import run_script, torch_hooks
from advisor.collect.hooks import base as hooks_base
from advisor.collect.hooks import collection, syncs
from advisor.collect.hooks.compiles import COMPILE_RANGE_PREFIX
from advisor.importers.advisor_metadata import read_trace_metadata

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
EPS_US = 0.002  # the trace prints microseconds with 3 decimals

DATALOADER, FORWARD, BACKWARD, OPTIMIZATION = collection.PHASE_NAMES


# -- reading the trace -------------------------------------------------------------------


class Trace:
    def __init__(self, path: Path):
        self.document = json.loads(path.read_text())
        self.meta = read_trace_metadata(self.document)
        events = [e for e in self.document["traceEvents"] if e.get("ph") == "X"]
        self.annotations = sorted(
            (e for e in events if e.get("cat") == "user_annotation"), key=lambda e: (e["ts"], -e["dur"])
        )
        self.steps = [e for e in self.annotations if e["name"].startswith("ProfilerStep#")]
        # A compilation's range (advisor::compile) marks time inside a phase, not a phase.
        self.phases = [e for e in self.annotations
                       if e["name"].startswith("advisor::") and not e["name"].startswith(collection.SYNC_RANGE_PREFIX)
                       and not e["name"].startswith(COMPILE_RANGE_PREFIX)]
        self.compiles = [e for e in self.annotations if e["name"].startswith(COMPILE_RANGE_PREFIX)]
        self.sync_ranges = [e for e in self.annotations if e["name"].startswith(collection.SYNC_RANGE_PREFIX)]
        self.events = events

    def ours(self) -> list[dict]:
        return self.steps + self.phases

    def phases_in(self, step: dict) -> Counter:
        return Counter(p["name"] for p in self.phases if inside(p, step))

    def outside_steps(self) -> Counter:
        return Counter(p["name"] for p in self.phases if not any(inside(p, s) for s in self.steps))


def end(e: dict) -> float:
    return e["ts"] + e["dur"]


def inside(inner: dict, outer: dict) -> bool:
    return inner["ts"] >= outer["ts"] - EPS_US and end(inner) <= end(outer) + EPS_US


def disjoint(a: dict, b: dict) -> bool:
    return end(a) <= b["ts"] + EPS_US or end(b) <= a["ts"] + EPS_US


def assert_well_formed(trace: Trace, *, torch_ranges_too: bool = True) -> None:
    """Steps in order and apart; phases apart (they never nest); every pair of ranges either
    apart or one inside the other, so a stack-based reader nests them right."""
    assert [s["name"] for s in trace.steps] == [f"ProfilerStep#{i}" for i in range(len(trace.steps))]
    ranges = trace.annotations if torch_ranges_too else trace.ours()
    threads = {(e["pid"], e["tid"]) for e in trace.ours()}
    assert len(threads) <= 1, "ranges were recorded off the script's thread"
    for e in ranges:
        assert e["dur"] >= 0
    for group in (trace.steps, trace.phases):
        for a, b in zip(group, group[1:], strict=False):
            assert end(a) <= b["ts"] + EPS_US, (a, b)
    for i, a in enumerate(ranges):
        for b in ranges[i + 1 :]:
            assert disjoint(a, b) or inside(a, b) or inside(b, a), (a["name"], b["name"])


def run(script: Path, args: list[str], tmp_path: Path, **kwargs):
    kwargs.setdefault("steps", None)  # the whole run: these tests follow every step
    result = run_script(script, args, save_trace_to=tmp_path / "trace.json", **kwargs)
    return result, Trace(result.trace_path)


def write_script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


# -- a DataLoader training loop: examples/starved_loader.py ------------------------------

STEPS = 4


@pytest.fixture(scope="module")
def starved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("starved")
    return run(
        EXAMPLES / "starved_loader.py",
        ["--steps", str(STEPS), "--batch-size", "8", "--item-delay-ms", "0.5"],
        folder,
    )


def test_dataloader_steps_and_phases(starved):
    result, trace = starved
    assert result.exit_code == 0
    assert (result.step_source, result.steps, result.partial_steps) == ("dataloader", STEPS, [])
    assert (result.batch_size, result.batch_size_source) == (8, "dataloader")
    assert len(trace.steps) == STEPS
    for step in trace.steps:
        # one batch read; the model and the loss module called at top level; zero_grad and step
        assert trace.phases_in(step) == {DATALOADER: 1, FORWARD: 2, BACKWARD: 1, OPTIMIZATION: 2}
    # the __next__ that finds the loader empty is data-loader time but no step
    assert trace.outside_steps() == {DATALOADER: 1}
    assert_well_formed(trace)


def test_phases_wrap_what_they_name(starved):
    _, trace = starved
    torch_ranges = [e for e in trace.annotations if not e["name"].startswith(("advisor::", "ProfilerStep#"))]
    loader_reads = [e for e in torch_ranges if e["name"].startswith("enumerate(DataLoader)#")]
    optimizer_steps = [e for e in torch_ranges if e["name"].startswith("Optimizer.step#")]
    assert len(loader_reads) == STEPS + 1 and len(optimizer_steps) == STEPS
    phases = {name: [p for p in trace.phases if p["name"] == name] for name in collection.PHASE_NAMES}
    for read in loader_reads:
        assert any(inside(read, p) for p in phases[DATALOADER])
    for opt_step in optimizer_steps:
        assert any(inside(p, opt_step) for p in phases[OPTIMIZATION])
    ops = [e for e in trace.events if e.get("cat") == "cpu_op"]
    ops_in_backward = {e["name"] for e in ops if any(inside(e, p) for p in phases[BACKWARD])}
    assert any(name.startswith("autograd::engine::evaluate_function") for name in ops_in_backward)
    ops_in_forward = {e["name"] for e in ops if any(inside(e, p) for p in phases[FORWARD])}
    assert "aten::linear" in ops_in_forward


def test_trace_metadata(starved):
    result, trace = starved
    meta = trace.meta
    assert meta["collector"] == "advisor-host"
    assert meta["step_source"] == "dataloader" and meta["steps"] == STEPS and meta["partial_steps"] == []
    assert meta["batch_size"] == 8
    assert meta["phases"] == list(collection.PHASE_NAMES)
    # Shapes are recorded; Python stacks are not by default (a sampler finds Python time instead).
    assert trace.document["record_shapes"] == 1 and trace.document.get("with_stack", 0) == 0
    # CPU activities only: the host side never holds CUPTI
    assert not {e.get("cat") for e in trace.events} & {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime"}


def test_the_host_profiler_asks_for_cpu_activities_only():
    collector = torch_hooks.HostCollector(torch)
    assert collector.activities == [torch.profiler.ProfilerActivity.CPU]


def test_hooks_are_removed_after_the_run(tmp_path):
    import torch.nn.modules.module as module_mod
    import torch.optim.optimizer as optim_mod
    import torch.utils.data.dataloader as dataloader_mod

    def snapshot():
        return (
            dataloader_mod._BaseDataLoaderIter.__next__,
            torch.Tensor.backward,
            torch.autograd.backward,
            torch.optim.Optimizer.zero_grad,
            torch.nn.Module.zero_grad,
            torch.cuda.synchronize,
            {name: vars(torch.Tensor).get(name) for name in syncs.HOST_SYNC_METHODS},
            dict(module_mod._global_forward_pre_hooks),
            dict(module_mod._global_forward_hooks),
            dict(optim_mod._global_optimizer_pre_hooks),
            dict(optim_mod._global_optimizer_post_hooks),
            warnings.showwarning,
            # the script's imports may add filters of their own; advisor's must be gone
            [f for f in warnings.filters if f[1] is not None and "global hooks" in f[1].pattern],
        )

    before = snapshot()
    script = write_script(tmp_path, "import torch\nfloat(torch.ones(1))\nraise SystemExit(2)\n")
    result = run_script(script, [], save_trace_to=tmp_path / "t.json", with_stack=False)
    assert result.exit_code == 2
    assert snapshot() == before
    assert hooks_base.ACTIVE is None
    assert not torch.autograd.profiler._is_profiler_enabled


LOADERS = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train = DataLoader(TensorDataset(torch.randn(16, 8)), batch_size=4)   # 4 batches
val = DataLoader(TensorDataset(torch.randn(12, 8)), batch_size=4)     # 3 batches

def evaluate():
    with torch.no_grad():
        for (x,) in val:
            model(x)

LOOP
"""


def test_a_loader_read_inside_a_step_belongs_to_it(tmp_path):
    loop = """
for i, (x,) in enumerate(train):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    if i == 1:
        evaluate()
evaluate()
"""
    script = write_script(tmp_path, LOADERS.replace("LOOP", loop))
    result, trace = run(script, [], tmp_path, with_stack=False)
    # four training steps, then the evaluation after the loop: once train has run out,
    # val's batches are steps of their own
    assert (result.steps, result.partial_steps) == (4 + 3, [])
    per_step = [trace.phases_in(step) for step in trace.steps]
    # step 1 holds the evaluation made inside it: three batches and the read that found
    # val empty
    assert [c[DATALOADER] for c in per_step] == [1, 5, 1, 1, 1, 1, 1]
    assert [c[FORWARD] for c in per_step] == [1, 4, 1, 1, 1, 1, 1]
    # the reads that found train and then val empty
    assert trace.outside_steps() == {DATALOADER: 2}
    assert_well_formed(trace)


def test_a_loop_left_by_break_ends_in_a_partial_step(tmp_path):
    loop = """
for i, (x,) in enumerate(train):
    if i == 2:
        break
    model(x).sum().backward()
evaluate()
"""
    script = write_script(tmp_path, LOADERS.replace("LOOP", loop))
    result, trace = run(script, [], tmp_path, with_stack=False)
    # steps 0 and 1 ran; step 2 read its batch and then the loop was left. The evaluation
    # that followed ends it (as partial) and its own batches are steps 3 to 5.
    assert (result.steps, result.partial_steps) == (6, [2])
    assert trace.phases_in(trace.steps[2]) == {DATALOADER: 1}
    assert_well_formed(trace)


# -- scripts without a DataLoader --------------------------------------------------------

TRAIN_WITHOUT_LOADER = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
WARMUP
for _ in range(5):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
print("trained")
"""


def test_optimizer_steps_without_a_dataloader(tmp_path, capsys):
    script = write_script(tmp_path, TRAIN_WITHOUT_LOADER.replace("WARMUP", ""))
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.exit_code == 0
    assert result.step_source == "optimizer"
    # five iterations, the last one still open when the run ended
    assert result.steps == 5 and result.partial_steps == [4]
    assert (result.batch_size, result.batch_size_source) == (4, "forward")
    # a step ends after its optimizer step, at the next iteration's zero_grad
    for step in trace.steps[1:4]:
        assert trace.phases_in(step) == {OPTIMIZATION: 2, FORWARD: 2, BACKWARD: 1}
    # before the first forward nothing says a training loop has begun
    assert trace.phases_in(trace.steps[0]) == {OPTIMIZATION: 1, FORWARD: 2, BACKWARD: 1}
    assert trace.outside_steps() == {OPTIMIZATION: 1}
    assert_well_formed(trace)


def test_warmup_forwards_before_the_loop_are_partial_steps(tmp_path):
    warmup = "with torch.no_grad():\n    model(x)\n    model(x)\n"
    script = write_script(tmp_path, TRAIN_WITHOUT_LOADER.replace("WARMUP", warmup))
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.step_source == "optimizer"
    assert result.steps == 7 and sorted(result.partial_steps) == [0, 1, 6]
    assert_well_formed(trace)


def test_inference_steps_follow_the_model(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
        postprocess = nn.Softmax(dim=1)
        with torch.no_grad():
            for _ in range(4):
                probabilities = postprocess(model(torch.randn(6, 8)))
        """,
    )
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.step_source == "forward"
    assert result.steps == 4 and result.partial_steps == [3]
    assert (result.batch_size, result.batch_size_source) == (6, "forward")
    for step in trace.steps:
        assert trace.phases_in(step) == {FORWARD: 2}
    assert_well_formed(trace)


# -- errors inside phases ----------------------------------------------------------------

ROBUST = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class Flaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = self.inner(x)
        if self.calls == 2:
            raise ValueError("flaky forward")
        if self.calls == 3:
            raise KeyboardInterrupt  # not an Exception: forward hooks do not see it
        return out

model = Flaky()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
def fail_fourth_step(opt, args, kwargs):
    if model.calls == 4:
        raise RuntimeError("step hook")
optimizer.register_step_pre_hook(fail_fourth_step)
loader = DataLoader(TensorDataset(torch.randn(24, 8), torch.randint(0, 2, (24,))), batch_size=4)
for x, y in loader:
    try:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    except (ValueError, KeyboardInterrupt, RuntimeError) as exc:
        print("caught", type(exc).__name__)
"""


def test_errors_caught_by_the_script_leave_ranges_balanced(tmp_path, capsys):
    script = write_script(tmp_path, ROBUST)
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.exit_code == 0, capsys.readouterr().err
    caught = capsys.readouterr().out.split("\n")[:3]
    assert caught == ["caught ValueError", "caught KeyboardInterrupt", "caught RuntimeError"]
    assert result.steps == 6 and result.partial_steps == []
    per_step = [trace.phases_in(step) for step in trace.steps]
    # every batch still gets its read and its forward, though three of them failed
    assert all(c[DATALOADER] == 1 and c[FORWARD] == 1 for c in per_step)
    assert [c[BACKWARD] for c in per_step] == [1, 0, 0, 1, 1, 1]
    # an Optimization range left open by the failed optimizer step (torch runs no post-step
    # hook then) ends by the next batch at the latest; torch's own Optimizer.step# range
    # closed earlier, so only advisor's ranges are checked against each other here
    assert_well_formed(trace, torch_ranges_too=False)


@pytest.mark.parametrize(("error", "code"), [("ValueError('boom')", 1), ("KeyboardInterrupt", 130)])
def test_error_escaping_the_script_mid_step(tmp_path, capsys, error, code):
    script = write_script(
        tmp_path,
        f"""
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        class Breaks(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = nn.Linear(8, 2)
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                out = self.inner(x)
                if self.calls == 3:
                    raise {error}
                return out

        model = Breaks()
        loader = DataLoader(TensorDataset(torch.randn(24, 8)), batch_size=4)
        for (x,) in loader:
            model(x).sum().backward()
        """,
    )
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.exit_code == code
    assert result.steps == 3 and result.partial_steps == [2]
    assert trace.phases_in(trace.steps[2]) == {DATALOADER: 1, FORWARD: 1}
    assert trace.meta["partial_steps"] == [2]
    assert_well_formed(trace)


# -- host-blocking calls -----------------------------------------------------------------


def test_host_sync_lines_of_the_example(tmp_path):
    result, trace = run(EXAMPLES / "host_sync.py", ["--steps", "3", "--batch-size", "4"], tmp_path, with_stack=False)
    assert result.exit_code == 0 and result.steps == 3
    source = (EXAMPLES / "host_sync.py").read_text().splitlines()
    item_line = next(i for i, text in enumerate(source, 1) if "running_loss += loss.item()" in text)
    cpu_line = next(i for i, text in enumerate(source, 1) if "argmax(dim=1).cpu()" in text)
    sites = {(s["call"], s["line"]): s for s in result.host_syncs}
    item = sites[("item", item_line)]
    assert item["calls"] == 3 and item["steps"] == 3 and item["function"] == "main"
    assert item["file"].endswith("host_sync.py") and "loss.item()" in item["code"]
    assert sites[("copy to host", cpu_line)]["calls"] == 3
    assert trace.meta["host_syncs"] == result.host_syncs
    # .to(device) of a CPU tensor is the host-to-device idiom, not a read-back
    assert not any("batch_images.to(device)" in s["code"] for s in result.host_syncs)


def test_host_syncs_inside_torch_are_not_the_users_lines(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        t = torch.ones(3)
        if t.sum() > 0:
            print(f"{t.sum():.1f}", float(t[0]))
        """,
    )
    # steps=None records the whole run: the calls are counted while something records
    result = run_script(script, [], save_trace_to=tmp_path / "t.json", with_stack=False, steps=None)
    calls = sorted((s["call"], s["line"]) for s in result.host_syncs)
    # __format__ calls item() inside torch: counted once, as the user's format call
    assert calls == [("bool", 4), ("float", 5), ("format", 5)]


# -- the examples ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["clean_train", "host_sync"])
def test_examples_under_the_collector(tmp_path, name):
    result, trace = run(EXAMPLES / f"{name}.py", ["--steps", "3"], tmp_path, with_stack=False)
    assert result.exit_code == 0
    assert (result.step_source, result.steps, result.partial_steps) == ("dataloader", 3, [])
    for step in trace.steps:
        counts = trace.phases_in(step)
        assert counts[DATALOADER] == 1 and counts[BACKWARD] == 1 and counts[OPTIMIZATION] == 2
    assert_well_formed(trace)


def test_dataloader_workers(tmp_path):
    """Forked workers inherit the hooks; only the script's own process and thread mark."""
    args = ["--steps", "3", "--batch-size", "4", "--item-delay-ms", "0", "--num-workers", "2"]
    result, trace = run(EXAMPLES / "starved_loader.py", args, tmp_path, with_stack=False)
    assert result.exit_code == 0
    assert (result.step_source, result.steps, result.partial_steps, result.batch_size) == ("dataloader", 3, [], 4)
    for step in trace.steps:
        assert trace.phases_in(step)[DATALOADER] == 1
    assert_well_formed(trace)


def test_a_script_with_its_own_profiler(tmp_path, capsys):
    script = write_script(
        tmp_path,
        """
        import torch
        torch.ones(3).sum()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.ones(3).mul(2)
        assert any(e.name == "aten::mul" for e in prof.events())
        print("own profile ok")
        """,
    )
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.exit_code == 0, capsys.readouterr().err
    assert "own profile ok" in capsys.readouterr().out
    assert len(result.notes) == 1 and f"{script}:4" in result.notes[0]
    # advisor's trace holds what ran before the script's profiler took over
    names = {e["name"] for e in trace.events}
    assert "aten::sum" in names and "aten::mul" not in names


def test_fullgraph_compile_does_not_see_the_hooks(tmp_path, capsys, recwarn):
    script = write_script(
        tmp_path,
        """
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            loss = compiled(torch.randn(4, 8)).sum()
            loss.backward()
            optimizer.step()
        """,
    )
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.exit_code == 0, capsys.readouterr().err
    assert (result.step_source, result.steps) == ("optimizer", 3)
    # torch's warning about global module hooks is about advisor's, not the user's
    assert not [w for w in recwarn if "global hooks" in str(w.message)]
    # the compiled module's call is still one Forward, seen from the eager side
    for step in trace.steps[1:]:
        assert trace.phases_in(step)[FORWARD] == 1
    # the compilation is marked where it ran: inside the first step's Forward
    assert trace.compiles and all(any(inside(c, p) for p in trace.phases if p["name"] == FORWARD)
                                  for c in trace.compiles)
    assert_well_formed(trace)


def test_the_hooks_around_a_compiled_module_are_not_compiled_themselves(tmp_path, capsys):
    # torch calls the global forward hooks around the compiled module's own call with its
    # frame hook set: compiled as frames of their own, they made three compilations of one.
    script = write_script(
        tmp_path,
        """
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
            def forward(self, x):
                return self.body(x)
        model = torch.compile(Net(), fullgraph=True, backend="eager")
        optimizer = torch.optim.Adam(model.parameters(), 1e-3)
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
        """,
    )
    result, trace = run(script, [], tmp_path, with_stack=False)
    assert result.exit_code == 0, capsys.readouterr().err
    assert len(trace.compiles) == 1


def test_warnings_name_the_users_line_not_the_hooks(tmp_path, recwarn):
    script = write_script(
        tmp_path,
        """
        import torch
        weight = torch.ones(1, requires_grad=True)
        value = float(weight)  # torch warns: a scalar from a tensor that requires grad
        """,
    )
    result = run_script(script, [], save_trace_to=tmp_path / "t.json", with_stack=False)
    assert result.exit_code == 0
    warning = recwarn.pop(UserWarning)
    assert (warning.filename, warning.lineno) == (str(script), 4)


def test_examples_run_plainly():
    # one thread each: three processes share what may be two cores
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = {
        name: subprocess.Popen(
            [sys.executable, str(EXAMPLES / f"{name}.py"), "--steps", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("starved_loader", "clean_train", "host_sync")
    }
    for name, process in processes.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        assert out.startswith(f"{name}: 2 steps")


def test_starting_the_profiler_does_not_import_inductor():
    """torch.profiler asks hasattr(torch, "_inductor"), which imports inductor and sympy
    (a second or more); the collector starts it without that import."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from advisor.collect import torch_hooks\n"
            "from advisor.collect.steps import StepWindow\n"
            "c = torch_hooks.HostCollector(torch, window=StepWindow())\n"
            "c.start(); started = 'torch._inductor' in sys.modules; c.stop()\n"
            "print(started, hasattr(torch, '_inductor'))\n")  # the lazy attribute works again after
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_compilation_is_said_on_a_cpu(tmp_path):
    """torch.compile's first call is a one-off cost: on a CPU, as on a GPU, the session's
    notes say how many compilations, how long, in which step, and which steps ran compiled code."""
    from advisor.collect.assemble import collect_script

    script = write_script(
        tmp_path,
        """
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        compiled = torch.compile(model, backend="eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(8):
            optimizer.zero_grad()
            compiled(torch.randn(4, 8)).sum().backward()
            optimizer.step()
        """,
    )
    collected = collect_script(script, [], gpu=False, sample_interval_s=None, stack_interval_s=None)
    notes = collected.session.meta.collector.notes
    said = [n for n in notes if n.startswith("torch.compile compiled")]
    assert said and "in step 0" in said[0] and "a one-off cost" in said[0], notes
    assert "compiled code ran in recorded steps" in said[0]


def test_a_training_loop_keeps_global_module_hooks_only_inside_the_recorded_window(tmp_path):
    """Every module's call hooked (torch's slow path for all of them) only while steps are
    recorded; outside, only the modules that open a forward: the unrecorded steps are the
    job's pace, the pace every saving is sized on."""
    from advisor.collect.assemble import collect_script

    seen = tmp_path / "seen.json"
    script = write_script(
        tmp_path,
        f"""
        import json
        import torch
        from torch import nn
        from torch.nn.modules import module as module_mod
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = {{}}
        for step in range(14):
            seen[step] = [len(module_mod._global_forward_pre_hooks), len(model._forward_pre_hooks)]
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
        json.dump(seen, open({str(seen)!r}, "w"))
        """,
    )
    # A process of its own: Dynamo's counters are the process's, and a test before this
    # one that compiled in-process would keep the global hooks on (as they must be there).
    done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--format", "json", "-o",
                           str(tmp_path / "r.json"), str(script)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr
    hooks = {int(k): v for k, v in json.loads(seen.read_text()).items()}
    assert hooks[4][0] > 0, "inside the window (steps 2-6) every module's call is hooked"
    assert hooks[12] == [0, 1], "after it only the model's own call"
