"""An image training loop that augments its batches one image at a time, without a DataLoader.

Planted problem: the images are in memory and the loop slices shuffled batches itself, but
before each step it calls ``augment(image)`` on every image of the batch: pad by 4, crop a
random 32x32 window, flip left-right at random, normalise, each a separate small tensor op
on one image, then ``torch.stack``. With a batch of 128 that is about a thousand tiny ops and
Python calls a step, close to half of the step next to a small CNN trained with SGD.
There is no DataLoader, so there is no Dataloader phase to blame: the time is in
``augment``, before the model's forward, backward and optimizer step.

The fix, ``--vectorized``: ``augment_batch(images)`` does the same augmentation on the
whole batch at once: one pad, then one gather that takes every image's crop, flipped or
not, then the normalisation.

    python examples/augment_loop.py --steps 20
    python examples/augment_loop.py --steps 20 --vectorized   # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS = 3
SIZE = 32
PAD = 4
CLASSES = 10
MEAN = torch.tensor([0.49, 0.48, 0.45]).view(CHANNELS, 1, 1)
STD = torch.tensor([0.25, 0.24, 0.26]).view(CHANNELS, 1, 1)


def augment(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop with padding, random horizontal flip and normalisation, for one CxHxW image."""
    padded = F.pad(image, (PAD, PAD, PAD, PAD))
    top, left = torch.randint(0, 2 * PAD + 1, (2,), generator=generator).tolist()
    crop = padded[:, top:top + SIZE, left:left + SIZE]
    if torch.rand((), generator=generator) < 0.5:
        crop = crop.flip(-1)
    return (crop - MEAN) / STD


def augment_batch(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The same augmentation for a whole NxCxHxW batch, with batched tensor ops."""
    count, channels = images.shape[:2]
    padded = F.pad(images, (PAD, PAD, PAD, PAD)).flatten(2)  # N x C x (H+2P)*(W+2P)
    top, left = torch.randint(0, 2 * PAD + 1, (2, count, 1), generator=generator)
    flip = torch.rand(count, 1, generator=generator) < 0.5
    offsets = torch.arange(SIZE)
    rows = top + offsets  # N x H: the rows each crop takes
    cols = left + torch.where(flip, offsets.flip(0), offsets)  # N x W: its columns, reversed to flip
    where = (rows[:, :, None] * (SIZE + 2 * PAD) + cols[:, None, :]).view(count, 1, SIZE * SIZE)
    crops = padded.gather(2, where.expand(count, channels, SIZE * SIZE))  # every crop in one gather
    return crops.view(count, channels, SIZE, SIZE).sub_(MEAN).div_(STD)


def build_model() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(CHANNELS, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--vectorized", action="store_true", help="the fix: augment the whole batch at once")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(args.seed)
    samples = args.steps * args.batch_size
    images = torch.rand(samples, CHANNELS, SIZE, SIZE, generator=generator)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    model = build_model().to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    ends, waits = [], []
    last = time.perf_counter()
    order = torch.randperm(samples, generator=generator)
    model.train()
    for start in range(0, samples, args.batch_size):
        index = order[start:start + args.batch_size]
        if args.vectorized:
            batch = augment_batch(images[index], generator)
        else:
            batch = torch.stack([augment(images[i], generator) for i in index.tolist()])
        waits.append(time.perf_counter() - last)  # time spent getting this batch ready
        batch, batch_labels = batch.to(device), labels[index].to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch), batch_labels)
        loss.backward()
        optimizer.step()
        last = time.perf_counter()
        ends.append(last)
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"augment_loop: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.1f} ms/step, "
          f"augmentation {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
