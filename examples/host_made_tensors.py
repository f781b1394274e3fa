"""A denoising step that makes its noise and positions on the host, then copies them.

Planted problem (``cpu-tensor-copied-each-step``, on a GPU): every step draws the noise
with ``torch.randn(shape).to(device)`` and the positions with
``torch.arange(n).to(device)``: both are filled in host memory and copied from pageable
memory to the GPU, the host waiting for each copy. The fix (``--fixed``) makes them on
the device: ``torch.randn(shape, device=device)``, one kernel and no copy.

On a CPU the copies are no-ops; the script still trains.

    python examples/host_made_tensors.py --steps 20
    python examples/host_made_tensors.py --steps 20 --fixed
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

WARMUP = 2  # steps before the timed ones: allocation, autotuning, lazy initialisation

TOKENS = 256
WIDTH = 256


def build_model() -> nn.Module:
    """A position-embedded MLP that predicts the noise added to its input."""
    return nn.ModuleDict({"positions": nn.Embedding(TOKENS, WIDTH),
                          "body": nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--fixed", action="store_true", help="make the noise and positions on the device")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model().to(device)
    clean = torch.randn(args.batch_size, TOKENS, WIDTH, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    started, timed = time.perf_counter(), args.steps
    for step in range(args.steps):
        if step == WARMUP and args.steps > WARMUP:  # time the steps after the warm-up ones
            if device.type == "cuda":
                torch.cuda.synchronize()
            started, timed = time.perf_counter(), args.steps - WARMUP
        if args.fixed:
            noise = torch.randn(clean.shape, device=device)
            positions = torch.arange(TOKENS, device=device)
        else:
            noise = torch.randn(clean.shape).to(device)  # planted: made on the host, copied every step
            positions = torch.arange(TOKENS).to(device)  # planted: the same positions copied every step
        noisy = clean + noise + model["positions"](positions)
        loss = nn.functional.mse_loss(model["body"](noisy), noise)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    print(f"host_made_tensors: {args.steps} steps on {device}, {elapsed / timed * 1e3:.2f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
