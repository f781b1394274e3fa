"""A training loop that validates and saves a checkpoint every few steps.

Every ``--validate-every`` steps the loop runs the model over a held-out set (forward
passes, no backward) and writes a checkpoint with ``torch.save``, inside the training loop:
training stops while they run. At every 8 steps they take more than half of the run; the
fix validates four times less often (``--validate-every 32``).

It prints its own pace: the mean time per training step after two warm-up steps, the
periodic work included (it is part of what each step costs the run):

    python examples/periodic_validation.py --steps 64
    python examples/periodic_validation.py --steps 64 --validate-every 32

``--read-ms`` adds a second problem: each sample is read (a pause stands in for the file
read) in the main process, so the loader starves the loop as well; ``--num-workers`` is
its fix. With both, two fixes apply at once (benchmarks/savings.py checks advisor's
combined estimate against the two applied together).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

FEATURES = 256
HIDDEN = 512
CLASSES = 10


class ReadDataset(Dataset):
    """Samples that take ``read_ms`` each to read (a pause stands in for the file read)."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, read_ms: float):
        self.inputs, self.labels, self.read_s = inputs, labels, read_ms / 1000

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_s)
        return self.inputs[index], self.labels[index]


def validate(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy over the held-out set, batch by batch."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(inputs), 64):
            correct += int((model(inputs[i:i + 64]).argmax(dim=1) == labels[i:i + 64]).sum())
    model.train()
    return correct / len(inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64, help="training steps (batches)")
    parser.add_argument("--validate-every", type=int, default=8, help="steps between validations and checkpoints")
    parser.add_argument("--read-ms", type=float, default=0.0, help="time to read each sample (0: in memory)")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    inputs, labels = torch.randn(args.steps * 64, FEATURES), torch.randint(0, CLASSES, (args.steps * 64,))
    val_inputs, val_labels = torch.randn(2048, FEATURES), torch.randint(0, CLASSES, (2048,))
    dataset = ReadDataset(inputs, labels, args.read_ms) if args.read_ms else TensorDataset(inputs, labels)
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    accuracy = 0.0
    with tempfile.TemporaryDirectory() as folder:
        ends = [time.perf_counter()]
        for step, (x, y) in enumerate(loader, 1):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if step % args.validate_every == 0:  # the smell: validation and a checkpoint every few steps
                accuracy = validate(model, val_inputs, val_labels)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                           Path(folder) / "checkpoint.pt")
            ends.append(time.perf_counter())
    timed = ends[-1] - ends[min(2, len(ends) - 1)]
    print(f"periodic_validation: {args.steps} steps, {1000 * timed / max(len(ends) - 3, 1):.2f} ms/step, "
          f"validation accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
