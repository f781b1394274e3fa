"""Savings: what advisor predicts a fix saves, against what the fix saves when applied.

Every before/after pair the project has, each a real change an engineer would make:

    script pairs   an example script as a user wrote it, and the same script with the fix
                   advisor recommends applied (num_workers=N, and the main process's torch
                   threads where it says, taken from the finding itself, a batched index, a
                   vectorised augmentation, batched inference, validating less often).
                   Predicted: advisor diagnose on the first. Where two findings' fixes are
                   applied together, the prediction is the report's combined estimate. Measured: both run plain, without advisor; each example
                   times its own steps (the mean after two warm-up steps, which leaves out
                   start-up and the workers' start). Runs alternate before/after and the
                   median of --repeat differences is kept.
                   Where advisor verify applies the fix itself (DataLoader workers, batched
                   indexing, foreach, set_to_none), the pair is measured by `advisor verify`,
                   the command a user runs, unless --by-hand asks for the fixed twin.
                   The GPU pairs (pageable vs pinned copies, single-tensor vs foreach
                   optimizer, zeroed vs dropped gradients, host-made vs device-made tensors,
                   convolution bias before batch norm) run only where torch sees a GPU.
    job pairs      two-rank jobs under torchrun (gloo on this CPU): a rank that validates
                   every step (fix: every 50 steps) and gradients all-reduced by hand after
                   backward (fix: DistributedDataParallel); predicted by `advisor diagnose
                   torchrun ...`, measured from rank 0's own step time, plain torchrun.
    trace pair     the ResNet-50 traces in ../shared/traces (num_workers=0, then 4; a V100,
                   recorded by torch.profiler): predicted from the first trace, measured as
                   the difference of their mean steps. Skipped where that folder is absent.
    published      the Paddle profiler's documented case (a CIFAR-10 CNN, num_workers 0 -> 4,
                   its Model Summary: step 26.67 ms, Dataloader 13.10 ms, GPU 1.20 ms per step
                   before; step 8.50 ms after). Only its summary tables exist, so a trace is
                   made of those figures (ten steps: the loader's read, then the host's other
                   work launching the GPU's) and diagnosed like any trace.

For each pair it prints the rule, the predicted point estimate and range, the measured
saving, their ratio, whether the measured saving lies inside the range, and the report's
combined estimate (every finding's fix at once) with the rules it covers. The goal: the
point within 0.67x..1.5x of the measured saving, and the measured saving inside the range.

    python benchmarks/savings.py                   # every pair this machine can run
    python benchmarks/savings.py --repeat 5 --pairs tokenize_dataset in_memory_loop
    python benchmarks/savings.py --json savings.json

Each measured pair is added to the project's ledger, benchmarks/ledger.jsonl (--ledger,
--no-ledger), which `advisor ledger benchmarks/ledger.jsonl` summarises per rule (docs/ledger.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
TRACES = REPO.parent / "shared" / "traces"
GOAL = (0.67, 1.5)


@dataclass
class ScriptPair:
    """A script, the rule expected to find its problem, and how to apply the fix the finding names."""

    name: str
    script: str
    rule: str | tuple[str, ...]  # two or more: their fixes applied together, judged by the combined estimate
    fix: Callable[[dict], list[str]]  # the finding (each, in order) -> the arguments that apply its fix
    steps: int  # --steps (or count_flag) for every run
    count_flag: str = "--steps"  # how the script is told how much to run
    args: tuple[str, ...] = ()
    repeat_factor: int = 1  # more runs where a step is short and noisy
    gpu: bool = False  # the problem exists only on a GPU: skipped where torch sees none
    ranks: int = 0  # a job: run under torchrun with this many ranks (advisor diagnose torchrun ...)
    verify: bool = False  # advisor verify applies this fix itself: measured by `advisor verify`


def _workers(finding: dict) -> list[str]:
    advice = str(finding["metrics"].get("advice", ""))
    if not advice.startswith("num_workers="):
        raise ValueError(f"the finding does not advise workers: {advice!r}")
    return ["--num-workers", advice.partition("=")[2]]


def _workers_and_threads(finding: dict) -> list[str]:
    """The workers, and the main process's torch threads where the finding sets them."""
    threads = finding["metrics"].get("fix_torch_threads")
    return _workers(finding) + (["--torch-threads", str(int(threads))] if threads else [])


