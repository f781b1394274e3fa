"""A text classifier whose Dataset turns every text into character features in Python.

Planted problem (``dataloader-starvation``, loading that needs every core):
``CharFeatures.__getitem__`` walks its text character by character (normalising each,
counting it into a bag of characters), a few hundred microseconds of pure CPU work an
item, done in the main process (``num_workers=0``), while the model, a small MLP, takes
about a millisecond a batch. Almost the whole step is the data loader, and it is CPU work:
one worker would only move it to another core and the step would stay as long. It takes
as many workers as the job has cores, and, as the script leaves torch's intra-op threads
at their default (a thread per core) the way most scripts do, those threads then compete
with the workers for the same cores unless the main process is told to use fewer.

Two fixes: workers (``--num-workers 2 --torch-threads 1`` on a 2-core machine: two
workers make batches on both cores while the main process trains on one thread), or each
item's features made once before training (``--precompute``), which on few cores, where
the workers and the model share them, saves more; advisor leads with the one that saves
clearly more on the machine it ran on.

    python examples/char_features.py --steps 30
    python examples/char_features.py --steps 30 --num-workers 2 --torch-threads 1   # workers
    python examples/char_features.py --steps 30 --precompute                        # made once
"""

from __future__ import annotations

import argparse
import random
import string
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ALPHABET = string.ascii_lowercase + " .,!?"
VOCAB = {c: i + 1 for i, c in enumerate(ALPHABET)}  # 0: anything else
CLASSES = 4
BIGRAM_BUCKETS = 64
FEATURES = len(VOCAB) + 1 + BIGRAM_BUCKETS
TEXT_LENGTH = 1500


class CharFeatures(Dataset):
    """Raw texts; each item is a normalised bag of its characters, built when asked for."""

    def __init__(self, length: int, seed: int, precompute: bool = False):
        rng = random.Random(seed)
        letters = string.ascii_lowercase + "  "
        self.texts = ["".join(rng.choices(letters, k=TEXT_LENGTH)) for _ in range(length)]
        self.labels = [rng.randrange(CLASSES) for _ in range(length)]
        self.done = [self._make(i) for i in range(length)] if precompute else None

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.done[index] if self.done is not None else self._make(index)

    def _make(self, index: int) -> tuple[torch.Tensor, int]:
        bag = [0.0] * FEATURES
        previous = " "
        for ch in self.texts[index]:
            ch = ch.lower().strip() or " "  # normalising, one character at a time
            bag[VOCAB.get(ch, 0)] += 1.0
            bag[len(VOCAB) + 1 + (31 * ord(previous) + ord(ch)) % BIGRAM_BUCKETS] += 1.0  # character bigrams, hashed
            previous = ch
        total = sum(bag) or 1.0
        return torch.tensor([count / total for count in bag]), self.labels[index]


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (the fix: the cores)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the main process's intra-op threads (0: torch's default, a thread per core)")
    parser.add_argument("--precompute", action="store_true",
                        help="make every item's features once before training (the fix on few cores)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    dataset = CharFeatures(args.steps * args.batch_size, args.seed, args.precompute)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0)
    device = torch.device(args.device)
    model = build_model().to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    ends, waits = [], []
    last = time.perf_counter()
    for features, labels in loader:
        waits.append(time.perf_counter() - last)  # time spent waiting for this batch
        features, labels = features.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(features), labels)
        loss.backward()
        optimizer.step()
        last = time.perf_counter()
        ends.append(last)
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"char_features: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
