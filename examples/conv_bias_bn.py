"""A small CNN whose convolutions carry a bias that the batch norm after each cancels.

Planted problem (``conv-bias-before-batchnorm``): every ``nn.Conv2d`` is built with the
default ``bias=True`` and feeds an ``nn.BatchNorm2d``, which subtracts each channel's
mean: the bias is added forward and its gradient computed backward for nothing. The fix
(``--fixed``) builds the convolutions with ``bias=False``; the model computes the same
function, batch norm's shift taking the bias's place.

    python examples/conv_bias_bn.py --steps 20
    python examples/conv_bias_bn.py --steps 20 --fixed
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from torch import nn

WARMUP = 2  # steps before the timed ones: allocation, autotuning, lazy initialisation

CHANNELS = (3, 32, 64, 64)
CLASSES = 10


def build_model(bias: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for c_in, c_out in itertools.pairwise(CHANNELS):
        # planted: bias=True before BatchNorm2d, which cancels it
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=bias), nn.BatchNorm2d(c_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(CHANNELS[-1], CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fixed", action="store_true", help="convolutions with bias=False")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on a CPU")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = build_model(bias=not args.fixed).to(device)
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    labels = torch.randint(0, CLASSES, (args.batch_size,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    started, timed = time.perf_counter(), args.steps
    for step in range(args.steps):
        if step == WARMUP and args.steps > WARMUP:  # time the steps after the warm-up ones
            if device.type == "cuda":
                torch.cuda.synchronize()
            started, timed = time.perf_counter(), args.steps - WARMUP
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    print(f"conv_bias_bn: {args.steps} steps on {device}, {elapsed / timed * 1e3:.2f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
