"""A sequence classifier whose forward pools each sequence's tokens row by row.

Planted problem (``batch-loop-in-model``): the batch holds sequences of different
lengths, padded to one length; ``forward`` averages each sequence's real tokens with
``h[i, :lengths[i]].mean(0)`` for every row i of the batch and stacks the results. Each row
is an ``aten::select``, a slice, a mean (and ``lengths[i]`` read back as a Python number),
and each of those leaves an autograd node: ``SelectBackward0`` writes each row's gradient
into a zero tensor the size of the whole batch, so backward spends more on the loop than
forward does.

The fix, ``--batched``: one masked sum over the batch, the same pooled vectors.

    python examples/masked_pooling.py --steps 40
    python examples/masked_pooling.py --steps 40 --batched   # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

TOKENS, FEATURES, HIDDEN, CLASSES = 48, 64, 64, 4


class Pooled(nn.Module):
    """A token encoder, mean pooling over each sequence's real tokens, a linear head."""

    def __init__(self, batched: bool) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU())
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.batched = batched

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.encoder(tokens)  # [batch, TOKENS, HIDDEN]
        if self.batched:
            mask = torch.arange(h.shape[1], device=h.device)[None, :] < lengths[:, None]
            pooled = (h * mask.unsqueeze(-1)).sum(1) / lengths[:, None]
        else:
            pooled = torch.stack([h[i, :lengths[i]].mean(0) for i in range(h.shape[0])])
        return self.head(pooled)


def build_model(batched: bool = False) -> Pooled:
    return Pooled(batched)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batched", action="store_true", help="the fix: one masked sum over the batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    samples = args.steps * args.batch_size
    tokens = torch.randn(samples, TOKENS, FEATURES, device=device)
    lengths = torch.randint(4, TOKENS + 1, (samples,), device=device)
    labels = torch.randint(0, CLASSES, (samples,), device=device)
    model = build_model(args.batched).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    ends = []
    for start in range(0, samples, args.batch_size):
        end = start + args.batch_size
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens[start:end], lengths[start:end]), labels[start:end])
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"masked_pooling: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
