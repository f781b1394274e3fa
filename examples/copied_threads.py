"""An MLP trained with a thread setting copied from a bigger machine.

Planted problem (``cpu-threads-oversubscribed``): the script sets
``torch.set_num_threads(16)``, right for the 16-core workstation it was written on. On a
machine with fewer cores the 16 operator threads take turns on them: every parallel
operator waits for its slowest thread, which waits for a core.

The fix, ``--threads cores``: as many threads as the cores this process may use.

    python examples/copied_threads.py --steps 30
    python examples/copied_threads.py --steps 30 --threads cores   # the fix
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, HIDDEN, CLASSES = 512, 1024, 10


def build_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                         nn.Linear(HIDDEN, CLASSES))


def cores() -> int:
    """The cores this process may use (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", default="16", help="torch's operator threads: a number, or 'cores' (the fix)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(cores() if args.threads == "cores" else int(args.threads))
    device = torch.device(args.device)
    samples = args.steps * args.batch_size
    inputs = torch.randn(samples, FEATURES, device=device)
    labels = torch.randint(0, CLASSES, (samples,), device=device)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    ends = []
    for start in range(0, samples, args.batch_size):
        end = start + args.batch_size
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs[start:end]), labels[start:end])
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"copied_threads: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step "
          f"({torch.get_num_threads()} threads), last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
