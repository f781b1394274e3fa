"""A training loop starved by its input pipeline.

Each sample is "read and decoded" one at a time in the main process (num_workers=0): a
pause stands in for the file read, then a little per-item work. The model is a small MLP,
so almost all of each step is spent waiting in the DataLoader. The fix the
advisor should suggest is more DataLoader workers, or cheaper per-item work.

    python examples/starved_loader.py --steps 20
    python examples/starved_loader.py --steps 20 --num-workers 4   # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 64
CLASSES = 10


class SlowDataset(Dataset):
    """Synthetic samples that are expensive to produce one at a time."""

    def __init__(self, length: int, item_delay_s: float, seed: int):
        self.length = length
        self.item_delay_s = item_delay_s
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.item_delay_s)  # stands in for reading and decoding a file
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        features = torch.randn(FEATURES, generator=generator).tanh()
        label = index % CLASSES
        return features, label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--item-delay-ms", type=float, default=2.0, help="pause per sample")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (one keeps a tiny model's timing steady)"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    dataset = SlowDataset(args.steps * args.batch_size, args.item_delay_ms / 1000.0, args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers)
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    model.train()
    steps, waits = [], []  # each step's time and the part of it spent waiting for the batch
    last = time.perf_counter()
    for inputs, labels in loader:
        waits.append(time.perf_counter() - last)
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter() - last)
        last = time.perf_counter()
    timed = sum(steps[2:]) or float("nan")  # after two warm-up steps
    print(f"starved_loader: {args.steps} steps, {1000 * timed / max(len(steps) - 2, 1):.2f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.detach():.4f}")


if __name__ == "__main__":
    main()
