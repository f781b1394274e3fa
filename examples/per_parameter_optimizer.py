"""A model of many small layers whose optimizer works parameter by parameter.

Planted problems (on a GPU): the optimizer is built with ``foreach=False``, so each step
updates its 122 parameters one at a time (a few operators and kernels each,
``optimizer-not-fused``), and ``zero_grad(set_to_none=False)`` fills every gradient with
zeros before backward adds to them (a fill kernel per parameter,
``grad-zeroing-memsets``). The fix is two words: ``foreach=True`` (or ``fused=True``,
``--foreach``) and ``set_to_none=True`` (``--set-to-none``), torch's defaults on a GPU;
``--fixed`` applies both.

On a CPU the single-tensor step is the faster one and there are no launches; the script
still trains, and the rules stay silent there.

    python examples/per_parameter_optimizer.py --steps 20
    python examples/per_parameter_optimizer.py --steps 20 --foreach  # one fix, then the other
    python examples/per_parameter_optimizer.py --steps 20 --fixed    # foreach and set_to_none
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

WARMUP = 2  # steps before the timed ones: allocation, autotuning, lazy initialisation

WIDTH = 128
LAYERS = 30
CLASSES = 10


def build_model() -> nn.Sequential:
    """LAYERS blocks of Linear + LayerNorm (four parameters each), then a classifier."""
    blocks = []
    for _ in range(LAYERS):
        blocks += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--foreach", action="store_true", help="the multi-tensor optimizer (foreach=True)")
    parser.add_argument("--set-to-none", action="store_true", help="zero_grad(set_to_none=True)")
    parser.add_argument("--fixed", action="store_true", help="both: --foreach --set-to-none")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model().to(device)
    inputs = torch.randn(args.batch_size, WIDTH, device=device)
    labels = torch.randint(0, CLASSES, (args.batch_size,), device=device)
    loss_fn = nn.CrossEntropyLoss()
    # planted: foreach=False updates each parameter with its own operators and kernels
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4,
                                foreach=args.foreach or args.fixed)

    started, timed = time.perf_counter(), args.steps
    for step in range(args.steps):
        if step == WARMUP and args.steps > WARMUP:  # time the steps after the warm-up ones
            if device.type == "cuda":
                torch.cuda.synchronize()
            started, timed = time.perf_counter(), args.steps - WARMUP
        optimizer.zero_grad(set_to_none=args.set_to_none or args.fixed)  # planted: False zeroes every gradient
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    print(f"per_parameter_optimizer: {args.steps} steps on {device}, {elapsed / timed * 1e3:.2f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