def _precomputed(finding: dict) -> list[str]:
    """The per-item work made once before training, where the finding advises cheaper
    per-item work rather than workers."""
    advice = str(finding["metrics"].get("advice", ""))
    if advice != "cheaper per-item work":
        raise ValueError(f"the finding does not advise cheaper per-item work: {advice!r}")
    return ["--precompute"]


def _made_once_beside_workers(finding: dict) -> list[str]:
    """Workers that cannot keep up and no core left for more: the per-item work made once."""
    if finding["metrics"].get("advice") != "workers cannot keep up" or \
            "make the per-item work cheaper" not in finding["recommendation"]:
        raise ValueError(f"the finding does not advise cheaper per-item work beside the workers: "
                         f"{finding['metrics'].get('advice')!r}")
    return ["--precompute"]


def _loader_fix(workers: Callable[[dict], list[str]]) -> Callable[[dict], list[str]]:
    """The loader fix the finding leads with: ``workers`` (the script's options for them),
    or the per-item work made once before training."""
    def fix(finding: dict) -> list[str]:
        if str(finding["metrics"].get("advice", "")) == "cheaper per-item work":
            return _precomputed(finding)
        return workers(finding)

    return fix


def _less_often(finding: dict) -> list[str]:
    """The period the finding advises: its recommendation's "every N steps rather than M"."""
    match = re.search(r"every (\d+) steps rather than", finding["recommendation"])
    if match is None:
        raise ValueError(f"the finding names no period: {finding['recommendation'][:120]!r}")
    return ["--validate-every", match[1]]


