"""Record the GPU cases and draft their case.yaml, on a machine with a GPU.

For each example with a planted problem (and the fixed twins of two of them:
pageable_copies --pinned, aligned_gemm), this runs ``advisor diagnose --save
cases/gpu_<name>/session ...`` from the repository root and drafts a case.yaml
(cases/README.md's format) with must / must_not / expect from what was planted, and a
header saying what fired on this recording: REVIEW IT BY HAND before committing. A case
whose case.yaml exists is left alone (``python cases/record.py NAME`` records it again);
``--overwrite`` replaces it.

    python cases/draft_gpu_cases.py                  # every GPU case not recorded yet
    python cases/draft_gpu_cases.py --dry-run        # the commands, on any machine
    python cases/draft_gpu_cases.py --bundle cases.tar.gz   # the drafted folders in one archive

This is a developer's tool for this repository (the cases are its test data), not part
of advisor: `advisor doctor --gpu-checks` checks the collector on a user's GPU.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CASES_DIR = Path(__file__).resolve().parent
REPO = CASES_DIR.parent
TIMEOUT_S = 240


@dataclass
class Context:
    dry_run: bool = False
    overwrite: bool = False
    timeout_s: float = TIMEOUT_S
    device_name: str = "a GPU"
    commands: list[str] = field(default_factory=list)


def run_child(ctx: Context, command: list[str], *, label: str = "") -> subprocess.CompletedProcess | None:
    """Run one command from the repository root; None (and the command noted) in a dry run."""
    shown = " ".join(shlex.quote(c) for c in command)
    if ctx.dry_run:
        ctx.commands.append(shown)
        print(f"  would run{f' ({label})' if label else ''}: {shown}")
        return None
    print(f"draft_gpu_cases: {label or 'running'}: {shown}", file=sys.stderr, flush=True)
    try:
        return subprocess.run(command, check=False, capture_output=True, text=True, cwd=REPO, timeout=ctx.timeout_s)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"timed out after {ctx.timeout_s:.0f} s")


def failure_line(done: subprocess.CompletedProcess) -> str:
    tail = (done.stderr or done.stdout or "").strip().splitlines()
    return f"exit {done.returncode}: {tail[-1][:300] if tail else 'no output'}"


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
        "gpu_starved_loader", "examples/starved_loader.py", ("--steps", "12"),
        "A small model fed by a Dataset that sleeps 2 ms per sample, read in the main process "
        "(num_workers=0), 32 samples a batch, on a GPU: each step waits about 64 ms on input while "
        "the GPU idles. The advisor must name the data loader, with the idle GPU under it.",
        must=("dataloader-starvation",),
        expect=({"table": "model", "row": "Dataloader", "column": "cpu_ratio", "at_least": 0.8,
                 "why": "2 ms x 32 samples of sleep per batch against well under 10 ms of compute."},),
    ),
    CaseSpec(
        "gpu_host_sync", "examples/host_sync.py", ("--steps", "12"),
        "A small CNN on a GPU whose loop reads values back to the host every step (loss.item(), "
        "logits.argmax(dim=1).cpu() and int(... .sum())), each draining the GPU's queue. The advisor "
        "must point at those three lines.",
        must=("sync-memcpy-stall",), must_not=("dataloader-starvation",),
        # On a GPU all three wait: .item(), the .cpu() copy, and int() of a tensor.
        source_lines=("running_loss += loss.item()", "argmax(dim=1).cpu()", "int((predictions"),
    ),
    CaseSpec(
        "gpu_pageable_copies", "examples/pageable_copies.py", ("--steps", "12"),
        "Each step copies a 7 MB batch from pageable host memory with .to(device) (DataLoader without "
        "pin_memory, no non_blocking); the host waits for each copy and the model is cheap, so the "
        "copies are most of the step. The advisor must flag the pageable copies.",
        must=("sync-memcpy-stall",), must_not=("dataloader-starvation", "host-bound"), source_lines=("# planted:",),
        expect=({"table": "memory", "row": "Memcpy HtoD (Pageable -> Device)", "column": "calls", "at_least": 10,
                 "why": "two pageable copies (images, labels) per step, five recorded steps."},
                {"table": "memory", "row": "Memcpy HtoD (Pageable -> Device)", "column": "host_blocking",
                 "equals": True, "why": "a copy from pageable memory blocks the host."}),
    ),
    CaseSpec(
        "gpu_pageable_copies_pinned", "examples/pageable_copies.py",
        ("--steps", "12", "--pinned", "--num-workers", "2"),
        "The fixed twin of gpu_pageable_copies: DataLoader(pin_memory=True, num_workers=2) and "
        ".to(device, non_blocking=True); the pinning runs in the loader's pin-memory thread. No "
        "copy blocks the host, so the copy finding must be gone, and the loader must not take "
        "its place.",
        must_not=("sync-memcpy-stall", "dataloader-starvation", "host-bound"),
        expect=({"table": "memory", "row": "Memcpy HtoD (Pinned -> Device)", "column": "calls", "at_least": 8,
                 "why": "two pinned copies (images, labels) per step, at least four steady steps."},),
    ),
    CaseSpec(
        "gpu_odd_gemm", "examples/odd_gemm.py", ("--steps", "12"),
        "An fp16 MLP on a GPU whose GEMMs have no size a multiple of 8 (batch 60, layers 1000 -> 1023 "
        "-> 1030 -> 10). The advisor must name the misaligned layers and their padded sizes.",
        # The misaligned fp16 GEMMs also run far below their tensor-core roofline.
        must=("tensor-core-misalignment", "below-roofline"), must_not=("sync-memcpy-stall", "host-bound"),
    ),
    CaseSpec(
        "gpu_aligned_gemm", "examples/aligned_gemm.py", ("--steps", "12"),
        "The fixed twin of gpu_odd_gemm: every GEMM size padded to a multiple of 8 (batch 64, layers "
        "1000 -> 1024 -> 1032 -> 16). No GEMM may be reported as misaligned.",
        must_not=("tensor-core-misalignment", "sync-memcpy-stall", "host-bound"),
    ),
    CaseSpec(
        "gpu_small_batch", "examples/small_batch.py", ("--steps", "12"),
        "Twelve residual blocks trained 4 samples at a time on a GPU: a few hundred kernels a step, "
        "each shorter than its launch, so the GPU idles while the host launches. The advisor must "
        "name launch overhead as the cause, with low GPU utilisation under it and the idle time under "
        "'launching'.",
        must=("launch-bound", "low-gpu-utilization"),
        must_not=("dataloader-starvation", "sync-memcpy-stall", "host-bound"),
    ),
    CaseSpec(
        "gpu_per_parameter_optimizer", "examples/per_parameter_optimizer.py", ("--steps", "12"),
        "Thirty Linear + LayerNorm blocks (122 parameters) trained with SGD(foreach=False) and "
        "zero_grad(set_to_none=False) on a GPU: each step updates and zeroes the parameters one at a "
        "time, a few kernels each. The advisor must name both, from the optimizer table.",
        must=("optimizer-not-fused", "grad-zeroing-memsets"), must_not=("dataloader-starvation", "host-bound"),
        expect=({"table": "optimizer", "row": "Optimizer.step#SGD.step", "column": "ops_per_step", "at_least": 240,
                 "why": "single-tensor SGD with momentum and weight decay runs two or more operators per parameter."},
                {"table": "optimizer", "row": "Optimizer.zero_grad#SGD.zero_grad", "column": "zero_ops_per_step",
                 "at_least": 122, "why": "one aten::zero_ per parameter."}),
    ),
    CaseSpec(
        "gpu_per_parameter_optimizer_fixed", "examples/per_parameter_optimizer.py", ("--steps", "12", "--fixed"),
        "The fixed twin of gpu_per_parameter_optimizer: SGD(foreach=True) and zero_grad(set_to_none=True). "
        "Neither optimizer finding may fire.",
        must_not=("optimizer-not-fused", "grad-zeroing-memsets"),
    ),
    CaseSpec(
        "gpu_host_made_tensors", "examples/host_made_tensors.py", ("--steps", "12"),
        "A denoising MLP on a GPU that draws its noise with torch.randn(shape).to(device) and its "
        "positions with torch.arange(n).to(device) every step: both made in host memory and copied "
        "from pageable memory. The advisor must name both lines.",
        must=("cpu-tensor-copied-each-step",), must_not=("dataloader-starvation",),
        source_lines=("# planted: made on the host", "# planted: the same positions"),
    ),
    CaseSpec(
        "gpu_host_made_tensors_fixed", "examples/host_made_tensors.py", ("--steps", "12", "--fixed"),
        "The fixed twin of gpu_host_made_tensors: noise and positions made on the device. No copy "
        "finding may fire.",
        must_not=("cpu-tensor-copied-each-step", "sync-memcpy-stall"),
    ),
    CaseSpec(
        "gpu_conv_bias_bn", "examples/conv_bias_bn.py", ("--steps", "12"),
        "A small CNN on a GPU whose three Conv2d layers keep bias=True before a BatchNorm2d each. The "
        "advisor must name them, with a time from the GPU's memory bandwidth.",
        must=("conv-bias-before-batchnorm",), must_not=("dataloader-starvation",),
    ),
    CaseSpec(
        "gpu_allreduce_after_backward", "examples/allreduce_after_backward.py", ("--steps", "12"),
        "A 13-layer MLP on a GPU in a one-rank NCCL group that all-reduces each gradient by hand after "
        "backward: 26 collectives a step with no computation left to hide them. The advisor must name "
        "the communication that runs alone.",
        must=("communication-not-overlapped",), must_not=("dataloader-starvation",),
    ),
    CaseSpec(
        "gpu_allreduce_after_backward_ddp", "examples/allreduce_after_backward.py", ("--steps", "12", "--ddp"),
        "The fixed twin of gpu_allreduce_after_backward: DistributedDataParallel all-reduces bucket by bucket "
        "during backward. On one rank DDP skips the collectives, so none may be reported as exposed.",
        must_not=("communication-not-overlapped",),
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
    # The planted lines belong to the first rule here that names source lines.
    why_of = {"sync-memcpy-stall": "waits for the GPU, once per step.",
              "cpu-tensor-copied-each-step": "makes a tensor on the host and copies it to the GPU, once per step."}
    rule = next((r for r in why_of if r in must), None)
    if spec.source_lines and rule:
        lines = (REPO / spec.script).read_text().splitlines()
        for number in find_lines(REPO / spec.script, spec.source_lines):
            expect.append({"finding": rule, "source_line": f"{spec.script}:{number}",
                           "why": f"`{lines[number - 1].split('#')[0].strip()}` {why_of[rule]}"})
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


def recorded_by_an_older_collector(session: Path) -> bool:
    """Whether a case's GPU session was recorded before the collector measured its own cost
    (the native op recorder, advisor.collect.op_recorder): such a recording is the
    collector's first, whose Python op recorder cost the job several times what it costs
    now, and is recorded again where a GPU is at hand."""
    import json

    try:
        meta = json.loads((session / "session.json").read_text())
    except (OSError, ValueError):
        return True
    collector = meta.get("collector") or {}
    cost = collector.get("cost") or {}
    return collector.get("name") == "cupti" and cost.get("op_recorder") != "native"


def rerecord(ctx: Context, spec: CaseSpec, folder: Path) -> tuple[bool, str]:
    """Record a reviewed case's session again (its case.yaml untouched) and say what of the
    reviewed expectations the new recording meets; the old session is kept where it fails."""
    import yaml

    from advisor.importers import load

    argv = shlex.split(spec.command)
    kept = folder / "session.previous"
    shutil.rmtree(kept, ignore_errors=True)
    (folder / "session").rename(kept)
    done = run_child(ctx, [sys.executable, "-m", "advisor", *argv[1:]], label=f"{spec.name} (again)")
    if done is None or done.returncode != 0 or not (folder / "session").is_dir():
        shutil.rmtree(folder / "session", ignore_errors=True)
        kept.rename(folder / "session")
        return False, f"{spec.name}: FAILED to record again ({failure_line(done) if done else 'dry run'}); kept the old"
    shutil.rmtree(kept, ignore_errors=True)
    case_yaml = folder / "case.yaml"
    text = case_yaml.read_text()
    # The command that recorded the session is the case's own (its steps may have changed).
    text = re.sub(r"(?ms)^command:.*?(?=^\S)", lambda m: "command: >-\n  " + spec.command + "\n", text, count=1)
    case_yaml.write_text(text)
    content = yaml.safe_load(text)
    fired, problems = evaluate_case(load(folder / "session"), content)
    known = set((content.get("known_wrong") or {}))
    said = f"{spec.name}: recorded again ({session_size(folder / 'session') / 1e6:.2f} MB); fired " + (
        ", ".join(f"{r} ({f.severity.value}, {f.saving.ms_per_step:.3f} ms/step)" for r, f in fired.items()) or "nothing")
    if problems:
        said += "; NOT MET: " + "; ".join(problems)
    if known:
        said += f"; known_wrong in case.yaml: {', '.join(sorted(known))} (remove those now met)"
    return not problems or all(any(k in p for k in known) for p in problems), said


def session_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0


def draft_cases(ctx: Context) -> tuple[bool, list[str], dict[str, Any]]:
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
        reviewed = (folder / "case.yaml").exists() and not ctx.overwrite
        if reviewed and not recorded_by_an_older_collector(folder / "session"):
            lines.append(f"{spec.name}: skipped, case.yaml exists (python cases/record.py {spec.name} records it "
                         "again; --overwrite replaces it)")
            continue
        argv = shlex.split(spec.command)
        if reviewed:  # the collector changed since: record anew, judged by the reviewed case.yaml, kept as it is
            if ctx.dry_run:
                run_child(ctx, [sys.executable, "-m", "advisor", *argv[1:]], label=f"{spec.name} (again)")
                continue
            ok, line = rerecord(ctx, spec, folder)
            lines.append(line)
            failed |= not ok
            data[spec.name] = {"rerecorded": True, "ok": ok}
            continue
        if ctx.dry_run:
            run_child(ctx, [sys.executable, "-m", "advisor", *argv[1:]], label=spec.name)
            continue
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
        header = [f"DRAFT written by cases/draft_gpu_cases.py on {ctx.device_name}, {stamp}: review by hand,",
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
    return not failed, lines, data


def write_bundle(path: Path, names: list[str]) -> None:
    """The drafted cases/<name>/ folders in one archive, laid out as in the repository."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for name in names:
            folder = CASES_DIR / name
            if folder.is_dir():
                archive.add(folder, arcname=f"cases/{name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draft_gpu_cases.py", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing (any machine)")
    parser.add_argument("--overwrite", action="store_true", help="re-record cases whose case.yaml exists")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds allowed per recording")
    parser.add_argument("--bundle", type=Path, default=None, metavar="FILE.tar.gz",
                        help="also pack the drafted case folders into one archive")
    args = parser.parse_args(argv)
    ctx = Context(dry_run=args.dry_run, overwrite=args.overwrite, timeout_s=args.timeout)
    if not args.dry_run:
        try:
            import torch
        except ImportError:
            torch = None
        if torch is None or not torch.cuda.is_available():
            print("draft_gpu_cases: the GPU cases are recorded on a machine with a CUDA GPU (torch sees none here); "
                  "--dry-run shows the commands", file=sys.stderr)
            return 2
        ctx.device_name = torch.cuda.get_device_name(0)
    ok, lines, drafted = draft_cases(ctx)
    print("\n".join(lines))
    if args.bundle and drafted:
        write_bundle(args.bundle, sorted(drafted))
        print(f"draft_gpu_cases: bundle in {args.bundle} (tar xzf it in the repository root)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
