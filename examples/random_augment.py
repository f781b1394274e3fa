"""A small image classifier whose Dataset augments each image at random, one item at a time.

Planted problem (``dataloader-starvation``, loading that only workers can take off the
step): ``Augmented.__getitem__`` crops, flips, jitters and adds noise to one image with
torch's operators, drawing new random numbers every time, in the main process
(``num_workers=0``). That is about half a millisecond of CPU work an item, 32 items a batch,
beside a small convolutional network: about half of each step waits on the loader. The
items differ every epoch, so they cannot be made once before training; worker processes
that augment the next batches while the model trains are the fix.

On a machine of few cores the workers share the cores with the model's operators, which run
on a thread per core by default: the main process then keeps to what the workers leave
(``--torch-threads``), and its operators run slower on fewer threads, which takes back part
of what the workers save.

    python examples/random_augment.py --steps 40
    python examples/random_augment.py --steps 40 --num-workers 1 --torch-threads 1   # a worker
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SIZE = 64  # the crop the model sees
PAD = 8  # the stored images are this much larger: the crop's room to move
CLASSES = 10


class Augmented(Dataset):
    """Images kept as they were decoded (uint8, 3 x 72 x 72); each item cropped, flipped,
    jittered and noised at random when it is asked for."""

    def __init__(self, count: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (count, 3, SIZE + PAD, SIZE + PAD), dtype=torch.uint8,
                                    generator=generator)
        self.labels = torch.randint(0, CLASSES, (count,), generator=generator)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        top, left = torch.randint(0, PAD + 1, (2,)).tolist()
        image = self.images[index, :, top:top + SIZE, left:left + SIZE].float() / 255
        if torch.rand(()) < 0.5:
            image = image.flip(2)
        brightness, contrast = (1 + 0.4 * (torch.rand(2) - 0.5)).tolist()
        mean = image.mean()
        image = ((image - mean) * contrast + mean * brightness).clamp(0, 1)
        image = image + 0.03 * torch.randn_like(image)
        image = torch.rot90(image, int(torch.randint(0, 4, ())), dims=(1, 2))
        return ((image - 0.5) / 0.25).contiguous(), int(self.labels[index])


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--images", type=int, default=2048, help="images in the dataset (epochs repeat them)")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the main process's intra-op threads (0: torch's default, a thread per core)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    loader = DataLoader(Augmented(args.images, args.seed), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.num_workers, persistent_workers=args.num_workers > 0)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    ends, waits, step = [], [], 0
    last = time.perf_counter()
    while step < args.steps:  # epochs, until the steps asked for are done
        for images, labels in loader:
            waits.append(time.perf_counter() - last)  # time spent waiting for this batch
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images), labels)
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
    print(f"random_augment: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
