"""The checks of the built-in CUPTI collector that need a GPU, as one command.

The collector (advisor.collect.cupti) is unit-tested on replayed activity streams; what
only real hardware can show is checked here. Run it on a machine with an NVIDIA GPU, a
CUDA build of torch and the matching cupti-python (``pip install 'advisor[cuda]'``):

    python benchmarks/gpu_checks.py                       # every check
    python benchmarks/gpu_checks.py --only attribution,kernels
    python benchmarks/gpu_checks.py --dry-run             # what it would run (any machine)
    python benchmarks/gpu_checks.py --out /tmp/gc --bundle "$OUT/gpu_checks.tar.gz"
                                        # everything a reviewer needs in one archive

The checks (each runs its programs in fresh processes, so CUPTI has one user at a time):

attribution  A real training loop (benchmarks/collector_overhead.py's CNN with a
             DataLoader, on cuda) under ``collect_script(gpu=True, steps=A:B)``: the share
             of kernels tied to an op (parent_op >= 0) and to a phase (Dataloader, Forward,
             Backward, Optimization); target >= 99% each. The steps recorded must be A..B-1.
clock        On the same session: no GPU activity starts before the call that launched it,
             and the runtime/driver calls an op made (external correlation) lie inside the
             op's host time range, i.e. CUPTI's clock and the host's line up.
kernels      The same loop under torch.profiler(activities=[CPU, CUDA]) for the same steps,
             read with advisor.importers.load: per-kernel-name total GPU time must agree
             with the CUPTI collector's within 5% for every kernel above 1% of the total.
records      A workload that makes every kind of record the collector reads (kernels,
             pageable and pinned copies both ways, a memset, stream / event / context
             synchronisation, a stream waiting on an event, ops) under a CuptiCollector
             started before CUDA initialises: every field advisor copies is present on
             cupti-python's record classes, copies are named and sized right, device
             records arrive, the clock offset is small, the dropped-record count can be
             read, the enums agree.
nvtx         The same workload with NVTX_INJECTION64_PATH naming the libcupti in use:
             torch.cuda.nvtx ranges come back as annotation rows.
drops        A collector that gives CUPTI no buffer space: CUPTI's dropped-record count
             reaches the session's notes (inconclusive where CUPTI drops nothing).
compile      A torch.compile'd model trained with the op recorder on from the first step
             (``--steps all``): the script still runs, its losses match a run without
             advisor, and the Dynamo graph count is reported.
cases        For each example with a planted problem (and the fixed twins of two of
             them: pageable_copies --pinned, aligned_gemm), ``advisor diagnose --save
             cases/gpu_<name>/session ...`` and a drafted case.yaml (cases/README.md's
             format) with must / must_not / expect from what was planted, and a header
             saying what fired: REVIEW IT BY HAND before committing. A case whose
             case.yaml exists is left alone (``python cases/record.py NAME`` records it
             again); ``--overwrite-cases`` replaces it.

Everything else goes to ``--out`` (a new temporary folder by default): results.json, the
sessions and the torch.profiler trace. Exit status: 0 when every check passed (or only
informs), 1 when one failed, 2 when this machine cannot run them. Each program gets
``--timeout`` seconds (240). Expect a few minutes in all, torch.compile and the case
recordings taking most; where one command may run 10 minutes at most, split it:
``--only attribution,clock,kernels,records,nvtx,drops`` then ``--only compile,cases``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advisor.collect import cupti_records as rec  # imports no CUPTI

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
LOOP = REPO / "benchmarks" / "collector_overhead.py"
MARK = "gpu_checks:"  # prefix of the JSON lines the children print
PHASES = ("Dataloader", "Forward", "Backward", "Optimization")
ATTRIBUTION_TARGET = 0.99
KERNEL_TOLERANCE = 0.05
KERNEL_MIN_SHARE = 0.01
CLOCK_TOLERANCE_NS = 2_000
CLOCK_OFFSET_LIMIT_NS = 1_000_000  # the collector's own threshold for a note
CHILD_TIMEOUT_S = 240  # a hung child must not eat a GPU session's time
CHECKS = ("attribution", "clock", "kernels", "records", "nvtx", "drops", "compile", "cases")


# -- comparing sessions (pure functions of Sessions; tests/test_examples.py runs them) --------------


def _kernels(session: Any, steps: Any = None) -> pd.DataFrame:
    events = session.events
    kernels = events[(events["kind"] == "kernel").to_numpy()]
    if steps is not None:
        kernels = kernels[kernels["step"].isin(list(steps)).to_numpy()]
    return kernels


def kernel_totals(session: Any, steps: Any = None) -> pd.DataFrame:
    """Total GPU time (ns) and launches per kernel name, over ``steps`` (all where None)."""
    from advisor.session import text

    kernels = _kernels(session, steps)
    frame = pd.DataFrame({
        "name": text(kernels["name"]) if len(kernels) else np.asarray([], dtype=object),
        "ns": (kernels["end_ns"] - kernels["start_ns"]).to_numpy(dtype="int64"),
    })
    return frame.groupby("name").agg(total_ns=("ns", "sum"), calls=("ns", "size"))


@dataclass
class KernelComparison:
    """Per-kernel-name GPU time in advisor's session against a reference session."""

    rows: pd.DataFrame
    """Index: kernel name. Columns: advisor_ns, reference_ns, advisor_calls,
    reference_calls, share (the larger of its shares of either total), rel_diff
    ((advisor - reference) / reference; inf where the reference lacks it), checked (share
    >= min_share), within (|rel_diff| <= tolerance)."""
    tolerance: float
    min_share: float
    advisor_total_ns: int
    reference_total_ns: int

    @property
    def offenders(self) -> pd.DataFrame:
        """Checked kernels outside the tolerance, worst first."""
        bad = self.rows[self.rows["checked"] & ~self.rows["within"]]
        return bad.assign(_abs=bad["rel_diff"].abs()).sort_values("_abs", ascending=False).drop(columns="_abs")

    @property
    def ok(self) -> bool:
        return self.advisor_total_ns > 0 and self.reference_total_ns > 0 and not len(self.offenders)

    def lines(self, limit: int = 12) -> list[str]:
        """The comparison in words: totals, the largest kernels, the worst offenders."""
        out = [(f"kernel time: advisor {self.advisor_total_ns / 1e6:.3f} ms, torch.profiler "
                f"{self.reference_total_ns / 1e6:.3f} ms over {len(self.rows)} kernel names; "
                f"{int(self.rows['checked'].sum())} above {self.min_share:.0%} of the total checked to "
                f"{self.tolerance:.0%}")]

        def describe(name: str, row: pd.Series) -> str:
            if row["reference_ns"] == 0:
                diff = "advisor only"
            elif row["advisor_ns"] == 0:
                diff = "torch only"
            else:
                diff = f"{row['rel_diff']:+.1%}"
            return (f"  {diff:>12}  share {row['share']:.1%}  advisor {row['advisor_ns'] / 1e3:.1f} us "
                    f"x{int(row['advisor_calls'])}  torch {row['reference_ns'] / 1e3:.1f} us "
                    f"x{int(row['reference_calls'])}  {name[:100]}")

        offenders = self.offenders
        if len(offenders):
            out.append(f"worst offenders ({len(offenders)}):")
            out.extend(describe(name, row) for name, row in offenders.head(limit).iterrows())
        largest = self.rows.sort_values("share", ascending=False).head(limit)
        out.append("largest kernels:")
        out.extend(describe(name, row) for name, row in largest.iterrows())
        return out


