"""One trial run of ``advisor verify``: the script, a fix applied or none, its steps timed.

``python -m advisor.verify.trial PLAN.json`` runs in a process of its own. The plan (JSON,
data only) names the script and its arguments, the fixes to apply (advisor.verify.fixes),
how the diagnosis found the script's steps (``step_source``: each read of its DataLoader,
each optimizer step, each call of its model) and how many steps to run. No profiler runs:
one timestamp per step is taken where the step begins, and once the warm-up and the timed
steps are done the script is stopped (an exception raised from the step's hook, which the
script's own ``except Exception`` cannot catch). The step times, and how many changes each
fix made, are written to the plan's ``out`` file as JSON.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any


class TrialDone(BaseException):
    """The trial has timed its steps: the script is stopped here."""


class StepStamps:
    """A timestamp where each step begins, for the step source the diagnosis found."""

    def __init__(self, torch: Any, source: str | None, wanted: int):
        self.stamps: list[int] = []
        self._wanted = wanted  # stamps: the end of the last timed step is the next one's start
        self._first: Any = None
        self._depth = 0
        data = importlib.import_module("torch.utils.data.dataloader")
        optim = importlib.import_module("torch.optim.optimizer")
        module_mod = importlib.import_module("torch.nn.modules.module")
        if source == "dataloader":
            original = data._BaseDataLoaderIter.__next__
            stamps = self

            def __next__(self: Any) -> Any:
                stamps.loader_read(self)
                return original(self)

            data._BaseDataLoaderIter.__next__ = __next__
        elif source == "optimizer":
            optim.register_optimizer_step_post_hook(self.optimizer_stepped)
        else:  # forward (an inference loop), manual, or not known: each call of the model
            module_mod.register_module_forward_pre_hook(self.forward_pre)
            module_mod.register_module_forward_hook(self.forward_post, always_call=True)

    def stamp(self) -> None:
        self.stamps.append(time.perf_counter_ns())
        if len(self.stamps) >= self._wanted:
            raise TrialDone

    def loader_read(self, iterator: Any) -> None:
        dataset = getattr(iterator, "_dataset", None)
        if self._first is None:
            self._first = dataset
        if dataset is self._first:  # the training loop's loader; another's reads are inside its steps
            self.stamp()

    def optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._first is None:
            self._first = optimizer
        if optimizer is self._first:
            self.stamp()

    def forward_pre(self, module: Any, args: Any) -> None:
        self._depth += 1
        if self._depth == 1:
            if self._first is None:
                self._first = module
            if module is self._first:
                self.stamp()

    def forward_post(self, module: Any, args: Any, output: Any) -> None:
        self._depth -= 1


def run(plan: dict[str, Any]) -> dict[str, Any]:
    """Run the plan's script in this process; the steps' durations, ns, and the changes
    each fix made (a fix that made none was not tried)."""
    import torch

    from advisor.verify.fixes import apply_fixes

    warmup, steps = int(plan["warmup"]), int(plan["steps"])
    changes = apply_fixes(torch, plan.get("fixes", []))
    stamps = StepStamps(torch, plan.get("step_source"), warmup + steps + 1)
    script = plan["script"]
    sys.argv = [script, *plan.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    ended = "stopped"
    try:
        runpy.run_path(script, run_name="__main__")
        ended = "ended"
    except TrialDone:
        pass
    except SystemExit as exc:
        ended = "ended" if not exc.code else f"exited ({exc.code})"
    durations = [b - a for a, b in zip(stamps.stamps, stamps.stamps[1:])][warmup:]
    return {"durations_ns": durations, "ended": ended, "steps_seen": len(stamps.stamps), "changes": changes}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    result = run(plan)
    Path(plan["out"]).write_text(json.dumps(result))
    sys.stdout.flush()
    # The script's threads and DataLoader workers are not waited for: the steps are timed.
    os._exit(0)


if __name__ == "__main__":
    main()
