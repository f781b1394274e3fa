"""Ranks a script starts itself, with torch.multiprocessing.spawn, profiled like torchrun's.

Under `advisor diagnose train.py`, the collector wraps the function handed to
``torch.multiprocessing.spawn`` (``start_processes``) in :class:`ProfiledRank`. In each
child it runs the function under a collector of its own (advisor.collect.script, with
``call``) and saves the rank's session to ``FOLDER/rank-N`` with a ``launch.json`` saying
how the rank ended, as a torchrun rank does (advisor.job.rank_main); then it ends as the
function did, so spawn's own error handling sees the same exception or exit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LAUNCH_FILE = "launch.json"


def save_rank(run: Any, folder: Path, *, rank: int, world_size: int, launcher: str, local_rank: int | None = None) -> None:
    """Save a rank's collected run as ``folder`` (its session) with the launch.json that
    says which rank it was and how it ended; what torchrun's ranks and spawned ones share."""
    run.session.save(folder)
    (folder / LAUNCH_FILE).write_text(json.dumps({
        "rank": rank, "local_rank": rank if local_rank is None else local_rank, "world_size": world_size,
        "exit_code": run.exit_code, "ending": run.run.ending, "launcher": launcher,
    }))


class ProfiledRank:
    """A spawned process's function, run under the collector; picklable as spawn needs."""

    def __init__(self, fn: Any, folder: str, options: dict):
        self.fn = fn
        self.folder = folder
        self.options = options

    def __call__(self, index: int, *args: Any) -> Any:
        from advisor.collect.assemble import collect_script
        from advisor.collect.steps import EnoughSteps

        raised: list[BaseException] = []
        result: list[Any] = []

        def call() -> None:
            try:
                result.append(self.fn(index, *args))
            except EnoughSteps:
                raise  # advisor's own stop: the rank ran what its diagnosis needs, not an error
            except BaseException as exc:
                raised.append(exc)
                raise

        options = self.options
        # The parent's command names the rank's session (the function runs, not the script).
        run = collect_script(Path(options.get("script") or "spawned"), list(options.get("args") or []), gpu=options.get("gpu", True),
                             steps=options.get("steps", "default"), with_stack=bool(options.get("with_stack")),
                             event_budget=options.get("event_budget"), call=call,
                             run_to_end=bool(options.get("run_to_end")))
        save_rank(run, Path(self.folder) / f"rank-{index}", rank=index,
                  world_size=int(os.environ.get("WORLD_SIZE", "0") or 0), launcher="torch.multiprocessing.spawn")
        if raised:
            raise raised[0]
        return result[0] if result else None
