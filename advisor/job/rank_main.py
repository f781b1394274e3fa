"""Each rank of a launched job: ``python -m advisor.job.rank_main train.py ARGS``.

`advisor diagnose torchrun ... train.py ARGS` starts torchrun with ``-m
advisor.job.rank_main`` in place of the script, so every rank torchrun starts runs the
script under advisor's collector (the script itself is unchanged), then saves its session
to ``$ADVISOR_RANK_SAVE_DIR/rank-$RANK`` with a ``launch.json`` saying how the rank ended,
and exits with the script's own exit code. torchrun stops the other ranks with SIGTERM
when one fails; that ends the script here as an interrupt would, so what the rank
collected up to then is saved too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

SAVE_DIR_ENV = "ADVISOR_RANK_SAVE_DIR"
OPTIONS_ENV = "ADVISOR_RANK_OPTIONS"


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    from advisor.collect import collect_script
    from advisor.collect.script import DEFAULT_EVENT_BUDGET
    from advisor.collect.spawned import save_rank
    from advisor.collect.steps import StepWindow
    from advisor.errors import AdvisorError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or SAVE_DIR_ENV not in os.environ:
        print("advisor: advisor.job.rank_main runs one rank of a job started by `advisor diagnose torchrun ...`",
              file=sys.stderr)
        return 2
    script, script_args = Path(argv[0]), argv[1:]
    options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    rank = int(os.environ.get("RANK", "0"))
    folder = Path(os.environ[SAVE_DIR_ENV]) / f"rank-{rank}"
    signal.signal(signal.SIGTERM, _interrupt)
    steps = StepWindow.parse(options["steps"]) if options.get("steps") else "default"
    try:
        run = collect_script(script, script_args, gpu=options.get("collector", "auto") == "auto", steps=steps,
                             with_stack=bool(options.get("with_stack")),
                             event_budget=options.get("event_budget") or DEFAULT_EVENT_BUDGET,
                             run_to_end=bool(options.get("run_to_end")))
    except AdvisorError as exc:
        print(f"advisor: rank {rank}: {exc}", file=sys.stderr)
        return 2
    save_rank(run, folder, rank=rank, world_size=int(os.environ.get("WORLD_SIZE", "1")), launcher="torchrun",
              local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
