"""A balanced training loop: the data is already in memory as tensors.

The DataLoader only slices a TensorDataset, so each step is spent in forward, backward
and the optimizer. The advisor should find no input-pipeline problem here. AdamW runs
torch's default CPU step, a few operators per parameter; ``--fused`` is the fix
optimizer-not-fused names (fused=True: one pass over each parameter).

    python examples/clean_train.py --steps 20
    python examples/clean_train.py --steps 20 --fused
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 256
CLASSES = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fused", action="store_true", help="the fix: AdamW's fused step")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (one keeps a tiny model's timing steady)"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    samples = args.steps * args.batch_size
    inputs = torch.randn(samples, FEATURES)
    labels = torch.randint(0, CLASSES, (samples,))
    loader = DataLoader(
        TensorDataset(inputs, labels),
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = nn.Sequential(
        nn.Linear(FEATURES, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, CLASSES),
    )
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True if args.fused else None)

    model.train()
    steps, waits = [], []  # each step's time and the part of it spent waiting for the batch
    last = time.perf_counter()
    for batch_inputs, batch_labels in loader:
        waits.append(time.perf_counter() - last)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_inputs), batch_labels)
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter() - last)
        last = time.perf_counter()
    timed = sum(steps[2:]) or float("nan")  # after two warm-up steps
    print(f"clean_train: {args.steps} steps, {1000 * timed / max(len(steps) - 2, 1):.2f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.detach():.4f}")


if __name__ == "__main__":
    main()
