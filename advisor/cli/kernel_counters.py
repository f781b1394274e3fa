"""`--kernel-counters`: the script run once more under Nsight Compute for the kernels that
matter (advisor.collect.ncu_run), asked first where it costs a long run, its counters
attached through the target stage and the diagnosis made again with them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from advisor.cli.opening import say
from advisor.cli.views import analyse
from advisor.targets import is_script as _is_script


def with_kernel_counters(args: argparse.Namespace, session, diagnosis, chosen, said: list[str]):
    """--kernel-counters: the script run once more under Nsight Compute for the kernels that
    matter, the counters attached, the diagnosis made again with them; the first diagnosis,
    with one line saying why, where they cannot be had."""
    import tempfile

    from advisor.collect import ncu_run
    from advisor.collect.steps import DEFAULT_WARMUP_STEPS
    from advisor.targets import with_counters

    def skipped(why: str):
        line = f"kernel counters skipped: {why}"
        print(f"advisor: {line}", file=sys.stderr)
        said.append(line)
        return diagnosis

    if not _is_script(Path(args.target)):
        return skipped("--kernel-counters runs a script again under Nsight Compute; for a trace, give the counters "
                       "you collected with --ncu REPORT")
    if not session.meta.collector.gpu_measured:
        return skipped("the GPU was not measured in this run, so there is no kernel to profile")
    ncu = ncu_run.find_ncu()
    if ncu is None:
        return skipped("Nsight Compute (ncu) is not installed here (/usr/local/cuda/bin/ncu, or on PATH)")
    folder = Path(tempfile.mkdtemp(prefix="advisor-ncu-"))
    the_plan = ncu_run.plan(diagnosis.tables.get("kernel"), args.kernel_counters, Path(args.target),
                            list(args.script_args), folder, steps=max(diagnosis.model.steps, 1),
                            warmup_steps=DEFAULT_WARMUP_STEPS, ncu=ncu)
    if the_plan is None:
        return skipped(f"no kernel of this run matches {args.kernel_counters!r}")
    report, why = ncu_run.run(the_plan, say=say, confirm=_asked if sys.stdin.isatty() and sys.stderr.isatty() else None)
    if why == "declined":
        return skipped("declined")
    if report is None:
        return skipped(why or "Nsight Compute gave no report")
    try:
        counted = with_counters(session, Path(args.target), [report])
    except Exception as exc:  # noqa: BLE001  (the counters are extra: the diagnosis stands without them)
        return skipped(" ".join(str(exc).split())[:200])
    return analyse(counted, chosen, said)


def _asked(cost: str) -> bool:
    """Ask an interactive user whether to go on, having said what it costs: yes unless they
    say no (or stop reading)."""
    try:
        answer = input(f"advisor: {cost} Go on? [Y/n] ")
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        return False
    return answer.strip().lower() not in ("n", "no")
