"""An image classifier whose Dataset decodes each image in Python, then flips it at random.

Planted problem (``dataloader-starvation``, loading whose costly part can be made once
though the items are augmented at random): the images are kept as the bytes they were read
as, and ``decode`` unpacks them row by row with ``struct`` (about a millisecond an image),
in the main process (``num_workers=0``); ``__getitem__`` then normalises the image and
flips it with Python's ``random``, so no two epochs give the same items. The decode does
not depend on the flip: decoded once before training (``--precompute``), only the
normalisation and the flip stay per item.

Two fixes: the images decoded once, or workers that decode the next batches while the model
trains (``--num-workers N``, with ``--torch-threads`` for the main process where the
workers take the cores). On a machine of few cores the workers share them with the model's
operators and save far less than decoding once.

    python examples/decode_and_flip.py --steps 40
    python examples/decode_and_flip.py --steps 40 --precompute                        # decoded once
    python examples/decode_and_flip.py --steps 40 --num-workers 1 --torch-threads 1   # a worker
"""

from __future__ import annotations

import argparse
import random
import struct
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SIZE = 64
CLASSES = 10


class EncodedImages(Dataset):
    """Images kept as raw bytes (3 x 64 x 64, row by row); each decoded when it is asked for,
    normalised and flipped at random."""

    def __init__(self, count: int, seed: int = 0, precompute: bool = False):
        rng = np.random.default_rng(seed)
        self.blobs = [rng.integers(0, 256, SIZE * SIZE * 3, dtype=np.uint8).tobytes() for _ in range(count)]
        self.labels = rng.integers(0, CLASSES, count).tolist()
        self.decoded = [self.decode(blob) for blob in self.blobs] if precompute else None

    @staticmethod
    def decode(blob: bytes) -> np.ndarray:
        """The bytes unpacked row by row, as a codec written in Python would: height x width x 3."""
        rows = [struct.unpack_from(f"{SIZE * 3}B", blob, row * SIZE * 3) for row in range(SIZE)]
        return np.asarray(rows, dtype=np.float32).reshape(SIZE, SIZE, 3)

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.decoded[index] if self.decoded is not None else self.decode(self.blobs[index])
        image = image.transpose(2, 0, 1)
        image = (image - image.mean()) / (image.std() + 1e-6)
        if random.random() < 0.5:
            image = image[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image)), self.labels[index]


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
    parser.add_argument("--precompute", action="store_true", help="decode every image once before training")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    loader = DataLoader(EncodedImages(args.images, args.seed, args.precompute), batch_size=args.batch_size,
                        shuffle=True, num_workers=args.num_workers, persistent_workers=args.num_workers > 0)
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
    print(f"decode_and_flip: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
