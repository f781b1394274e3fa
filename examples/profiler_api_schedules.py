"""advisor.Profiler with a repeating schedule, the ready-made callbacks and the user's own
ranges.

``make_scheduler(closed=2, ready=1, record=3, repeat=2)`` records two spans of three steps
(steps 3-5 and 9-11). Each span, as it ends, is written as a timeline (Chrome trace) and as
a saved session, and a callback of our own prints its Model summary row for the
Dataloader. ``advisor.region`` / ``advisor.RecordEvent`` mark parts of the step, which the
UserDefined table then shows.

    python examples/profiler_api_schedules.py --out runs/
    advisor summary runs/<name>_0 --table userdefined    # a saved span, read again
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import advisor
from advisor.tables import compute_tables


@advisor.region("augment")
def augment(x: torch.Tensor) -> torch.Tensor:
    return x + 0.01 * torch.randn_like(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--out", type=Path, default=None, help="folder for the timelines and sessions (default: a temporary one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="advisor-spans-"))

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.steps * 16, 32), torch.randint(0, 4, (args.steps * 16,)))
    loader = DataLoader(data, batch_size=16)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    timelines = advisor.export_timeline(out / "timelines", worker_name="schedules")
    sessions = advisor.save_session(out / "sessions", worker_name="schedules")

    def on_trace_ready(prof: advisor.Profiler) -> None:
        timelines(prof)
        sessions(prof)
        # The tables judge the span's steady steps: a first step far slower than the others
        # (start-up) is set apart, and the session's notes say so.
        tables = compute_tables(prof.session, ["userdefined", "model"])
        userdefined, steady = tables["userdefined"], int(tables["model"].loc["ProfileStep", "calls"])
        calls = {name: int(userdefined.loc[name, "calls"]) for name in ("augment", "loss") if name in userdefined.index}
        print(f"span {prof.span}: steps {prof.recorded_steps}, {steady} steady, user ranges {calls}")

    schedule = advisor.make_scheduler(closed=2, ready=1, record=3, repeat=2)
    with advisor.Profiler(scheduler=schedule, on_trace_ready=on_trace_ready) as prof:
        for x, y in loader:
            x = augment(x)
            with advisor.RecordEvent("loss"):
                loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step(num_samples=len(x))
    print(f"written to {out}:")
    print(f"timelines: {sorted(p.name for p in (out / 'timelines').iterdir())}")
    print(f"sessions: {sorted(p.name for p in (out / 'sessions').iterdir())}")
    print(prof.step_info())


if __name__ == "__main__":
    main()
