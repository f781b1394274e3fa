"""Record the cases again: run each case's ``command`` from its case.yaml, from the
repository root, and say what the new session holds.

    python cases/record.py                       # every case
    python cases/record.py cpu_host_sync ...     # only these

The command's ``advisor`` is run as ``python -m advisor`` with this interpreter, so the
checkout's own advisor records the case. The old session folder is removed first, so a
file the new recording does not write cannot survive from the old one. Afterwards each
case's size, Dataloader share and findings are printed beside its must / must_not; run
``python -m pytest tests/test_cases.py`` for the full check (figure expectations too).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

CASES = Path(__file__).resolve().parent
REPO = CASES.parent


def save_dir(case: Path, argv: list[str]) -> Path:
    """The --save folder of a case's command, which must be the case's own session/."""
    try:
        target = argv[argv.index("--save") + 1]
    except (ValueError, IndexError):
        raise SystemExit(f"record: {case.name}: the command has no --save DIR") from None
    folder = (REPO / target).resolve()
    if folder != (case / "session").resolve():
        raise SystemExit(f"record: {case.name}: the command saves to {target}, not {case.name}/session")
    return folder


def record(case: Path) -> None:
    spec = yaml.safe_load((case / "case.yaml").read_text())
    argv = shlex.split(spec["command"])
    if argv[:1] != ["advisor"]:
        raise SystemExit(f"record: {case.name}: the command must start with `advisor`")
    folder = save_dir(case, argv)
    shutil.rmtree(folder, ignore_errors=True)
    print(f"== {case.name}: {spec['command']}", flush=True)
    done = subprocess.run([sys.executable, "-m", "advisor", *argv[1:]], check=False, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"record: {case.name}: the command exited {done.returncode}")
    summarise(case, spec, folder)


def summarise(case: Path, spec: dict, folder: Path) -> None:
    from advisor.importers import load
    from advisor.rules import run_rules
    from advisor.tables import compute_tables

    from advisor.job import is_job_dir
    from advisor.job.diagnose import diagnose_saved_job

    if is_job_dir(folder):  # a torchrun case: the job's findings, the lowest rank's tables
        job, diagnosis = diagnose_saved_job(folder)
        session = load(job.ranks[0].summary.source)
        tables, findings = compute_tables(session), diagnosis.findings
    else:
        session = load(folder)
        tables = compute_tables(session)
        findings = run_rules(session, tables).findings
    fired: dict[str, object] = {}
    stack = list(findings)
    while stack:
        finding = stack.pop()
        fired.setdefault(finding.rule, finding)
        stack.extend(finding.explains)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    model = tables.get("model")
    share = model.loc["Dataloader", "cpu_ratio"] if model is not None and "Dataloader" in model.index else None
    print(f"   session {size / 1024:.0f} KiB, {len(session.events)} events; "
          f"Dataloader share {share if share is None else f'{share:.3f}'}")
    for rule, finding in fired.items():
        print(f"   fired {rule} ({finding.severity.value}): {finding.saving.ms_per_step:.3f} ms/step, "
              f"{finding.saving.share_of_step:.1%} of the step")
    missing = [r for r in spec.get("must") or [] if r not in fired]
    unwanted = [r for r in spec.get("must_not") or [] if r in fired and r not in (spec.get("known_wrong") or {})]
    for rule in missing:
        print(f"   MISSING {rule} (in must)")
    for rule in unwanted:
        print(f"   UNWANTED {rule} (in must_not)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record the cases again from their case.yaml.")
    parser.add_argument("cases", nargs="*", help="case folder names (default: every case)")
    args = parser.parse_args(argv)
    every = sorted(p.parent for p in CASES.glob("*/case.yaml"))
    chosen = [c for c in every if not args.cases or c.name in args.cases]
    unknown = set(args.cases) - {c.name for c in every}
    if unknown:
        raise SystemExit(f"record: no such case: {', '.join(sorted(unknown))}")
    for case in chosen:
        record(case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
