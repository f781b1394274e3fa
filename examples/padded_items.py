"""A small classifier whose Dataset pads and pools each item with a handful of torch calls.

Planted problem (``dataloader-starvation``): ``__getitem__`` reads a row's mask length
back to Python (``int(mask.sum().max())``), slices the row to it and averages it, several
small torch operators an item, tens of microseconds each, for every item of every batch in
the main process (``num_workers=0``). The model itself is tiny, so loading is most of the
step.

What does not fix it on a machine where handing a batch over from a worker process costs
about as much as making the batch: worker processes. advisor times that hand-over after the
run and says so. What does: the per-item work done once before training
(``--precompute``): each item is then a list lookup.

The ``int(...)`` of a CPU tensor inside the Dataset is no wait for a device: the host-sync
rules must not name it.

    python examples/padded_items.py --steps 60
    python examples/padded_items.py --steps 60 --precompute          # the fix
    python examples/padded_items.py --steps 60 --num-workers 2 --torch-threads 1
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

LENGTH, FEATURES, CLASSES = 32, 64, 4


class PaddedRows(Dataset):
    """Rows of up to ``LENGTH`` feature vectors, each with a mask of its real length."""

    def __init__(self, count: int, seed: int = 0, precompute: bool = False):
        g = torch.Generator().manual_seed(seed)
        self.rows = torch.randn(count, LENGTH, FEATURES, generator=g)
        self.mask = torch.rand(count, LENGTH, generator=g) > 0.3
        self.done = [self._make(i) for i in range(count)] if precompute else None

    def __len__(self) -> int:
        return len(self.rows)

    def _make(self, index: int):
        length = max(int(self.mask[index:index + 1].sum(1).max()), 1)
        return self.rows[index, :length].mean(0), torch.tensor(length % CLASSES)

    def __getitem__(self, index: int):
        return self.done[index] if self.done is not None else self._make(index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precompute", action="store_true", help="make every item once before training (the fix)")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads for the main process (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    dataset = PaddedRows(16 * args.batch_size, args.seed, args.precompute)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0)
    model = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    ends = []
    while len(ends) < args.steps:
        for features, labels in loader:
            loss = nn.functional.cross_entropy(model(features), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            ends.append(time.perf_counter())
            if len(ends) == args.steps:
                break
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"padded_items: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
