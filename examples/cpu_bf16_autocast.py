"""An MLP trained on the CPU under bf16 autocast: fast where the CPU has bf16 units, many
times slower where it has not.

Planted problem (``cpu-dtype-speed``, on a CPU without AVX512-BF16 or AMX: AVX2 servers,
most laptops): every step's matrix work runs under ``torch.autocast("cpu",
dtype=torch.bfloat16)``. Without bf16 units torch converts, and the Linear layers run
several times slower than the same layers in fp32, plus the casts autocast adds. The fix
(``--fp32``) leaves autocast off; on a CPU with AMX autocast is the faster choice, and the
advisor says neither there.

    python examples/cpu_bf16_autocast.py --steps 10
    python examples/cpu_bf16_autocast.py --steps 10 --fp32   # the fix on a CPU without bf16 units
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

FEATURES = 256
HIDDEN = 512
CLASSES = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fp32", action="store_true", help="the fix: no autocast, the matrix work in fp32")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps timings steady)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                          nn.Linear(HIDDEN, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    inputs = torch.randn(args.steps, args.batch_size, FEATURES)
    labels = torch.randint(0, CLASSES, (args.steps, args.batch_size))
    for step in range(args.steps):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.fp32):
            loss = loss_fn(model(inputs[step]), labels[step])
        loss.backward()
        optimizer.step()
    print(f"cpu_bf16_autocast: {args.steps} steps in {'fp32' if args.fp32 else 'bf16 autocast'}, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