SCRIPT_PAIRS = (
    ScriptPair("starved_loader", "starved_loader.py", "dataloader-starvation", _workers, 100, verify=True),
    # The loader pairs apply whichever fix the finding leads with (workers, or the items made
    # once): which one saves more depends on the machine's cores.
    # tokenize_dataset sets its own threads (one, --threads).
    ScriptPair("tokenize_dataset", "tokenize_dataset.py", "dataloader-starvation", _loader_fix(_workers), 30,
               verify=True),
    ScriptPair("char_features", "char_features.py", "dataloader-starvation", _loader_fix(_workers_and_threads), 60,
               repeat_factor=2, verify=True),
    ScriptPair("custom_collate", "custom_collate.py", "dataloader-starvation", _loader_fix(_workers_and_threads), 60,
               repeat_factor=2, verify=True),
    ScriptPair("json_records", "json_records.py", "dataloader-starvation", _loader_fix(_workers_and_threads), 40,
               repeat_factor=2),
    # Two workers on two cores that cannot keep up: the records decoded once also give the
    # rest of the step the cores back.
    ScriptPair("json_records_workers", "json_records.py", "dataloader-starvation", _made_once_beside_workers, 40,
               args=("--num-workers", "2"), repeat_factor=2),
    # Items augmented at random each time: only workers take the loading off, and on few
    # cores the main process's operators keep to the threads the workers leave.
    ScriptPair("random_augment", "random_augment.py", "dataloader-starvation", _workers_and_threads, 40,
               repeat_factor=2),
    # Items flipped at random whose decode, the costly part, does not depend on the flip.
    ScriptPair("decode_and_flip", "decode_and_flip.py", "dataloader-starvation", _loader_fix(_workers_and_threads),
               40, repeat_factor=2),
    ScriptPair("padded_items", "padded_items.py", "dataloader-starvation", _precomputed, 60, repeat_factor=3),
    ScriptPair("in_memory_loop", "in_memory_loop.py", "dataloader-starvation", lambda f: ["--batched"], 2000,
               repeat_factor=3, verify=True),
    ScriptPair("augment_loop", "augment_loop.py", "host-bound", lambda f: ["--vectorized"], 60),
    ScriptPair("loss_loop", "loss_loop.py", "host-bound", lambda f: ["--vectorized"], 40),
    ScriptPair("masked_pooling", "masked_pooling.py", "batch-loop-in-model", lambda f: ["--batched"], 40),
    # Sixteen threads set by the script: the fix is the cores of the machine it runs on.
    ScriptPair("copied_threads", "copied_threads.py", "cpu-threads-oversubscribed", lambda f: ["--threads", "cores"],
               30, repeat_factor=2),
    ScriptPair("anomaly_left_on", "anomaly_left_on.py", "autograd-anomaly-detection", lambda f: ["--no-anomaly"], 60,
               repeat_factor=2),
    # A scoring loop in eval mode outside no_grad: batches of a third of a millisecond, so
    # many of them and many pairs.
    ScriptPair("scoring_with_grad", "scoring_with_grad.py", "autograd-in-inference", lambda f: ["--no-grad"], 3000,
               repeat_factor=3),
    ScriptPair("per_sample_loop", "per_sample_loop.py", "per-sample-model-calls", lambda f: ["--batched"], 100),
    ScriptPair("per_sample_inference", "per_sample_inference.py", "per-sample-model-calls", lambda f: ["--batched"],
               2000, count_flag="--samples", repeat_factor=2),
    ScriptPair("periodic_validation", "periodic_validation.py", "periodic-step-work", _less_often, 64,
               repeat_factor=2),
    # Two problems, two fixes applied together: the report's combined estimate is the prediction.
    ScriptPair("validation_and_loader", "periodic_validation.py", ("dataloader-starvation", "periodic-step-work"),
               lambda f: _workers(f) if f["rule"] == "dataloader-starvation" else _less_often(f), 64,
               args=("--read-ms", "0.1"), repeat_factor=2),
    ScriptPair("clean_train_fused", "clean_train.py", "optimizer-not-fused", lambda f: ["--fused"], 40, verify=True),
    # GPU pairs: the fixed twins of the GPU cases.
    ScriptPair("pageable_copies", "pageable_copies.py", "sync-memcpy-stall", lambda f: ["--pinned"], 60, gpu=True),
    ScriptPair("per_parameter_optimizer", "per_parameter_optimizer.py", "optimizer-not-fused",
               lambda f: ["--foreach"], 100, gpu=True, verify=True),
    ScriptPair("zeroed_gradients", "per_parameter_optimizer.py", "grad-zeroing-memsets",
               lambda f: ["--set-to-none"], 100, gpu=True, verify=True),
    ScriptPair("host_made_tensors", "host_made_tensors.py", "cpu-tensor-copied-each-step", lambda f: ["--fixed"], 100,
               gpu=True),
    ScriptPair("conv_bias_bn", "conv_bias_bn.py", "conv-bias-before-batchnorm", lambda f: ["--fixed"], 100, gpu=True),
    # Job pairs: two ranks under torchrun (gloo on a CPU), diagnosed as `advisor diagnose torchrun ...`.
    ScriptPair("ddp_straggler", "ddp_straggler.py", "straggler-rank", lambda f: ["--validate-every", "50"], 12,
               ranks=2),
    ScriptPair("allreduce_by_hand", "allreduce_after_backward.py", "communication-not-overlapped",
               lambda f: ["--ddp"], 12, ranks=2),
)


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@dataclass
class Result:
    name: str
    source: str
    rule: str = ""
    top: bool = False
    before_ms: float = float("nan")
    after_ms: float = float("nan")
    point_ms: float = float("nan")
    low_ms: float | None = None
    high_ms: float | None = None
    fix: str = ""
    measured: list[float] = field(default_factory=list)
    failed: str = ""
    combined_ms: float | None = None  # the report's combined estimate (every finding's fix at once)
    combined_rules: tuple[str, ...] = ()
    load_per_core: float | None = None  # the machine's load when the pair was measured

    @property
    def measured_ms(self) -> float:
        return statistics.median(self.measured) if self.measured else float("nan")

    @property
    def ratio(self) -> float:
        return self.point_ms / self.measured_ms if self.measured_ms > 0 else float("nan")

    @property
    def inside(self) -> bool | None:
        if self.low_ms is None or self.high_ms is None or not self.measured:
            return None
        return self.low_ms - 1e-9 <= self.measured_ms <= self.high_ms + 1e-9


# -- predictions ---------------------------------------------------------------------------------

def diagnose(target: list[str], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--format", "json", "-o", str(out),
                               *target], check=False, capture_output=True, text=True, cwd=REPO, timeout=timeout_s,
                              env={**os.environ, "ADVISOR_NO_PROGRESS": "1"})
        if not out.is_file():
            raise RuntimeError(f"advisor diagnose exited {done.returncode}: {done.stderr.strip()[-300:]}")
        return json.loads(out.read_text())


