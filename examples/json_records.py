"""A tabular classifier whose Dataset keeps its records as JSON text and decodes one per item.

Planted problem (``dataloader-starvation``, loading that is cheaper made once): the records
are kept as the JSON lines they were read as, and ``Records.__getitem__`` decodes one
(``json.loads``) and turns its 512 numbers into a tensor, a few hundred microseconds of CPU
work an item, in the main process (``num_workers=0``), while the model, a small MLP, takes
a few milliseconds a batch. Most of the step waits on the loader. The records are the same
every epoch: decoded once, before training, each item is a list lookup.

Two fixes: the records decoded once (``--precompute``), or workers that decode the next
batches while the model trains (``--num-workers N``, with ``--torch-threads`` for the main
process where the workers take the cores). On a machine of few cores the workers share
them with the model's operators and save far less than decoding once.

    python examples/json_records.py --steps 40
    python examples/json_records.py --steps 40 --precompute                        # decoded once
    python examples/json_records.py --steps 40 --num-workers 2 --torch-threads 1   # workers
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 512
CLASSES = 10


class Records(Dataset):
    """JSON lines of {"x": [512 floats], "y": label}; each decoded when it is asked for."""

    def __init__(self, count: int, seed: int = 0, precompute: bool = False):
        rng = random.Random(seed)
        self.lines = [json.dumps({"x": [rng.random() for _ in range(FEATURES)], "y": rng.randrange(CLASSES)})
                      for _ in range(count)]
        self.decoded = [self.decode(line) for line in self.lines] if precompute else None

    @staticmethod
    def decode(line: str) -> tuple[torch.Tensor, int]:
        record = json.loads(line)
        return torch.tensor(record["x"], dtype=torch.float32), int(record["y"])

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.decoded is not None:
            return self.decoded[index]
        return self.decode(self.lines[index])


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--records", type=int, default=4096, help="records in the dataset (epochs repeat them)")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the main process's intra-op threads (0: torch's default, a thread per core)")
    parser.add_argument("--precompute", action="store_true", help="decode every record once before training")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    dataset = Records(args.records, args.seed, args.precompute)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    ends, waits, step = [], [], 0
    last = time.perf_counter()
    while step < args.steps:  # epochs, until the steps asked for are done
        for features, labels in loader:
            waits.append(time.perf_counter() - last)  # time spent waiting for this batch
            features, labels = features.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(features), labels)
            loss.backward()
            optimizer.step()
            last = time.perf_counter()
            ends.append(last)
            step += 1
            if step == args.steps:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"json_records: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
