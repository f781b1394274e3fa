"""A deep, narrow model trained four samples at a time: the GPU waits on the host.

Planted problem (``low-gpu-utilization``, on a GPU): each step runs some two hundred
kernels (twelve residual blocks of LayerNorm, Linear and GELU, forward and backward, then
Adam), and with a batch of 4 each kernel finishes in a few microseconds, less than the
host takes to launch the next one. The GPU is idle most of the step while the host is in
Python and the CUDA launch path; the advisor should show the idle time under
"launching". A larger batch (``--batch-size 256``) does the same number of launches per
step on 64 times the data, so the GPU has work while the host launches; CUDA graphs or
torch.compile would cut the launches themselves.

On a CPU there are no launches to wait for; the script still trains.

    python examples/small_batch.py --steps 20
    python examples/small_batch.py --steps 20 --batch-size 256   # the fix
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 256
BLOCKS = 12
CLASSES = 10


class Block(nn.Module):
    """x + GELU(Linear(LayerNorm(x))): three small kernels forward, more backward."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(self.norm(x)))


def build_model(width: int = FEATURES, blocks: int = BLOCKS) -> nn.Sequential:
    return nn.Sequential(*(Block(width) for _ in range(blocks)), nn.Linear(width, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=4, help="samples per step (the fix: 256)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (one keeps a tiny model's timing steady)"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    samples = args.steps * args.batch_size
    inputs = torch.randn(samples, FEATURES)
    labels = torch.randint(0, CLASSES, (samples,))
    # Pinned batches and non_blocking copies: the input path is not what is planted here.
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=args.batch_size, shuffle=False,
                        pin_memory=device.type == "cuda")
    model = build_model().to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    model.train()
    steps = 0
    loss = torch.zeros(())
    for batch_inputs, batch_labels in loader:
        batch_inputs = batch_inputs.to(device, non_blocking=True)
        batch_labels = batch_labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_inputs), batch_labels)
        loss.backward()
        optimizer.step()
        steps += 1
    print(f"small_batch: {steps} steps of {args.batch_size} samples on {device}, last loss {loss.detach():.4f}")


if __name__ == "__main__":
    main()