def take_prediction(result: Result, report: dict, rule: str | tuple[str, ...]) -> list[dict]:
    """The findings of ``rule`` (each, in order); the prediction is the finding's saving, or
    for several rules the report's combined estimate (it has no range)."""
    findings = report["findings"]
    rules = (rule,) if isinstance(rule, str) else rule
    chosen = []
    for name in rules:
        finding = next((f for f in findings if f["rule"] == name), None)
        if finding is None:
            raise RuntimeError(f"no {name} finding (found: {', '.join(f['rule'] for f in findings) or 'none'})")
        chosen.append(finding)
    combined = report.get("combined")
    if combined:
        result.combined_ms, result.combined_rules = combined["ms_per_step"], tuple(combined["rules"])
    result.rule = " + ".join(rules)
    result.top = findings[0]["rule"] in rules
    if len(rules) > 1:
        if not combined or not set(rules) <= set(combined["rules"]):
            raise RuntimeError(f"the combined estimate does not cover {', '.join(rules)}")
        result.point_ms = combined["ms_per_step"]
        return chosen
    saving = chosen[0]["saving"]
    result.point_ms, result.low_ms, result.high_ms = (saving["ms_per_step"], saving.get("low_ms_per_step"),
                                                      saving.get("high_ms_per_step"))
    return chosen


# -- measurements ----------------------------------------------------------------------------------

STEP_TIME = re.compile(r"(?P<ms>\d+\.\d+) ms/step")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def per_step_ms(argv: list[str], steps: int, timeout_s: float, ranks: int = 0, count_flag: str = "--steps") -> float:
    """Plain per-step time as the script reports it: its mean step after two warm-up steps
    (rank 0's, for a job run under torchrun)."""
    # A port of its own for each job: back-to-back jobs on torchrun's default port fail now
    # and then while the last one's socket lingers.
    launcher = [sys.executable] if not ranks else [sys.executable, "-m", "torch.distributed.run",
                                                   f"--nproc-per-node={ranks}", f"--master-port={_free_port()}"]
    done = subprocess.run([*launcher, *argv, count_flag, str(steps)], check=False, capture_output=True,
                          text=True, cwd=REPO, timeout=timeout_s)
    match = STEP_TIME.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode} without its step time: "
                           f"{(done.stderr or done.stdout).strip()[-300:]}")
    return float(match["ms"])


class _EditNeeded(Exception):
    """The finding leads with a fix advisor verify cannot apply from outside the script."""


def run_pair(pair: ScriptPair, args: argparse.Namespace) -> Result:
    """A pair measured by `advisor verify` where it applies the fix the finding leads with,
    else by running the fixed twin."""
    if pair.verify and not args.by_hand:
        try:
            return run_verified_pair(pair, args.budget, args.timeout)
        except _EditNeeded:
            print(f"savings: {pair.name}: the finding leads with a fix verify cannot apply; measured by hand",
                  file=sys.stderr, flush=True)
    return run_script_pair(pair, args.repeat, args.timeout)


