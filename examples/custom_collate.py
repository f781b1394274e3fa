"""Text classification whose batches are padded and featurised by a collate function in Python.

Planted problem (``dataloader-starvation``): the Dataset only hands back a stored list of
token ids, a few microseconds an item, but ``pad_and_count`` (the DataLoader's
``collate_fn``) pads every sequence of the batch with Python lists and counts hashed bigrams
in a Python loop, tens of milliseconds a batch, in the main process (``num_workers=0``)
while the model waits. The items are cheap; the collation is not, and a batched index would
leave it where it is.

Two fixes: worker processes collate the next batches while the main process trains
(``--num-workers N``, with ``--torch-threads`` for the main process where the workers take
the cores, as the finding says), or each sequence's bigram counts made once before
training (``--precompute``; the collate function then only pads the ids), which on few
cores, where the workers and the model share them, saves more.

    python examples/custom_collate.py --steps 20
    python examples/custom_collate.py --steps 20 --num-workers 2 --torch-threads 1   # workers
    python examples/custom_collate.py --steps 20 --precompute                        # made once
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB = 5000
BUCKETS = 1024  # hashed bigram features
CLASSES = 4


class Sequences(Dataset):
    """Token id lists of 40 to 240 tokens, made once: fetching one is a list lookup."""

    def __init__(self, count: int, seed: int = 0, precompute: bool = False):
        rng = random.Random(seed)
        self.items = []
        for _ in range(count):
            tokens = [rng.randrange(1, VOCAB) for _ in range(rng.randint(40, 240))]
            # --precompute: each sequence's bigram counts made once, here (pad_and_stack collates them).
            self.items.append((tokens, torch.tensor(bigram_counts(tokens)), tokens[0] % CLASSES) if precompute
                              else (tokens, tokens[0] % CLASSES))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


def bigram_counts(tokens: list[int]) -> list[float]:
    """A sequence's hashed bigram counts, normalised."""
    row = [0.0] * BUCKETS
    for a, b in zip(tokens, tokens[1:]):
        row[(a * 31 + b) % BUCKETS] += 1.0
    total = sum(row)
    return [value / total for value in row]


def pad_and_count(batch):
    """The batch's ids padded to its longest sequence, and each sequence's bigram counts."""
    longest = max(len(tokens) for tokens, _ in batch)
    ids = [tokens + [0] * (longest - len(tokens)) for tokens, _ in batch]
    counts = [bigram_counts(tokens) for tokens, _ in batch]
    return torch.tensor(ids), torch.tensor(counts), torch.tensor([label for _, label in batch])


def pad_and_stack(batch):
    """pad_and_count of items whose bigram counts were made once (--precompute)."""
    longest = max(len(tokens) for tokens, _, _ in batch)
    ids = [tokens + [0] * (longest - len(tokens)) for tokens, _, _ in batch]
    return (torch.tensor(ids), torch.stack([counts for _, counts, _ in batch]),
            torch.tensor([label for _, _, label in batch]))


class BagOfBigrams(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 64, mode="mean")
        self.head = nn.Sequential(nn.Linear(64 + BUCKETS, 256), nn.ReLU(), nn.Linear(256, CLASSES))

    def forward(self, ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.embed(ids), counts], dim=1))


def build_model() -> BagOfBigrams:
    return BagOfBigrams()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (the fix)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads for the main process (0: torch's default)")
    parser.add_argument("--precompute", action="store_true",
                        help="make each sequence's bigram counts once before training (the fix on few cores)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    dataset = Sequences(args.steps * args.batch_size, args.seed, args.precompute)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                        collate_fn=pad_and_stack if args.precompute else pad_and_count,
                        num_workers=args.num_workers, persistent_workers=args.num_workers > 0)
    model = build_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    ends, waits = [], []
    last = time.perf_counter()
    for ids, counts, labels in loader:
        waits.append(time.perf_counter() - last)  # time spent waiting for this batch
        ids, counts, labels = ids.to(device), counts.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(ids, counts), labels)
        loss.backward()
        optimizer.step()
        last = time.perf_counter()
        ends.append(last)
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"custom_collate: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.1f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