def compare_kernel_times(advisor: Any, reference: Any, *, steps: Any = None, min_share: float = KERNEL_MIN_SHARE,
                         tolerance: float = KERNEL_TOLERANCE) -> KernelComparison:
    """Compare per-kernel-name total GPU time of two sessions of the same program and
    steps (advisor's CUPTI collector against torch.profiler's trace). A kernel counts when
    it is at least ``min_share`` of either session's kernel time; it agrees when its
    totals differ by at most ``tolerance`` of the reference's. A kernel missing from one
    side is an infinite difference (a naming disagreement shows up that way too)."""
    mine = kernel_totals(advisor, steps)
    theirs = kernel_totals(reference, steps)
    rows = mine.merge(theirs, how="outer", left_index=True, right_index=True, suffixes=("_a", "_r")).fillna(0)
    rows = pd.DataFrame({
        "advisor_ns": rows["total_ns_a"].astype("int64"),
        "reference_ns": rows["total_ns_r"].astype("int64"),
        "advisor_calls": rows["calls_a"].astype("int64"),
        "reference_calls": rows["calls_r"].astype("int64"),
    }, index=rows.index)
    advisor_total = int(rows["advisor_ns"].sum())
    reference_total = int(rows["reference_ns"].sum())
    rows["share"] = np.maximum(rows["advisor_ns"] / max(advisor_total, 1), rows["reference_ns"] / max(reference_total, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = (rows["advisor_ns"] - rows["reference_ns"]) / rows["reference_ns"]
    # Missing from the reference: an infinite difference; missing from advisor: -100%.
    rows["rel_diff"] = diff.where(rows["reference_ns"] > 0, np.inf).where(rows["advisor_ns"] > 0, -1.0)
    rows["checked"] = rows["share"] >= min_share
    rows["within"] = rows["rel_diff"].abs() <= tolerance
    return KernelComparison(rows.sort_values("share", ascending=False), tolerance, min_share, advisor_total,
                            reference_total)


def attribution_shares(session: Any) -> dict[str, Any]:
    """How many kernels reached an op, a phase, a launch call and a step, and the names of
    those that did not."""
    from advisor.session import text

    kernels = _kernels(session)
    count = len(kernels)
    if not count:
        return {"kernels": 0}
    names = text(kernels["name"])
    phase = text(kernels["phase"])
    with_op = kernels["parent_op"].to_numpy() >= 0
    with_phase = np.isin(phase, PHASES)

    def top(mask: np.ndarray) -> list[list[Any]]:
        counts = pd.Series(names[mask]).value_counts().head(8)
        return [[str(k)[:100], int(v)] for k, v in counts.items()]

    return {
        "kernels": count,
        "with_op": float(with_op.mean()),
        "with_phase": float(with_phase.mean()),
        "with_launch": float((kernels["launch"].to_numpy() >= 0).mean()),
        "with_step": float((kernels["step"].to_numpy() >= 0).mean()),
        "by_phase": {str(k): int(v) for k, v in pd.Series(phase).replace("", "(none)").value_counts().items()},
        "without_op": top(~with_op),
        "without_phase": top(~with_phase),
    }


def clock_consistency(session: Any, tolerance_ns: int = CLOCK_TOLERANCE_NS) -> dict[str, Any]:
    """Whether the GPU's and the host's timelines agree: GPU work starts after the call
    that launched it, and each API call tied to an op by external correlation lies inside
    that op's host time range (more than ``tolerance_ns`` out counts)."""
    from advisor.session import GPU_KINDS, text

    events = session.events
    kind = text(events["kind"])
    start = events["start_ns"].to_numpy()
    end = events["end_ns"].to_numpy()
    launch = events["launch"].to_numpy()
    parent = events["parent_op"].to_numpy()
    external = events["external_id"].to_numpy()

    gpu = np.flatnonzero(np.isin(kind, GPU_KINDS) & (launch >= 0))
    lead = start[gpu] - start[launch[gpu]]
    calls = np.flatnonzero(np.isin(kind, ("runtime", "driver")) & (parent >= 0) & (external >= 0))
    ops = parent[calls]
    outside = np.maximum(np.maximum(start[ops] - start[calls], end[calls] - end[ops]), 0)
    return {
        "gpu_rows": len(gpu),
        "gpu_before_launch": int((lead < -tolerance_ns).sum()),
        "worst_gpu_lead_ns": int(-lead.min()) if len(lead) and lead.min() < 0 else 0,
        "calls_in_ops": len(calls),
        "calls_outside_op": int((outside > tolerance_ns).sum()),
        "worst_outside_ns": int(outside.max()) if len(outside) else 0,
    }


# -- results ------------------------------------------------------------------------------------


@dataclass
class Result:
    check: str
    status: str  # pass, fail, info, skip
    summary: str
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    out: Path
    window: tuple[int, int]
    dry_run: bool = False
    overwrite_cases: bool = False
    timeout_s: float = CHILD_TIMEOUT_S
    device_name: str = "a GPU"
    sessions: dict[str, Any] = field(default_factory=dict)

    @property
    def loop_steps(self) -> int:
        return self.window[1] + 2  # past the window: the collector closes it there

    def loop_args(self) -> list[str]:
        return ["loop", "--device", "cuda", "--steps", str(self.loop_steps)]


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_child(ctx: Context, command: list[str], *, env: dict[str, str] | None = None,
              label: str = "") -> subprocess.CompletedProcess | None:
    """Run one program from the repository root; None (and a line saying what) in a dry run."""
    shown = " ".join(shlex.quote(c) for c in command)
    if env:
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shown
    if ctx.dry_run:
        print(f"  would run{f' ({label})' if label else ''}: {shown}")
        return None
    print(f"gpu_checks: {label or 'running'}: {shown}", file=sys.stderr, flush=True)
    try:
        return subprocess.run(command, check=False, capture_output=True, text=True, cwd=REPO, timeout=ctx.timeout_s,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout or ""
        if isinstance(partial, bytes):  # TimeoutExpired keeps bytes even for text=True
            partial = partial.decode(errors="replace")
        return subprocess.CompletedProcess(command, 124, partial, f"timed out after {ctx.timeout_s:.0f} s")


def marked(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        if line.startswith(MARK):
            try:
                out.append(json.loads(line[len(MARK):]))
            except ValueError:
                pass
    return out


def failure_line(done: subprocess.CompletedProcess) -> str:
    tail = (done.stderr or done.stdout or "").strip().splitlines()
    return f"exit {done.returncode}: {_short(tail[-1]) if tail else 'no output'}"


def collect_command(session_dir: Path, window: str, script: Path, args: list[str]) -> list[str]:
    return [sys.executable, str(HERE), "_child", "collect", str(session_dir), window, str(script), *args]


def collect(ctx: Context, key: str, window: str, script: Path, args: list[str], label: str) -> tuple[Any, dict, str]:
    """Run ``script`` under collect_script(gpu=True) in a child; (session, its report, error)."""
    from advisor.importers import load

    session_dir = ctx.out / key
    done = run_child(ctx, collect_command(session_dir, window, script, args), label=label)
    if done is None:
        return None, {}, "dry run"
    report = next((r for r in marked(done.stdout) if r.get("what") == "collect"), None)
    if report is None:
        return None, {}, failure_line(done)
    if report["collector"] != "cupti":
        notes = "; ".join(report.get("notes", []))
        return None, report, f"the {report['collector']} collector ran, not CUPTI: {_short(notes)}"
    if report["exit_code"] != 0:
        return None, report, f"{script.name} exited {report['exit_code']} under the collector: {failure_line(done)}"
    session = load(session_dir)
    report["stdout"] = done.stdout
    return session, report, ""


# -- (a) attribution and clock ------------------------------------------------------------------------


def loop_session(ctx: Context) -> tuple[Any, dict, str]:
    if "loop" not in ctx.sessions:
        start, stop = ctx.window
        ctx.sessions["loop"] = collect(ctx, "loop_session", f"{start}:{stop}", LOOP, ctx.loop_args(),
                                       "the loop under the CUPTI collector")
    return ctx.sessions["loop"]


def check_attribution(ctx: Context) -> Result:
    session, _report, error = loop_session(ctx)
    if session is None:
        return Result("attribution", "fail" if error != "dry run" else "skip", error)
    shares = attribution_shares(session)
    steps = sorted(int(s) for s in session.steps()["step"])
    wanted = list(range(*ctx.window))
    lines = [f"{shares['kernels']} kernels in steps {steps}; by phase: {shares.get('by_phase')}",
             (f"with an op {shares.get('with_op', 0):.2%}, a phase {shares.get('with_phase', 0):.2%}, "
              f"a launch call {shares.get('with_launch', 0):.2%}, a step {shares.get('with_step', 0):.2%}")]
    if shares.get("without_op"):
        lines.append(f"without an op: {shares['without_op']}")
    if shares.get("without_phase"):
        lines.append(f"without a phase: {shares['without_phase']}")
    lines.extend(f"note: {n}" for n in session.meta.collector.notes)
    ok = (shares["kernels"] > 0 and shares["with_op"] >= ATTRIBUTION_TARGET
          and shares["with_phase"] >= ATTRIBUTION_TARGET and steps == wanted)
    summary = (f"{shares.get('with_op', 0):.2%} of {shares['kernels']} kernels have an op, "
               f"{shares.get('with_phase', 0):.2%} a phase (target {ATTRIBUTION_TARGET:.0%}); "
               f"steps {steps} recorded, {wanted} asked")
    return Result("attribution", "pass" if ok else "fail", summary, lines, {"shares": shares, "steps": steps})


def check_clock(ctx: Context) -> Result:
    session, _report, error = loop_session(ctx)
    if session is None:
        return Result("clock", "fail" if error != "dry run" else "skip", error)
    found = clock_consistency(session)
    outside_share = found["calls_outside_op"] / max(found["calls_in_ops"], 1)
    ok = found["gpu_rows"] > 0 and found["calls_in_ops"] > 0 and found["gpu_before_launch"] == 0 and outside_share <= 0.01
    summary = (f"{found['gpu_before_launch']} of {found['gpu_rows']} GPU rows start before their launch call "
               f"(worst {found['worst_gpu_lead_ns'] / 1e3:.1f} us); {found['calls_outside_op']} of "
               f"{found['calls_in_ops']} op calls lie outside their op by more than {CLOCK_TOLERANCE_NS / 1e3:.0f} us "
               f"(worst {found['worst_outside_ns'] / 1e3:.1f} us)")
    return Result("clock", "pass" if ok else "fail", summary, [], found)


# -- (b) kernels against torch.profiler ---------------------------------------------------------------


def check_kernels(ctx: Context) -> Result:
    from advisor.importers import load

    session, _report, error = loop_session(ctx)
    trace = ctx.out / "torch_profiler_trace.json"
    start, stop = ctx.window
    done = run_child(ctx, [sys.executable, str(LOOP), *ctx.loop_args(), "--torch-profiler", f"{start}:{stop}",
                           "--trace", str(trace)], label="the loop under torch.profiler")
    if done is None:
        return Result("kernels", "skip", "dry run")
    if session is None:
        return Result("kernels", "fail", f"no advisor session: {error}")
    if done.returncode != 0 or not trace.is_file():
        return Result("kernels", "fail", f"torch.profiler run failed: {failure_line(done)}")
    reference = load(trace)
    comparison = compare_kernel_times(session, reference, steps=range(start, stop))
    offenders = comparison.offenders
    summary = (f"{int(comparison.rows['checked'].sum())} kernels above {KERNEL_MIN_SHARE:.0%} checked, "
               f"{len(offenders)} differ by more than {KERNEL_TOLERANCE:.0%}; totals advisor "
               f"{comparison.advisor_total_ns / 1e6:.3f} ms, torch.profiler {comparison.reference_total_ns / 1e6:.3f} ms")
    data = {"advisor_total_ns": comparison.advisor_total_ns, "reference_total_ns": comparison.reference_total_ns,
            "rows": json.loads(comparison.rows.replace([np.inf, -np.inf], None).reset_index().to_json(orient="records"))}
    return Result("kernels", "pass" if comparison.ok else "fail", summary, comparison.lines(), data)


# -- (d) records, NVTX, drops, compile --------------------------------------------------------------------

EXPECTED_COPIES = {
    "Memcpy HtoD (Pageable -> Device)": "x.to('cuda') from pageable memory",
    "Memcpy HtoD (Pinned -> Device)": "pinned.to('cuda', non_blocking=True)",
    "Memcpy DtoH (Device -> Pageable)": "y.cpu()",
    "Memcpy DtoH (Device -> Pinned)": "pinned.copy_(y, non_blocking=True)",
}
EXPECTED_SYNCS = ("Stream Sync", "Event Sync", "Context Sync", "Stream Wait Event")
WORKLOAD_ELEMENTS = 1 << 20  # float32: 4 MiB per copy


def records_command(out_json: Path, *, buffer_bytes: int | None = None) -> list[str]:
    command = [sys.executable, str(HERE), "_child", "records", str(out_json)]
    if buffer_bytes is not None:
        command += ["--buffer-bytes", str(buffer_bytes)]
    return command


def check_records(ctx: Context) -> Result:
    out_json = ctx.out / "records.json"
    done = run_child(ctx, records_command(out_json), label="the record workload")
    if done is None:
        return Result("records", "skip", "dry run")
    if not out_json.is_file():
        return Result("records", "fail", f"the workload wrote no report: {failure_line(done)}")
    found = json.loads(out_json.read_text())
    if found.get("error"):
        return Result("records", "fail", found["error"])
    problems: list[str] = []
    lines: list[str] = []
    for key, entry in sorted(found["record_types"].items()):
        detail = f"{key}: {entry['count']} records"
        if entry.get("renamed"):
            detail += f"; read under other names: {entry['renamed']}"
        if entry.get("missing"):
            detail += f"; MISSING fields {entry['missing']}"
            problems.append(f"{key} lacks {entry['missing']}")
        lines.append(detail)
    kinds_seen = {key.split("/")[0] for key in found["record_types"]}
    for kind in ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "RUNTIME", "DRIVER",
                 "EXTERNAL_CORRELATION", "DEVICE", "CONTEXT"):
        # The memset is the one driver call the workload surely makes itself.
        needed = kind not in ("MEMSET", "DRIVER") or found.get("memset_issued")
        if kind not in kinds_seen:
            (problems if needed else lines).append(f"no {kind} records arrived")
    if not found.get("memset_issued"):
        lines.append(f"the memset could not be issued: {found.get('memset_error')}")
    copies = found["copies"]
    for name, what in EXPECTED_COPIES.items():
        entry = copies.get(name)
        if entry is None:
            problems.append(f"no '{name}' row ({what}); copies seen: {sorted(copies)}")
        elif name.startswith("Memcpy HtoD (Pageable") and WORKLOAD_ELEMENTS * 4 not in entry["bytes"]:
            problems.append(f"'{name}' has bytes {entry['bytes']}, expected {WORKLOAD_ELEMENTS * 4}")
    lines.append(f"copies: {copies}")
    missing_syncs = [s for s in EXPECTED_SYNCS if s not in found["syncs"]]
    if missing_syncs:
        problems.append(f"no sync rows named {missing_syncs}; seen {found['syncs']}")
    kernels = found["kernels"]
    if kernels["count"] == 0:
        problems.append("no kernel rows")
    if kernels["mangled"]:
        problems.append(f"{kernels['mangled']} kernel names still mangled, e.g. {kernels['mangled_example']}")
    if kernels["bad_geometry"]:
        problems.append(f"{kernels['bad_geometry']} kernels without grid/block/registers")
    if kernels["with_op"] < ATTRIBUTION_TARGET:
        problems.append(f"only {kernels['with_op']:.1%} of the workload's kernels reached an op")
    lines.append(f"kernels: {kernels}")
    devices = [d for d in found["devices"] if d["kind"] == "gpu"]
    if not devices:
        problems.append("no GPU device in the capture")
    for device in devices:
        lines.append(f"device {device['id']}: {device['name']}, sm {device['sm_count']}, "
                     f"{device['memory_bandwidth_gbps']} GB/s, from {device['properties'].get('source')}")
        if device["properties"].get("source") != "cupti device record":
            problems.append(f"device {device['id']} came from torch, not from a CUPTI device record")
    offset, error = found["clock_offset_ns"], found["clock_error_ns"]
    lines.append(f"clock offset {offset / 1e3:.1f} us (+- {error / 1e3:.1f} us); on Linux CUPTI reads CLOCK_REALTIME, so near 0")
    if abs(offset) > CLOCK_OFFSET_LIMIT_NS:
        problems.append(f"CUPTI's clock is {offset / 1e6:.3f} ms off the host's")
    dropped = found["dropped_read"]
    lines.append(f"dropped-record count: {dropped}")
    if not dropped.get("readable"):
        problems.append(f"activity_get_num_dropped_records as the collector calls it failed: {dropped.get('error')}")
    if found["enum_problems"]:
        problems.extend(found["enum_problems"])
    lines.append(f"overhead recorded: {found['overhead_ns'] / 1e6:.3f} ms")
    lines.extend(f"note: {n}" for n in found["notes"])
    summary = ("every field, copy, sync, device record and the clock as expected" if not problems
               else "; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""))
    return Result("records", "fail" if problems else "pass", summary, [f"PROBLEM: {p}" for p in problems] + lines, found)


def loaded_libcupti(ctx: Context) -> str | None:
    """The libcupti that cupti-python loads here (what NVTX_INJECTION64_PATH must name)."""
    code = ("from cupti import cupti\ncupti.get_timestamp()\n"  # loads libcupti if not yet loaded
            "paths = {l.split()[-1] for l in open('/proc/self/maps') if 'libcupti' in l}\n"
            "print('\\n'.join(sorted(paths)))")
    probe = run_child(ctx, [sys.executable, "-c", code], label="where libcupti is")
    if probe is None or probe.returncode != 0:
        return None
    paths = [p for p in probe.stdout.split() if re.search(r"libcupti\.so", p)]
    return paths[0] if paths else None


def check_nvtx(ctx: Context) -> Result:
    library = loaded_libcupti(ctx) if not ctx.dry_run else "<the libcupti cupti-python loads>"
    if library is None:
        return Result("nvtx", "info", "could not find the libcupti cupti-python loads; NVTX not checked")
    out_json = ctx.out / "records_nvtx.json"
    done = run_child(ctx, records_command(out_json), env={"NVTX_INJECTION64_PATH": library},
                     label="the record workload with NVTX injection")
    if done is None:
        return Result("nvtx", "skip", "dry run")
    if not out_json.is_file():
        return Result("nvtx", "fail", f"the workload wrote no report: {failure_line(done)}")
    found = json.loads(out_json.read_text())
    if found.get("error"):
        return Result("nvtx", "fail", found["error"])
    ranges = found["nvtx"]
    ok = "gpu_checks.range" in ranges["names"] and "gpu_checks.mark" in ranges["names"]
    summary = (f"{ranges['rows']} NVTX annotation rows ({ranges['names'][:5]}) with NVTX_INJECTION64_PATH={library}; "
               f"{ranges['unpaired_note'] or 'no unpaired markers'}")
    return Result("nvtx", "pass" if ok else "fail", summary, [], ranges)


def check_drops(ctx: Context) -> Result:
    out_json = ctx.out / "records_drops.json"
    done = run_child(ctx, records_command(out_json, buffer_bytes=0), label="the record workload with no buffer space")
    if done is None:
        return Result("drops", "skip", "dry run")
    if not out_json.is_file():
        return Result("drops", "info", f"inconclusive: the workload wrote no report ({failure_line(done)})")
    found = json.loads(out_json.read_text())
    if found.get("error"):
        return Result("drops", "info", f"inconclusive: {found['error']}")
    dropped = found["collector_dropped"]
    noted = [n for n in found["notes"] if "dropped" in n]
    if dropped > 0 and noted:
        return Result("drops", "pass", f"CUPTI dropped {dropped} records and the session says so: {noted[0]}")
    if dropped > 0:
        return Result("drops", "fail", f"CUPTI dropped {dropped} records but no note says so")
    return Result("drops", "info", "inconclusive: CUPTI dropped nothing with no buffer space "
                  f"(kinds seen: {sorted(found['record_types'])[:6]})")


COMPILE_SCRIPT = '''\
"""gpu_checks: a torch.compile'd MLP trained a few steps; prints its losses."""
import json
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
x = torch.randn(steps * 64, 256)
y = torch.randint(0, 10, (steps * 64,))
loader = DataLoader(TensorDataset(x, y), batch_size=64, pin_memory=True)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 10)).cuda()
compiled = torch.compile(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for xb, yb in loader:
    xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(compiled(xb), yb)
    loss.backward()
    optimizer.step()
    losses.append(loss.detach())
from torch._dynamo.utils import counters
print("gpu_checks:" + json.dumps({"what": "compile", "losses": [float(v) for v in losses],
                                  "graphs": int(counters["stats"].get("unique_graphs", 0)),
                                  "graph_breaks": int(sum(counters["graph_break"].values()))}))
'''


def check_compile(ctx: Context) -> Result:
    script = ctx.out / "compiled_train.py"
    if not ctx.dry_run:
        script.write_text(COMPILE_SCRIPT)
    plain = run_child(ctx, [sys.executable, str(script), "8"], label="the compiled model alone")
    session, report, error = collect(ctx, "compile_session", "all", script, ["8"],
                                     "the compiled model under the CUPTI collector, op recorder on from the start")
    if plain is None:
        return Result("compile", "skip", "dry run")
    alone = next((r for r in marked(plain.stdout) if r.get("what") == "compile"), None)
    if alone is None:
        return Result("compile", "info", f"torch.compile does not run here even without advisor: {failure_line(plain)}")
    if session is None:
        return Result("compile", "fail", f"under the collector: {error}")
    recorded = next((r for r in marked(report.get("stdout", "")) if r.get("what") == "compile"), None)
    if recorded is None:
        return Result("compile", "fail", "the script printed no losses under the collector")
    a, b = np.asarray(alone["losses"]), np.asarray(recorded["losses"])
    same = a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-3, atol=1e-4))
    shares = attribution_shares(session)
    summary = (f"ran under the op recorder; losses {'match' if same else 'DIFFER'}; Dynamo graphs "
               f"{recorded['graphs']} (without advisor {alone['graphs']}), graph breaks {recorded['graph_breaks']} "
               f"({alone['graph_breaks']}); {shares.get('with_op', 0):.1%} of {shares['kernels']} kernels have an op")
    lines = [f"losses alone {a.round(5).tolist()}", f"losses recorded {b.round(5).tolist()}",
             f"kernels without an op: {shares.get('without_op')}"]
    return Result("compile", "pass" if same else "fail", summary, lines, {"alone": alone, "recorded": recorded,
                                                                           "shares": shares})


# -- (c) cases --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseSpec:
    name: str
    script: str
    args: tuple[str, ...]
    description: str
    must: tuple[str, ...] = ()
    must_not: tuple[str, ...] = ()
    expect: tuple[dict[str, Any], ...] = ()
    source_lines: tuple[str, ...] = ()
    """Text that finds, in the script, each line sync-memcpy-stall must point at (found
    anew each time, so the case follows the script when lines move)."""

    @property
    def command(self) -> str:
        words = ["advisor", "diagnose", "--save", f"cases/{self.name}/session", "--format", "json", "-o", "/dev/null",
                 self.script, *self.args]
        return " ".join(shlex.quote(w) for w in words)


CASES = (
    CaseSpec(
        "gpu_starved_loader", "examples/starved_loader.py", ("--steps", "10"),
        "A small model fed by a Dataset that sleeps 2 ms per sample, read in the main process "
        "(num_workers=0), 32 samples a batch, on a GPU: each step waits about 64 ms on input while "
        "the GPU idles. The advisor must name the data loader, with the idle GPU under it.",
        must=("dataloader-starvation",),
        expect=({"table": "model", "row": "Dataloader", "column": "cpu_ratio", "at_least": 0.8,
                 "why": "2 ms x 32 samples of sleep per batch against well under 10 ms of compute."},),
    ),
    CaseSpec(
        "gpu_host_sync", "examples/host_sync.py", ("--steps", "10"),
        "A small CNN on a GPU whose loop reads values back to the host every step (loss.item(), "
        "logits.argmax(dim=1).cpu() and int(... .sum())), each draining the GPU's queue. The advisor "
        "must point at those three lines.",
        must=("sync-memcpy-stall",), must_not=("dataloader-starvation",),
        # On a GPU all three wait: .item(), the .cpu() copy, and int() of a tensor.
        source_lines=("running_loss += loss.item()", "argmax(dim=1).cpu()", "int((predictions"),
    ),
    CaseSpec(
        "gpu_pageable_copies", "examples/pageable_copies.py", ("--steps", "10"),
        "Each step copies a 7 MB batch from pageable host memory with .to(device) (DataLoader without "
        "pin_memory, no non_blocking); the host waits for each copy and the model is cheap, so the "
        "copies are most of the step. The advisor must flag the pageable copies.",
        must=("sync-memcpy-stall",), must_not=("dataloader-starvation",), source_lines=("# planted:",),
        expect=({"table": "memory", "row": "Memcpy HtoD (Pageable -> Device)", "column": "calls", "at_least": 10,
                 "why": "two pageable copies (images, labels) per step, five recorded steps."},
                {"table": "memory", "row": "Memcpy HtoD (Pageable -> Device)", "column": "host_blocking",
                 "equals": True, "why": "a copy from pageable memory blocks the host."}),
    ),
    CaseSpec(
        "gpu_pageable_copies_pinned", "examples/pageable_copies.py",
        ("--steps", "10", "--pinned", "--num-workers", "2"),
        "The fixed twin of gpu_pageable_copies: DataLoader(pin_memory=True, num_workers=2) and "
        ".to(device, non_blocking=True); the pinning runs in the loader's pin-memory thread. No "
        "copy blocks the host, so the copy finding must be gone, and the loader must not take "
        "its place.",
        must_not=("sync-memcpy-stall", "dataloader-starvation"),
        expect=({"table": "memory", "row": "Memcpy HtoD (Pinned -> Device)", "column": "calls", "at_least": 10,
                 "why": "two pinned copies (images, labels) per step, five recorded steps."},),
    ),
    CaseSpec(
        "gpu_odd_gemm", "examples/odd_gemm.py", ("--steps", "10"),
        "An fp16 MLP on a GPU whose GEMMs have no size a multiple of 8 (batch 60, layers 1000 -> 1023 "
        "-> 1030 -> 10). The advisor must name the misaligned layers and their padded sizes.",
        must=("tensor-core-misalignment",), must_not=("dataloader-starvation", "sync-memcpy-stall"),
    ),
    CaseSpec(
        "gpu_aligned_gemm", "examples/aligned_gemm.py", ("--steps", "10"),
        "The fixed twin of gpu_odd_gemm: every GEMM size padded to a multiple of 8 (batch 64, layers "
        "1000 -> 1024 -> 1032 -> 16). No GEMM may be reported as misaligned.",
        must_not=("tensor-core-misalignment", "dataloader-starvation", "sync-memcpy-stall"),
    ),
    CaseSpec(
        "gpu_small_batch", "examples/small_batch.py", ("--steps", "10"),
        "Twelve residual blocks trained 4 samples at a time on a GPU: a few hundred kernels a step, "
        "each shorter than its launch, so the GPU idles while the host launches. The advisor must "
        "report low GPU utilisation with the idle time under 'launching'.",
        must=("low-gpu-utilization",), must_not=("dataloader-starvation", "sync-memcpy-stall"),
        expect=({"table": "gpu_idle", "row": "launching", "column": "share_of_idle", "at_least": 0.5,
                 "why": "the host is launching kernels for most of the time the GPU idles."},),
    ),
)


def script_has_device_option(script: Path) -> bool:
    return '"--device"' in script.read_text()


def find_lines(script: Path, snippets: tuple[str, ...]) -> list[int]:
    """The numbers of the lines of ``script`` that contain any of ``snippets``."""
    return [number for number, line in enumerate(script.read_text().splitlines(), 1)
            if any(snippet in line for snippet in snippets)]


def flatten(findings: list[Any]) -> list[Any]:
    out = []
    for finding in findings:
        out.append(finding)
        out.extend(flatten(finding.explains))
    return out


def evaluate_case(session: Any, spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The rules that fire on ``session`` ({rule: first finding}) and what of ``spec``
    (a case.yaml's content) the session does not meet, as tests/test_cases.py checks it."""
    from advisor.rules import run_rules
    from advisor.tables import compute_tables

    tables = compute_tables(session)
    fired: dict[str, Any] = {}
    for finding in flatten(run_rules(session, tables).findings):
        fired.setdefault(finding.rule, finding)
    problems = [f"must {r}: did not fire" for r in spec.get("must") or [] if r not in fired]
    problems += [f"must_not {r}: fired" for r in spec.get("must_not") or [] if r in fired]
    for expectation in spec.get("expect") or []:
        if "table" in expectation:
            frame = tables.get(expectation["table"])
            where = f"{expectation['table']}[{expectation['row']}].{expectation['column']}"
            if frame is None or expectation["row"] not in frame.index or expectation["column"] not in frame.columns:
                problems.append(f"{where}: no such row or column")
                continue
            value = frame.loc[expectation["row"], expectation["column"]]
            if ("at_least" in expectation and not value >= expectation["at_least"]) or (
                    "at_most" in expectation and not value <= expectation["at_most"]) or (
                    "equals" in expectation and value != expectation["equals"]):
                problems.append(f"{where} = {value}: expected {expectation}")
        elif "source_line" in expectation:
            finding = fired.get(expectation["finding"])
            lines = {f"{e.file}:{e.line}" for e in finding.evidence if e.kind == "source_line"} if finding else set()
            if expectation["source_line"] not in lines:
                problems.append(f"{expectation['finding']} source_line {expectation['source_line']}: "
                                f"not among {sorted(lines)}")
    return fired, problems


def draft_case(spec: CaseSpec, known_rules: set[str]) -> tuple[dict[str, Any], list[str]]:
    """case.yaml's content for ``spec`` (rules that do not exist yet left out) and the
    comments saying what was left out."""
    comments = []
    must = [r for r in spec.must if r in known_rules]
    must_not = [r for r in spec.must_not if r in known_rules]
    for rule in [r for r in (*spec.must, *spec.must_not) if r not in known_rules]:
        where = "must" if rule in spec.must else "must_not"
        comments.append(f"{rule} is not a rule yet: add it to {where} when it exists.")
    expect = [dict(e) for e in spec.expect]
    if spec.source_lines and "sync-memcpy-stall" in must:
        lines = (REPO / spec.script).read_text().splitlines()
        for number in find_lines(REPO / spec.script, spec.source_lines):
            expect.append({"finding": "sync-memcpy-stall", "source_line": f"{spec.script}:{number}",
                           "why": f"`{lines[number - 1].split('#')[0].strip()}` waits for the GPU, once per step."})
    content: dict[str, Any] = {"description": spec.description, "command": spec.command, "must": must,
                               "must_not": must_not}
    if expect:
        content["expect"] = expect
    return content, comments


def write_case_yaml(path: Path, content: dict[str, Any], header: list[str]) -> None:
    import yaml

    body = yaml.safe_dump(content, sort_keys=False, width=96, allow_unicode=True)
    comments = [wrapped for line in header for wrapped in textwrap.wrap(line, 94, break_long_words=False)]
    text = "".join(f"# {line}\n" for line in comments) + body
    if yaml.safe_load(text) != content:
        raise RuntimeError(f"{path}: the drafted YAML does not read back as written")
    path.write_text(text)


def session_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0


def check_cases(ctx: Context) -> Result:
    from advisor.importers import load
    from advisor.rules import builtin_specs

    known_rules = {s.id for s in builtin_specs()}
    lines: list[str] = []
    data: dict[str, Any] = {}
    failed = False
    for spec in CASES:
        folder = REPO / "cases" / spec.name
        script = REPO / spec.script
        if not script.is_file():
            lines.append(f"{spec.name}: skipped, {spec.script} does not exist")
            continue
        if not script_has_device_option(script):
            lines.append(f"{spec.name}: skipped, {spec.script} has no --device option, so it never uses the GPU; "
                         "give it one (default cuda when available) to record it here")
            continue
        if (folder / "case.yaml").exists() and not ctx.overwrite_cases:
            lines.append(f"{spec.name}: skipped, case.yaml exists (python cases/record.py {spec.name} records it "
                         "again; --overwrite-cases replaces it)")
            continue
        argv = shlex.split(spec.command)
        if ctx.dry_run:
            run_child(ctx, [sys.executable, "-m", "advisor", *argv[1:]], label=spec.name)
            continue
        import shutil

        shutil.rmtree(folder / "session", ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        done = run_child(ctx, [sys.executable, "-m", "advisor", *argv[1:]], label=spec.name)
        if done is None or done.returncode != 0 or not (folder / "session").is_dir():
            lines.append(f"{spec.name}: FAILED to record: {failure_line(done) if done else 'dry run'}")
            failed = True
            continue
        session = load(folder / "session")
        content, comments = draft_case(spec, known_rules)
        fired, problems = evaluate_case(session, content)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        header = [f"DRAFT written by benchmarks/gpu_checks.py on {ctx.device_name}, {stamp}: review by hand,",
                  "then delete these comment lines.", *comments]
        header.append("Fired on this recording: " + (", ".join(
            f"{rule} ({f.severity.value}, {f.saving.ms_per_step:.3f} ms/step, {f.saving.share_of_step:.1%})"
            for rule, f in fired.items()) or "nothing") + ".")
        header += [f"NOT MET on this recording: {p}" for p in problems]
        unlisted = sorted(set(fired) - set(content["must"]) - set(content["must_not"]))
        if unlisted:
            header.append(f"Fired but in neither list (decide): {', '.join(unlisted)}.")
        if not session.meta.collector.gpu_measured:
            header.append("THE GPU WAS NOT MEASURED in this recording: " + "; ".join(session.meta.collector.notes[-1:]))
        size = session_size(folder / "session")
        if size >= 1_000_000:
            header.append(f"The session is {size} bytes, over the 1 MB a case may be: record fewer steps.")
        write_case_yaml(folder / "case.yaml", content, header)
        data[spec.name] = {"fired": sorted(fired), "problems": problems, "bytes": size,
                           "gpu_measured": session.meta.collector.gpu_measured}
        status = "as planted" if not problems else "REVIEW: " + "; ".join(problems)
        lines.append(f"{spec.name}: fired {sorted(fired) or 'nothing'}; {status}; {size // 1024} KiB")
        failed = failed or bool(problems) or not session.meta.collector.gpu_measured
    if ctx.dry_run:
        return Result("cases", "skip", "dry run", lines)
    summary = (f"{len(data)} cases drafted under cases/gpu_*: review each case.yaml, then run "
               "python -m pytest tests/test_cases.py")
    return Result("cases", "fail" if failed else "pass", summary, lines, data)


# -- the children (run as `gpu_checks.py _child ...`) ---------------------------------------------------


def child_collect(argv: list[str]) -> int:
    session_dir, window, script, *args = argv
    from advisor.collect import collect_script
    from advisor.collect.cupti import StepWindow

    run = collect_script(Path(script), args, gpu=True, steps=StepWindow.parse(window))
    run.session.save(session_dir)
    meta = run.session.meta
    print(MARK + json.dumps({"what": "collect", "exit_code": run.exit_code, "collector": meta.collector.name,
                             "gpu_measured": meta.collector.gpu_measured, "notes": meta.collector.notes}), flush=True)
    return 0


def _has(record: Any, dotted: str) -> bool:
    target = record
    try:
        for part in dotted.split("."):
            target = getattr(target, part)
    except AttributeError:
        return False
    return True


# Fields a kind shares with another in cupti_records.SPECS but has not itself: plain
# copies (CUpti_ActivityMemcpy6) carry no device pair, only peer-to-peer ones do.
ABSENT_BY_DESIGN = {rec.KIND_MEMCPY: ("src_device_id", "dst_device_id")}


def field_report(record: Any) -> tuple[str, dict[str, Any]] | None:
    """``KIND/ClassName`` of one activity record and which of the fields advisor copies
    out of its kind (advisor.collect.cupti_records.SPECS) it lacks, or has only under
    another name; None for a record without a readable kind."""
    try:
        kind = int(record.kind)
    except (AttributeError, TypeError, ValueError):  # the store counts these as unreadable
        return None
    missing: list[str] = []
    renamed: dict[str, str] = {}
    absent = []
    spec = rec.SPECS.get(kind)
    for name, candidates, _default in (spec.fields if spec else ()):
        found = next((c for c in candidates if _has(record, c)), None)
        if found is None and name in ABSENT_BY_DESIGN.get(kind, ()):
            absent.append(name)
        elif found is None:
            missing.append(name)
        elif found != name:
            renamed[name] = found
    key = f"{rec.KIND_NAMES.get(kind, kind)}/{type(record).__name__}"
    return key, {"count": 0, "missing": missing, "renamed": renamed, "absent_by_design": absent,
                 "known_kind": spec is not None}


def note_record_types(records: list[Any], types: dict[str, dict[str, Any]]) -> None:
    """Count ``records`` in ``types`` by ``KIND/ClassName``, checking the first record of
    each class for every field advisor reads (cupti-python has one class per record
    version, so one look per class is enough)."""
    for record in records:
        try:
            key = f"{rec.KIND_NAMES.get(int(record.kind), record.kind)}/{type(record).__name__}"
        except (AttributeError, TypeError, ValueError):
            continue
        entry = types.get(key)
        if entry is None:
            report = field_report(record)
            if report is None:
                continue
            entry = types[key] = report[1]
        entry["count"] += 1


def _memset(pointer: int, size: int) -> str | None:
    """cuMemsetD8 through the driver (torch fills with kernels, never a memset); None if
    done, else why not."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        result = driver.cuMemsetD8_v2(ctypes.c_uint64(pointer), ctypes.c_ubyte(0), ctypes.c_size_t(size))
    except (OSError, AttributeError) as exc:
        return str(exc)
    return None if result == 0 else f"cuMemsetD8_v2 returned {result}"


def child_records(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_checks.py _child records")
    parser.add_argument("out", type=Path)
    parser.add_argument("--buffer-bytes", type=int, default=None)
    args = parser.parse_args(argv)
    import torch  # CUDA is not initialised by the import: the collector starts first

    from advisor.collect import cupti as cp

    api, why = cp.import_cupti()
    if api is None:
        args.out.write_text(json.dumps({"error": why}))
        return 2
    collector = cp.CuptiCollector(api, window=None, torch=torch)
    if args.buffer_bytes is not None:
        size = args.buffer_bytes
        collector._buffer_requested = lambda: (size, 0)  # no room: CUPTI has to drop
    types: dict[str, dict[str, Any]] = {}
    add_all = collector.store.add_all

    def inspecting(activities: Any) -> None:
        # Runs inside CUPTI's buffer callback, where the records are valid.
        records = list(activities)
        note_record_types(records, types)
        add_all(records)

    collector.store.add_all = inspecting
    try:
        collector.start()
    except Exception as exc:
        args.out.write_text(json.dumps({"error": f"the collector did not start: {exc}"}))
        return 2

    device = torch.device("cuda")
    host = torch.randn(WORKLOAD_ELEMENTS)
    on_device = host.to(device)  # pageable -> device
    pinned = host.pin_memory()
    also_on_device = pinned.to(device, non_blocking=True)  # pinned -> device, async
    square = torch.randn(512, 512, device=device)
    product = (square @ square).relu_()
    back = (on_device + also_on_device).cpu()  # device -> pageable
    pinned_back = torch.empty(WORKLOAD_ELEMENTS, pin_memory=True)
    pinned_back.copy_(on_device, non_blocking=True)  # device -> pinned, async
    memset_error = _memset(on_device.data_ptr(), on_device.numel() * 4)
    torch.cuda.current_stream().synchronize()  # Stream Sync
    event = torch.cuda.Event()
    event.record()
    event.synchronize()  # Event Sync
    side = torch.cuda.Stream()
    side.wait_event(event)  # Stream Wait Event
    with torch.cuda.stream(side):
        product.mul_(2)
    torch.cuda.nvtx.range_push("gpu_checks.range")
    product.add_(1)
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.mark("gpu_checks.mark")
    torch.cuda.synchronize()  # Context Sync
    del back

    capture = collector.stop()
    dropped = ctypes.c_size_t(0)
    try:
        api.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        dropped_read = {"readable": True, "value": int(dropped.value)}
    except Exception as exc:
        dropped_read = {"readable": False, "error": f"{type(exc).__name__}: {exc}"}

    from advisor.session import text

    events = capture.events
    kind = text(events["kind"])
    names = text(events["name"])
    copies: dict[str, dict[str, Any]] = {}
    for index in np.flatnonzero(kind == "memcpy"):
        entry = copies.setdefault(names[index], {"bytes": [], "category": str(events["category"].iloc[index])})
        entry["bytes"].append(int(events["bytes"].iloc[index]))
    kernels = events[kind == "kernel"]
    kernel_names = text(kernels["name"])
    mangled = [n for n in kernel_names if n.startswith("_Z")]
    geometry_ok = (text(kernels["grid"]) != "") & (text(kernels["block"]) != "") & (kernels["registers"].to_numpy() > 0)
    markers = events[np.char.startswith(text(events["category"]).astype(str), "cupti:MARKER")]
    report = {
        "record_types": types,
        "memset_issued": memset_error is None,
        "memset_error": memset_error,
        "copies": copies,
        "syncs": sorted(set(names[kind == "sync"])),
        "kernels": {"count": len(kernels), "mangled": len(mangled), "mangled_example": mangled[:1],
                    "bad_geometry": int((~geometry_ok).sum()),
                    "with_op": float((kernels["parent_op"].to_numpy() >= 0).mean()) if len(kernels) else 0.0},
        "nvtx": {"rows": len(markers), "names": sorted(set(text(markers["name"]))),
                 "unpaired_note": next((n for n in capture.collector.notes if "NVTX" in n), "")},
        "devices": [d.model_dump() for d in capture.devices],
        "clock_offset_ns": capture.clock_offset_ns,
        "clock_error_ns": capture.clock_error_ns,
        "dropped_read": dropped_read,
        "collector_dropped": capture.collector.dropped_records,
        "enum_problems": rec.check_enums(api),
        "overhead_ns": capture.collector.overhead_ns,
        "notes": capture.collector.notes,
        "store": {"unreadable": collector.store.unreadable, "ignored": {str(k): v for k, v in collector.store.ignored.items()},
                  "callback_errors": collector.callback_errors},
    }
    args.out.write_text(json.dumps(report, indent=2, default=str))
    return 0


# -- the command ------------------------------------------------------------------------------------------


def parse_window(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not match or int(match[1]) < 1 or int(match[2]) <= int(match[1]):
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B with 1 <= A < B, e.g. 2:7")
    return int(match[1]), int(match[2])


def parse_checks(text: str) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CHECKS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown checks {unknown or text!r}; choose from {', '.join(CHECKS)}")
    return chosen


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu_checks.py", description=__doc__.splitlines()[0],
        epilog="Checks: " + ", ".join(CHECKS) + " (the module docstring says what each one does).")
    parser.add_argument("--only", type=parse_checks, default=list(CHECKS), metavar="CHECK,...",
                        help="run only these checks (default: all)")
    parser.add_argument("--steps", type=parse_window, default=(2, 7), metavar="A:B",
                        help="the steps the loop records (default 2:7, the collector's own default)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for sessions, traces and results.json (default: a new temporary folder)")
    parser.add_argument("--overwrite-cases", action="store_true",
                        help="re-record cases/gpu_* whose case.yaml exists, replacing it with a new draft")
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S, help="seconds allowed per program")
    parser.add_argument("--bundle", type=Path, default=None, metavar="FILE.tar.gz",
                        help="also pack results.json, the JSON reports and the drafted cases/gpu_* folders into "
                             "one archive (for a device machine that returns a few files only)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing (any machine)")
    return parser


def why_not_here() -> str | None:
    """One line saying why this machine cannot run the checks; None when it can."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc}); these checks need a CUDA build of torch"
    from advisor.collect import cupti

    if not getattr(torch.version, "cuda", None):
        return (f"torch {torch.__version__} is built without CUDA, so there is no GPU to check: run "
                "`python benchmarks/gpu_checks.py` on a machine with an NVIDIA GPU, a CUDA torch and "
                f"cupti-python ({cupti.INSTALL_HINT}); --dry-run shows what it would run")
    if not torch.cuda.is_available():
        return (f"no CUDA device is visible (torch {torch.__version__}, CUDA {torch.version.cuda}): these checks "
                "need an NVIDIA GPU; --dry-run shows what they would run")
    reason = cupti.unavailable_reason(torch)
    if reason is not None:
        return f"the CUPTI collector cannot run here: {reason}"
    return None


def write_bundle(path: Path, out: Path, cases: list[str]) -> None:
    """One archive of what a reviewer needs: gpu_checks/*.json (results and the workload
    reports) and cases/<name>/ for each drafted case, laid out as in the repository."""
    import tarfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for report in sorted(out.glob("*.json")):
            if report.name != "torch_profiler_trace.json":
                archive.add(report, arcname=f"gpu_checks/{report.name}")
        for name in cases:
            folder = REPO / "cases" / name
            if folder.is_dir():
                archive.add(folder, arcname=f"cases/{name}")


def render(results: list[Result]) -> str:
    out = []
    for result in results:
        out.append(f"[{result.status.upper():4}] {result.check}: {result.summary}")
        out.extend(f"        {line}" for line in result.lines)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        children = {"collect": child_collect, "records": child_records}
        if len(argv) < 2 or argv[1] not in children:
            print(f"gpu_checks: _child needs one of {', '.join(children)}", file=sys.stderr)
            return 2
        return children[argv[1]](argv[2:])
    args = build_parser().parse_args(argv)
    if not args.dry_run:
        reason = why_not_here()
        if reason is not None:
            print(f"gpu_checks: {reason}", file=sys.stderr)
            return 2
    if args.dry_run:
        out = args.out or Path(tempfile.gettempdir()) / "gpu_checks-XXXX"
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="gpu_checks-"))
        out.mkdir(parents=True, exist_ok=True)
    ctx = Context(out=out.resolve(), window=args.steps, dry_run=args.dry_run, overwrite_cases=args.overwrite_cases,
                  timeout_s=args.timeout)
    if not args.dry_run:
        import torch

        ctx.device_name = torch.cuda.get_device_name(0)
        print(f"gpu_checks: {ctx.device_name}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
              f"output in {out}", file=sys.stderr)
    functions = {"attribution": check_attribution, "clock": check_clock, "kernels": check_kernels,
                 "records": check_records, "nvtx": check_nvtx, "drops": check_drops, "compile": check_compile,
                 "cases": check_cases}
    results = []
    for name in [c for c in CHECKS if c in args.only]:
        if args.dry_run:
            print(f"{name}:")
        began = time.perf_counter()
        try:
            result = functions[name](ctx)
        except Exception as exc:  # one broken check must not hide the others' results
            result = Result(name, "fail", f"the check itself failed: {type(exc).__name__}: {_short(str(exc))}")
        result.data["seconds"] = round(time.perf_counter() - began, 1)
        results.append(result)
        if args.dry_run:
            print("".join(f"  {line}\n" for line in result.lines), end="")
    if args.dry_run:
        return 0
    print(render(results))
    (out / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))
    print(f"gpu_checks: results in {out / 'results.json'}", file=sys.stderr)
    if args.bundle:
        drafted = next((sorted(r.data) for r in results if r.check == "cases"), [])
        write_bundle(args.bundle, out, [name for name in drafted if name != "seconds"])
        print(f"gpu_checks: bundle in {args.bundle} (tar xzf it in the repository root to add the cases)",
              file=sys.stderr)
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