def run_verified_pair(pair: ScriptPair, budget_s: float, timeout_s: float) -> Result:
    """A pair whose fix advisor applies itself: predicted and measured by `advisor verify`,
    the command a user runs (its trials alternate runs with and without the fix). Raises
    _EditNeeded where the finding leads with the per-item work made cheaper."""
    result = Result(pair.name, "verify", rule=pair.rule)
    if pair.gpu and not gpu_available():
        result.failed = "skipped: a GPU pair, and torch sees no GPU here"
        return result
    trial_steps = max(5, pair.steps // 4)
    try:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "report.json"
            done = subprocess.run([sys.executable, "-m", "advisor", "verify", "--format", "json", "-o", str(out),
                                   "--budget", str(budget_s), "--trial-steps", str(trial_steps),
                                   str(EXAMPLES / pair.script), pair.count_flag, str(pair.steps), *pair.args],
                                  check=False, capture_output=True, text=True, cwd=REPO, timeout=timeout_s + budget_s,
                                  env={**os.environ, "ADVISOR_NO_PROGRESS": "1"})
            if not out.is_file():
                raise RuntimeError(f"advisor verify exited {done.returncode}: {done.stderr.strip()[-300:]}")
            report = json.loads(out.read_text())
        [finding] = take_prediction(result, report, pair.rule)
        checked = finding.get("verification")
        if checked is None and finding["metrics"].get("advice") == "cheaper per-item work":
            raise _EditNeeded
        if checked is None:
            raise RuntimeError(f"not verified: {(finding.get('not_verified') or {}).get('reason', '?')}")
        result.fix = checked["applied"]
        result.before_ms, result.after_ms = checked["before_ms_per_step"], checked["after_ms_per_step"]
        result.measured = [checked["measured_saving_ms_per_step"]]
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        result.failed = str(exc).splitlines()[0][:200]
    return result


def run_script_pair(pair: ScriptPair, repeat: int, timeout_s: float) -> Result:
    result = Result(pair.name, "script", rule=pair.rule)
    script = str(EXAMPLES / pair.script)
    if pair.gpu and not gpu_available():
        result.failed = "skipped: a GPU pair, and torch sees no GPU here"
        return result
    try:
        launcher = ["torchrun", f"--nproc-per-node={pair.ranks}"] if pair.ranks else []
        report = diagnose([*launcher, script, pair.count_flag, str(pair.steps), *pair.args], timeout_s)
        fix = [arg for finding in take_prediction(result, report, pair.rule) for arg in pair.fix(finding)]
        result.fix = " ".join(fix)
        befores, afters = [], []
        for _ in range(repeat * pair.repeat_factor):
            befores.append(per_step_ms([script, *pair.args], pair.steps, timeout_s, pair.ranks, pair.count_flag))
            afters.append(per_step_ms([script, *pair.args, *fix], pair.steps, timeout_s, pair.ranks,
                                      pair.count_flag))
            result.measured.append(befores[-1] - afters[-1])
        result.before_ms, result.after_ms = statistics.median(befores), statistics.median(afters)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        result.failed = str(exc).splitlines()[0][:200]
    return result


def run_trace_pair(timeout_s: float) -> Result:
    result = Result("resnet50_v100 traces", "trace", fix="num_workers 0 -> 4")
    before = TRACES / "resnet50_v100_num_workers_0.pt.trace.json.gz"
    after = TRACES / "resnet50_v100_num_workers_4.pt.trace.json.gz"
    if not (before.is_file() and after.is_file()):
        result.failed = f"skipped: {TRACES} is absent"
        return result
    try:
        first = diagnose([str(before)], timeout_s)
        take_prediction(result, first, "dataloader-starvation")
        second = diagnose([str(after)], timeout_s)
        result.before_ms = first["session"]["steps"]["mean_step_ns"] / 1e6
        result.after_ms = second["session"]["steps"]["mean_step_ns"] / 1e6
        result.measured.append(result.before_ms - result.after_ms)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result.failed = str(exc).splitlines()[0][:200]
    return result


PADDLE = {"step_ms": 26.67, "loader_ms": 13.10, "gpu_ms": 1.20, "after_ms": 8.50}


def paddle_trace(path: Path, steps: int = 10) -> Path:
    """A Kineto trace of the Paddle case's figures: each step the loader's read (13.10 ms),
    then the host's other work (13.57 ms) launching ten kernels (1.20 ms of GPU work)."""
    events, now, correlation = [], 0.0, 0
    rest = PADDLE["step_ms"] - PADDLE["loader_ms"]
    for step in range(steps):
        at = now
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": at * 1e3, "dur": PADDLE["step_ms"] * 1e3})
        events.append({"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": at * 1e3,
                       "dur": PADDLE["loader_ms"] * 1e3,
                       "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"})
        host = at + PADDLE["loader_ms"]
        for k in range(10):
            correlation += 1
            launch = host + k * rest / 10
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1,
                           "ts": launch * 1e3, "dur": rest / 10 * 1e3 - 1})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": launch * 1e3 + 1, "dur": 5, "args": {"correlation": correlation}})
            events.append({"ph": "X", "cat": "kernel", "name": "implicit_convolve_sgemm", "pid": 0, "tid": 7,
                           "ts": launch * 1e3 + 10, "dur": PADDLE["gpu_ms"] / 10 * 1e3,
                           "args": {"device": 0, "stream": 7, "correlation": correlation}})
        now = at + PADDLE["step_ms"]
    doc = {"schemaVersion": 1, "traceEvents": events,
           "deviceProperties": [{"id": 0, "name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0}]}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def run_published(timeout_s: float) -> Result:
    """The Paddle profiler's documented num_workers case, as a trace made of its figures."""
    result = Result("paddle cifar10 (published)", "published", fix="num_workers 0 -> 4",
                    before_ms=PADDLE["step_ms"], after_ms=PADDLE["after_ms"])
    try:
        with tempfile.TemporaryDirectory() as folder:
            report = diagnose([str(paddle_trace(Path(folder) / "paddle.json.gz"))], timeout_s)
        take_prediction(result, report, "dataloader-starvation")
        result.measured.append(PADDLE["step_ms"] - PADDLE["after_ms"])
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result.failed = str(exc).splitlines()[0][:200]
    return result


# -- output ------------------------------------------------------------------------------------------

LEDGER = REPO / "benchmarks" / "ledger.jsonl"


def load_per_core() -> float | None:
    from advisor.verify.ledger import load_per_core as load

    return load()


def to_ledger(results: list[Result], path: Path) -> int:
    """Each measured pair as a record of the project's ledger (advisor.verify.ledger)."""
    from advisor.verify.ledger import LedgerEntry, append

    entries = [LedgerEntry(rule=str(r.rule), source="savings", target=r.name, fix=r.fix, predicted_ms=r.point_ms,
                           low_ms=r.low_ms, high_ms=r.high_ms, measured_ms=r.measured_ms,
                           spread_ms=statistics.pstdev(r.measured) if len(r.measured) > 1 else None,
                           before_ms=r.before_ms if r.before_ms == r.before_ms else None,
                           load_per_core=r.load_per_core)
               for r in results if not r.failed and r.measured and r.point_ms == r.point_ms and r.rule]
    append(entries, path)
    return len(entries)


def render(results: list[Result]) -> str:
    header = ("pair", "rule (top?)", "fix", "before -> after ms/step", "predicted ms [range]", "measured ms",
              "predicted/measured", "inside range", "combined ms (rules)")
    rows = []
    for r in results:
        if r.failed:
            rows.append((r.name, r.rule, r.fix, "", "", "", "", r.failed, ""))
            continue
        rng = f" [{r.low_ms:.3g}, {r.high_ms:.3g}]" if r.low_ms is not None and r.high_ms is not None else ""
        spread = (f" (+-{statistics.pstdev(r.measured):.2g})" if len(r.measured) > 1 else "")
        ok = r.ratio and GOAL[0] <= r.ratio <= GOAL[1]
        combined = (f"{r.combined_ms:.3g} ({', '.join(r.combined_rules)})" if r.combined_ms is not None
                    else "none")
        rows.append((r.name, f"{r.rule} ({'top' if r.top else 'not top'})",
                     r.fix, f"{r.before_ms:.3g} -> {r.after_ms:.3g}", f"{r.point_ms:.3g}{rng}",
                     f"{r.measured_ms:.3g}{spread}", f"{r.ratio:.2f}x{'' if ok else ' (outside goal)'}",
                     {True: "yes", False: "no", None: "combined: no range"}[r.inside], combined))
    widths = [max(len(str(x[i])) for x in [header, *rows]) for i in range(len(header))]
    lines = [f"goal: predicted within {GOAL[0]}x..{GOAL[1]}x of measured, measured inside the range"]
    for row in [header, *rows]:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="plain timings per script pair (median kept)")
    parser.add_argument("--pairs", nargs="*", help="only these pairs (script names, 'trace', 'published')")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per command")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--by-hand", action="store_true",
                        help="measure every script pair by running its fixed twin, also those advisor verify can "
                             "measure itself")
    parser.add_argument("--budget", type=float, default=240.0, help="advisor verify's --budget for a pair it measures")
    parser.add_argument("--ledger", type=Path, default=LEDGER,
                        help=f"add each measured pair to this ledger (default {LEDGER.relative_to(REPO)}; "
                             "`advisor ledger FILE` summarises it)")
    parser.add_argument("--no-ledger", action="store_true", help="do not add the results to a ledger")
    args = parser.parse_args(argv)
    wanted = set(args.pairs or [])
    results = []
    for pair in SCRIPT_PAIRS:
        if not wanted or pair.name in wanted:
            print(f"savings: {pair.name} ...", file=sys.stderr, flush=True)
            results.append(run_pair(pair, args))
            results[-1].load_per_core = load_per_core()
    if not wanted or "trace" in wanted:
        results.append(run_trace_pair(args.timeout))
    if not wanted or "published" in wanted:
        results.append(run_published(args.timeout))
    print(render(results))
    if not args.no_ledger:
        added = to_ledger(results, args.ledger)
        print(f"savings: {added} pair(s) added to {args.ledger}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps([{**vars(r), "measured_ms": r.measured_ms, "ratio": r.ratio,
                                          "inside": r.inside} for r in results], indent=2))
    return 1 if any(r.failed and not r.failed.startswith("skipped") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
