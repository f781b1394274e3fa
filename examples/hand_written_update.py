"""A deep, narrow MLP trained with a hand-written SGD update.

Planted problem (``host-bound``): after ``loss.backward()`` the script updates each
parameter itself, ``p -= lr * p.grad`` in a loop over ``model.parameters()``: two
operators per parameter (a multiply, an in-place subtract), each paying its dispatch, 192
parameters a step, outside every phase of the model. Only the training process can do it:
no DataLoader worker holds the model.

The fix, ``--optimizer``: ``torch.optim.SGD`` with its fused step on a CPU (foreach on a
GPU), one call over every parameter: the same update.

    python examples/hand_written_update.py --steps 60
    python examples/hand_written_update.py --steps 60 --optimizer   # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

WIDTH, LAYERS = 32, 96


def build_model() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--optimizer", action="store_true", help="the fix: torch.optim.SGD, one call a step")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = build_model().to(device)
    inputs = torch.randn(args.steps, args.batch_size, WIDTH, device=device)
    targets = torch.randn(args.steps, args.batch_size, WIDTH, device=device)
    fused = {"fused": True} if device.type == "cpu" else {"foreach": True}
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, **fused) if args.optimizer else None

    ends = []
    for step in range(args.steps):
        loss = ((model(inputs[step]) - targets[step]) ** 2).mean()
        model.zero_grad(set_to_none=True)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= args.lr * p.grad
        ends.append(time.perf_counter())
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"hand_written_update: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
