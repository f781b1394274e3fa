"""A training loop whose input batches reach the GPU from pageable host memory.

Planted problem (``sync-memcpy-stall``, on a GPU): the DataLoader hands out batches in
ordinary, pageable host memory (``pin_memory=False``) and each step copies them with
``.to(device)`` (no ``non_blocking``). The GPU's copy engine can only read page-locked
memory, so the driver stages a pageable copy through a pinned bounce buffer and the host
thread waits until the copy is done: it cannot queue the step's kernels meanwhile, and
the copy cannot overlap the previous step's work. The batches here are large (64 images
of 3x96x96, 7 MB) and the model is a cheap patch-embedding CNN, so on a GPU the copy is
most of the step. The line that makes the copy is marked ``planted:`` below.

The fix (``--pinned``): ``DataLoader(pin_memory=True)`` and ``.to(device,
non_blocking=True)``; the copy then runs on the copy engine while the host goes on.
Pinning is itself a host copy, done in the main process when ``num_workers=0``; with
workers (``--num-workers 2``) it runs in the DataLoader's pin-memory thread, beside the
step, so the step waits on neither. On a CPU the ``.to`` is a no-op and there is nothing
to fix; the script still trains.

    python examples/pageable_copies.py --steps 20
    python examples/pageable_copies.py --steps 20 --pinned --num-workers 2   # the fix
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CHANNELS = 3
SIZE = 96
PATCH = 8
CLASSES = 10
POOL_BATCHES = 4  # distinct batches kept in memory; the dataset cycles through them


class SyntheticBatches(Dataset):
    """Whole batches of synthetic images, each a view into one pageable host tensor.

    Handing out ready batches keeps the data loader itself cheap (a slice, no per-sample
    collation), so the copy to the device is what the step waits on, not the loader."""

    def __init__(self, steps: int, batch_size: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.steps = steps
        self.batch_size = batch_size
        self.images = torch.randn(POOL_BATCHES * batch_size, CHANNELS, SIZE, SIZE, generator=generator)
        self.labels = torch.randint(0, CLASSES, (POOL_BATCHES * batch_size,), generator=generator)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (index % POOL_BATCHES) * self.batch_size
        end = start + self.batch_size
        return self.images[start:end], self.labels[start:end]


def build_model() -> nn.Sequential:
    """A patch-embedding CNN: one strided convolution cuts each image into 8x8 patches,
    so the compute per image is small next to the bytes of the image."""
    return nn.Sequential(
        nn.Conv2d(CHANNELS, 32, kernel_size=PATCH, stride=PATCH),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, CLASSES),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--pinned", action="store_true",
                        help="the fix: pin the batches in the DataLoader and copy them with non_blocking=True")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (one keeps a tiny model's timing steady)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # Pinning needs an accelerator; on a CPU run --pinned changes nothing.
    pin = args.pinned and device.type == "cuda"
    loader = DataLoader(
        SyntheticBatches(args.steps, args.batch_size, args.seed),
        batch_size=None,  # the dataset yields whole batches
        shuffle=False,
        num_workers=args.num_workers,
        pin_memory=pin,
    )
    model = build_model().to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    model.train()
    steps = 0
    loss = torch.zeros(())
    for images, labels in loader:
        if pin:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        else:
            images = images.to(device)  # planted: a pageable host-to-device copy that blocks the host
            labels = labels.to(device)  # planted: a pageable host-to-device copy that blocks the host
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        steps += 1
    copies = "none: the data is already on the CPU" if device.type == "cpu" else ("pinned" if pin else "pageable")
    print(f"pageable_copies: {steps} steps on {device} (copies: {copies}), last loss {loss.detach():.4f}")


if __name__ == "__main__":
    main()
