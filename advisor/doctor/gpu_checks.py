"""The collector checks that need a GPU: `advisor doctor --gpu-checks`.

The CUPTI collector (advisor.collect.cupti) is unit-tested on replayed activity streams;
what only real hardware shows is checked here, on the user's own GPU, each program in a
fresh process so CUPTI has one user at a time:

attribution  A real training loop (advisor.doctor.loop: a CNN fed by a DataLoader, on
             cuda) under ``collect_script(gpu=True, steps=A:B)``: the share of kernels
             tied to an op (parent_op >= 0) and to a phase (Dataloader, Forward,
             Backward, Optimization); target >= 99% each. The steps recorded must be A..B-1.
clock        On the same session: no GPU activity starts before the call that launched it,
             and the runtime/driver calls an op made (external correlation) lie inside the
             op's host time range, i.e. CUPTI's clock and the host's line up.
kernels      The same loop (at a batch that keeps the GPU busy) under torch.profiler for
             the same steps, twice (an A/A run: the reference's own run-to-run spread),
             read with advisor.importers.load. Exact: the kernel names, their calls per
             step and their grid/block shapes. Within 2%: the total kernel time. Per
             kernel name above 1% of the total: advisor's time against the first
             reference within the larger of 2% and twice the A/A spread of that kernel.
             The reference trace is kept in the bundle (gzipped).
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
compile      A torch.compile'd model trained under the CUPTI collector twice: with its
             first compiled call inside the recorded steps (``--steps all``) and before
             them (the default window). Each must compile the graphs a run without
             advisor compiles, record Triton kernels tied to an op or to the compiled
             region that launched them, match the run without advisor's losses, and say
             in its notes which steps compiled.

A check also fails where the session's notes contradict the steps it recorded.

The children are ``python -m advisor.doctor.children ...`` and ``python -m
advisor.doctor.loop ...``; everything they write goes to the output folder
(results.json, the sessions, the torch.profiler trace). Each program gets a timeout
(240 s by default), so a hung one cannot eat the whole run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "CHECKS",
    "Context",
    "KernelComparison",
    "Result",
    "attribution_shares",
    "clock_consistency",
    "compare_kernel_times",
    "kernel_totals",
    "render",
    "run_checks",
    "why_not_here",
    "write_bundle",
    "write_results",
]

MARK = "advisor-doctor:"  # prefix of the JSON lines the children print
PHASES = ("Dataloader", "Forward", "Backward", "Optimization")
ATTRIBUTION_TARGET = 0.99
KERNEL_TOLERANCE = 0.02  # the total, and the floor of each kernel's tolerance
AA_FACTOR = 2.0  # a kernel may differ by this many times the reference's own run-to-run spread
KERNEL_MIN_SHARE = 0.01
BUSY_BATCH = 512  # the loop's batch in the checks: enough work that the GPU, not the host, sets the pace
CLOCK_TOLERANCE_NS = 2_000
CLOCK_OFFSET_LIMIT_NS = 1_000_000  # the collector's own threshold for a note
CHILD_TIMEOUT_S = 240  # a hung child must not eat a GPU session's time
CHECKS = ("attribution", "clock", "kernels", "records", "nvtx", "drops", "compile")
LOOP = ("-m", "advisor.doctor.loop")
CHILDREN = ("-m", "advisor.doctor.children")


# -- comparing sessions (pure functions of Sessions) ----------------------------------------------


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
                         tolerance: float = KERNEL_TOLERANCE, spread: pd.Series | None = None) -> KernelComparison:
    """Compare per-kernel-name total GPU time of two sessions of the same program and
    steps (advisor's CUPTI collector against torch.profiler's trace). A kernel counts when
    it is at least ``min_share`` of either session's kernel time; it agrees when its
    totals differ by at most the larger of ``tolerance`` and ``AA_FACTOR`` times its
    ``spread`` (the reference's own run-to-run relative difference for that kernel, from
    an A/A run), of the reference's. A kernel missing from one side is an infinite
    difference (a naming disagreement shows up that way too)."""
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
    aa = spread.reindex(rows.index).fillna(0.0).abs() if spread is not None else pd.Series(0.0, index=rows.index)
    rows["aa_spread"] = aa.replace([np.inf], np.nan).fillna(0.0)
    rows["tolerance"] = np.maximum(tolerance, AA_FACTOR * rows["aa_spread"])
    rows["checked"] = rows["share"] >= min_share
    rows["within"] = rows["rel_diff"].abs() <= rows["tolerance"]
    return KernelComparison(rows.sort_values("share", ascending=False), tolerance, min_share, advisor_total,
                            reference_total)


def aa_spread(first: Any, second: Any, *, steps: Any = None) -> pd.Series:
    """Each kernel name's relative difference in total time between two runs of the same
    reference (an A/A run): the noise a per-kernel comparison is judged against."""
    a, b = kernel_totals(first, steps)["total_ns"], kernel_totals(second, steps)["total_ns"]
    both = pd.concat([a, b], axis=1, keys=["a", "b"]).fillna(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((both["b"] - both["a"]) / both["a"]).replace([np.inf, -np.inf], np.nan).fillna(1.0).abs()


def kernel_shapes(session: Any, steps: Any) -> pd.DataFrame:
    """Per kernel name: calls per step (the median over ``steps``) and its (grid, block) shapes."""
    from advisor.session import text

    kernels = _kernels(session, steps)
    steps = list(steps)
    if not len(kernels):
        return pd.DataFrame(columns=["calls_per_step", "shapes"])
    frame = pd.DataFrame({"name": text(kernels["name"]), "step": kernels["step"].to_numpy(),
                          "shape": [f"{g}/{b}" for g, b in zip(text(kernels["grid"]), text(kernels["block"]))]})
    per_step = frame.groupby(["name", "step"]).size().unstack(fill_value=0).reindex(columns=steps, fill_value=0)
    return pd.DataFrame({"calls_per_step": per_step.median(axis=1),
                         "shapes": frame.groupby("name")["shape"].agg(lambda s: tuple(sorted(set(s))))})


def compare_kernel_shapes(advisor: Any, reference: Any, *, steps: Any) -> list[str]:
    """What must be exact between the two sessions, as lines naming each disagreement
    (none: they agree): the kernel names, each one's calls per step, its grid/block shapes."""
    mine, theirs = kernel_shapes(advisor, steps), kernel_shapes(reference, steps)
    out = [f"only advisor records {name[:100]}" for name in sorted(set(mine.index) - set(theirs.index))]
    out += [f"only torch.profiler records {name[:100]}" for name in sorted(set(theirs.index) - set(mine.index))]
    for name in sorted(set(mine.index) & set(theirs.index)):
        a, b = mine.loc[name], theirs.loc[name]
        if a["calls_per_step"] != b["calls_per_step"]:
            out.append(f"{name[:100]}: {a['calls_per_step']:g} calls a step, torch.profiler {b['calls_per_step']:g}")
        if a["shapes"] != b["shapes"]:
            out.append(f"{name[:100]}: grid/block {list(a['shapes'])[:4]}, torch.profiler {list(b['shapes'])[:4]}")
    return out


