"""A training loop that makes the host wait on the device every step.

``loss.item()`` and ``.cpu()`` copy a value back to the host, which on a GPU blocks the
Python thread until every queued kernel has finished, so the host cannot run ahead and
keep the device fed. Here they run every step only to log a running loss and accuracy.
The advisor should point at the two lines marked below; the fix is to accumulate on the
device and read the values back every N steps.

    python examples/host_sync.py --steps 20
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CHANNELS = 3
SIZE = 16
CLASSES = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (one keeps a tiny model's timing steady)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    samples = args.steps * args.batch_size
    images = torch.randn(samples, CHANNELS, SIZE, SIZE)
    labels = torch.randint(0, CLASSES, (samples,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=False)
    model = nn.Sequential(
        nn.Conv2d(CHANNELS, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, CLASSES),
    ).to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    running_loss = 0.0
    correct = 0
    seen = 0
    steps = 0
    model.train()
    for batch_images, batch_labels in loader:
        batch_images = batch_images.to(device)
        batch_labels = batch_labels.to(device)
        optimizer.zero_grad()
        logits = model(batch_images)
        loss = loss_fn(logits, batch_labels)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()  # host sync: waits for the step to finish, every step
        predictions = logits.argmax(dim=1).cpu()  # host sync: a device-to-host copy per step
        correct += int((predictions == batch_labels.cpu()).sum())
        seen += len(predictions)
        steps += 1
    mean_loss = running_loss / max(steps, 1)
    print(f"host_sync: {steps} steps, mean loss {mean_loss:.4f}, accuracy {correct / max(seen, 1):.3f}")


if __name__ == "__main__":
    main()
