"""A residual MLP trained with autograd's anomaly detection left on from a debugging session.

Planted problem (``autograd-anomaly-detection``): ``torch.autograd.set_detect_anomaly(True)``
at start-up, left from chasing a NaN. Forward then stores the Python stack of every
autograd node it creates, and backward checks every function's outputs for NaN: on a small
model that is most of the step.

The fix, ``--no-anomaly``: anomaly detection stays off (torch's default).

    python examples/anomaly_left_on.py --steps 40
    python examples/anomaly_left_on.py --steps 40 --no-anomaly   # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

WIDTH = 128
BLOCKS = 8


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, WIDTH), *[Block(WIDTH) for _ in range(BLOCKS)], nn.LayerNorm(WIDTH),
                         nn.Linear(WIDTH, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-anomaly", action="store_true", help="the fix: anomaly detection off")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # Left on after chasing a NaN last week.
    torch.autograd.set_detect_anomaly(not args.no_anomaly)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    inputs = torch.randn(4096, 64, device=device)
    labels = torch.randint(0, 10, (4096,), device=device)

    ends = []
    for step in range(args.steps):
        start = (step * args.batch_size) % (len(inputs) - args.batch_size)
        x, y = inputs[start:start + args.batch_size], labels[start:start + args.batch_size]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"anomaly_left_on: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.1f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