def notes_against_steps(session: Any) -> list[str]:
    """The collector's notes that contradict the steps the session holds (a note that no
    step was recorded, in a session with recorded steps)."""
    recorded = [t.step for t in session.meta.timed_steps if t.recorded] or list(session.steps()["step"])
    if not recorded:
        return []
    return [note for note in session.meta.collector.notes if note.startswith("no step in ")]


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
    timeout_s: float = CHILD_TIMEOUT_S
    device_name: str = "a GPU"
    sessions: dict[str, Any] = field(default_factory=dict)

    @property
    def loop_steps(self) -> int:
        return self.window[1] + 2  # past the window: the collector closes it there

    def loop_args(self) -> list[str]:
        return ["--device", "cuda", "--steps", str(self.loop_steps), "--batch-size", str(BUSY_BATCH)]


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_child(ctx: Context, command: list[str], *, env: dict[str, str] | None = None,
              label: str = "") -> subprocess.CompletedProcess | None:
    """Run one program in the output folder; None (and a line saying what) in a dry run."""
    shown = " ".join(shlex.quote(c) for c in command)
    if env:
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shown
    if ctx.dry_run:
        print(f"  would run{f' ({label})' if label else ''}: {shown}")
        return None
    print(f"advisor doctor: {label or 'running'}: {shown}", file=sys.stderr, flush=True)
    try:
        return subprocess.run(command, check=False, capture_output=True, text=True, cwd=ctx.out, timeout=ctx.timeout_s,
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
    return [sys.executable, *CHILDREN, "collect", str(session_dir), window, str(script), *args]


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
        from advisor.doctor import loop

        ctx.sessions["loop"] = collect(ctx, "loop_session", f"{start}:{stop}", Path(loop.__file__), ctx.loop_args(),
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
    contradicting = notes_against_steps(session)
    lines.extend(f"a note contradicts the recorded steps: {n}" for n in contradicting)
    ok = (shares["kernels"] > 0 and shares["with_op"] >= ATTRIBUTION_TARGET
          and shares["with_phase"] >= ATTRIBUTION_TARGET and steps == wanted and not contradicting)
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
    start, stop = ctx.window
    traces = [ctx.out / "torch_profiler_trace.json", ctx.out / "torch_profiler_trace_aa.json"]
    runs = [run_child(ctx, [sys.executable, *LOOP, *ctx.loop_args(), "--torch-profiler", f"{start}:{stop}",
                            "--trace", str(trace)], label=f"the loop under torch.profiler ({label})")
            for trace, label in zip(traces, ("reference", "its A/A twin"))]
    if runs[0] is None:
        return Result("kernels", "skip", "dry run")
    if session is None:
        return Result("kernels", "fail", f"no advisor session: {error}")
    for done, trace in zip(runs, traces):
        if done is None or done.returncode != 0 or not trace.is_file():
            return Result("kernels", "fail", f"torch.profiler run failed: {failure_line(done)}")
    keep_gzipped(traces[0])
    reference, twin = load(traces[0]), load(traces[1])
    steps = range(start, stop)
    spread = aa_spread(reference, twin, steps=steps)
    comparison = compare_kernel_times(session, reference, steps=steps, spread=spread)
    exact = compare_kernel_shapes(session, reference, steps=steps)
    total_diff = abs(comparison.advisor_total_ns - comparison.reference_total_ns) / max(comparison.reference_total_ns, 1)
    offenders = comparison.offenders
    ok = comparison.ok and not exact and total_diff <= KERNEL_TOLERANCE
    summary = (f"names, calls a step and grid/block {'exact' if not exact else f'differ in {len(exact)} ways'}; "
               f"totals advisor {comparison.advisor_total_ns / 1e6:.3f} ms, torch.profiler "
               f"{comparison.reference_total_ns / 1e6:.3f} ms ({total_diff:+.1%}, within {KERNEL_TOLERANCE:.0%}: "
               f"{'yes' if total_diff <= KERNEL_TOLERANCE else 'NO'}); {int(comparison.rows['checked'].sum())} kernels "
               f"above {KERNEL_MIN_SHARE:.0%} checked against max({KERNEL_TOLERANCE:.0%}, {AA_FACTOR:g}x the A/A "
               f"spread), {len(offenders)} outside")
    data = {"advisor_total_ns": comparison.advisor_total_ns, "reference_total_ns": comparison.reference_total_ns,
            "total_rel_diff": total_diff, "exact_differences": exact,
            "aa_median_spread": float(spread.median()) if len(spread) else None,
            "rows": json.loads(comparison.rows.replace([np.inf, -np.inf], None).reset_index().to_json(orient="records"))}
    return Result("kernels", "pass" if ok else "fail", summary, [*exact[:20], *comparison.lines()], data)


def keep_gzipped(path: Path) -> Path:
    """``path`` gzipped beside it (the bundle carries the .gz, not the large original)."""
    import gzip
    import shutil

    target = path.with_name(path.name + ".gz")
    with open(path, "rb") as source, gzip.open(target, "wb") as out:
        shutil.copyfileobj(source, out)
    return target


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
    command = [sys.executable, *CHILDREN, "records", str(out_json)]
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
    ok = "advisor-doctor.range" in ranges["names"] and "advisor-doctor.mark" in ranges["names"]
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
"""advisor doctor: a torch.compile'd MLP trained a few steps; prints its losses."""
import json
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
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
print("advisor-doctor:" + json.dumps({"what": "compile", "losses": [float(v) for v in losses],
                                  "graphs": int(counters["stats"].get("unique_graphs", 0)),
                                  "graph_breaks": int(sum(counters["graph_break"].values()))}))
'''


COMPILE_STEPS = 10  # past the default window (2:7), which closes at step 7


def compiled_kernels(session: Any) -> dict[str, Any]:
    """The Triton kernels a session recorded, and the share tied to an op (an ATen op, or
    the compiled region that launched them)."""
    from advisor.session import text

    kernels = _kernels(session)
    triton = np.char.startswith(text(kernels["name"]).astype(str), "triton_") if len(kernels) else np.zeros(0, bool)
    tied = kernels["parent_op"].to_numpy()[triton] >= 0 if len(kernels) else np.zeros(0, bool)
    return {"kernels": int(len(kernels)), "triton": int(triton.sum()),
            "triton_with_op": float(tied.mean()) if len(tied) else 0.0}


def check_compile(ctx: Context) -> Result:
    script = ctx.out / "compiled_train.py"
    if not ctx.dry_run:
        script.write_text(COMPILE_SCRIPT)
    steps = str(COMPILE_STEPS)
    plain = run_child(ctx, [sys.executable, str(script), steps], label="the compiled model alone")
    windows = {"all": "every step recorded: the first compiled call inside the window",
               f"{ctx.window[0]}:{ctx.window[1]}": "the window after the compilation"}
    runs = {window: collect(ctx, f"compile_session_{i}", window, script, [steps],
                            f"the compiled model under the CUPTI collector ({what})")
            for i, (window, what) in enumerate(windows.items())}
    if plain is None:
        return Result("compile", "skip", "dry run")
    alone = next((r for r in marked(plain.stdout) if r.get("what") == "compile"), None)
    if alone is None:
        return Result("compile", "info", f"torch.compile does not run here even without advisor: {failure_line(plain)}")
    lines, data, failed = [f"without advisor: {alone['graphs']} graphs, losses {np.round(alone['losses'], 5).tolist()}"], \
        {"alone": alone}, []
    for window, (session, report, error) in runs.items():
        if session is None:
            failed.append(f"--steps {window}: {error}")
            continue
        recorded = next((r for r in marked(report.get("stdout", "")) if r.get("what") == "compile"), None)
        if recorded is None:
            failed.append(f"--steps {window}: the script printed nothing under the collector")
            continue
        a, b = np.asarray(alone["losses"]), np.asarray(recorded["losses"])
        same = a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-3, atol=1e-4))
        found = compiled_kernels(session)
        said = [n for n in session.meta.collector.notes if "torch.compile compiled" in n]
        problems = []
        if recorded["graphs"] != alone["graphs"]:
            problems.append(f"{recorded['graphs']} Dynamo graphs, {alone['graphs']} without advisor")
        if not found["triton"]:
            problems.append("no Triton kernel recorded")
        elif found["triton_with_op"] < ATTRIBUTION_TARGET:
            problems.append(f"{found['triton_with_op']:.1%} of Triton kernels tied to an op or compiled region")
        if not same:
            problems.append("losses differ from the run without advisor")
        if not said:
            problems.append("no note says which steps compiled")
        lines.append(f"--steps {window}: {recorded['graphs']} graphs, {found['triton']} Triton kernels of "
                     f"{found['kernels']} ({found['triton_with_op']:.1%} tied to an op), losses "
                     f"{'match' if same else 'DIFFER'}; {said[0] if said else 'no compile note'}")
        failed.extend(f"--steps {window}: {p}" for p in problems)
        data[window] = {"recorded": recorded, "kernels": found, "notes": said}
    summary = ("compiled code stays compiled under the collector in both windows: same graphs, Triton kernels "
               "recorded and tied, losses match" if not failed else "; ".join(failed))
    return Result("compile", "fail" if failed else "pass", summary, lines, data)


# -- running them -------------------------------------------------------------------------------------


def why_not_here() -> str | None:
    """One line saying why this machine cannot run the checks; None when it can."""
    from advisor.collect import cupti
    from advisor.collect.torch_hooks import import_torch

    torch, why = import_torch()
    if torch is None:
        return f"torch is not importable ({why}); these checks need a CUDA build of torch"
    if not getattr(torch.version, "cuda", None):
        return (f"torch {torch.__version__} is built without CUDA, so there is no GPU to check: run them on a "
                f"machine with an NVIDIA GPU, a CUDA build of torch and cupti-python ({cupti.INSTALL_HINT}); "
                "--dry-run shows what they would run")
    if not torch.cuda.is_available():
        return (f"no CUDA device is visible (torch {torch.__version__}, CUDA {torch.version.cuda}): these checks "
                "need an NVIDIA GPU; --dry-run shows what they would run")
    reason = cupti.unavailable_reason(torch)
    if reason is not None:
        return f"the CUPTI collector cannot run here: {reason}"
    return None


def run_checks(ctx: Context, only: list[str] | None = None) -> list[Result]:
    """Run the checks (all of CHECKS, or ``only`` those, in CHECKS' order). In a dry run
    each prints what it would run. A check that raises is a failed check, never the end
    of the others."""
    import time

    functions = {"attribution": check_attribution, "clock": check_clock, "kernels": check_kernels,
                 "records": check_records, "nvtx": check_nvtx, "drops": check_drops, "compile": check_compile}
    results = []
    for name in [c for c in CHECKS if only is None or c in only]:
        if ctx.dry_run:
            print(f"{name}:")
        began = time.perf_counter()
        try:
            result = functions[name](ctx)
        except Exception as exc:  # noqa: BLE001  (one broken check must not hide the others' results)
            result = Result(name, "fail", f"the check itself failed: {type(exc).__name__}: {_short(str(exc))}")
        result.data["seconds"] = round(time.perf_counter() - began, 1)
        results.append(result)
        if ctx.dry_run:
            print("".join(f"  {line}\n" for line in result.lines), end="")
    return results


def write_results(ctx: Context, results: list[Result]) -> Path:
    """results.json in the output folder: every check with its figures."""
    path = ctx.out / "results.json"
    path.write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))
    return path


def write_bundle(path: Path, out: Path, extra: dict[str, Path] | None = None) -> None:
    """One archive of what a reviewer needs: doctor/*.json (results and the workload
    reports), the reference torch.profiler trace gzipped (not the A/A twin, nor the trace
    uncompressed) and any ``extra`` folders under the names given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for report in sorted([*out.glob("*.json"), *out.glob("*.json.gz")]):
            if not report.name.startswith("torch_profiler_trace") or report.name == "torch_profiler_trace.json.gz":
                archive.add(report, arcname=f"doctor/{report.name}")
        for name, folder in (extra or {}).items():
            if folder.is_dir():
                archive.add(folder, arcname=name)


def render(results: list[Result]) -> str:
    """The results in words, a line each and their details indented."""
    out = []
    for result in results:
        out.append(f"[{result.status.upper():4}] {result.check}: {result.summary}")
        out.extend(f"        {line}" for line in result.lines)
    return "\n".join(out)
