"""A ranking model scoring candidates in batches, with autograd left on.

Planted problem (``autograd-in-inference``): the scoring loop calls the model in eval mode
but outside ``torch.no_grad()``: every forward records the autograd graph (a node per
differentiable operator, the tensors each saves for a backward that never runs), which on
a model of small operators costs a good share of each batch, and keeps every batch's
activations alive for as long as its scores are.

The fix, ``--no-grad``: the loop under ``torch.inference_mode()`` (``torch.no_grad()`` too).

    python examples/scoring_with_grad.py --steps 60
    python examples/scoring_with_grad.py --steps 60 --no-grad   # the fix
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch import nn

FEATURES = 96
WIDTH = 192
LAYERS = 6


class Ranker(nn.Module):
    """A residual MLP over a candidate's features: a score per candidate."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU())
                                    for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="batches scored")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--no-grad", action="store_true", help="the fix: score under torch.inference_mode()")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = Ranker().eval()
    candidates = torch.randn(args.steps * args.batch_size, FEATURES)
    best, took = [], []
    scoring = torch.inference_mode() if args.no_grad else contextlib.nullcontext()
    with scoring:
        for step in range(args.steps):
            start = time.perf_counter()
            batch = candidates[step * args.batch_size:(step + 1) * args.batch_size]
            scores = model(batch)
            best.append(int(scores.argmax()))
            took.append(time.perf_counter() - start)
    timed = took[2:] or took
    print(f"scoring_with_grad: {args.steps} steps, {1e3 * sum(timed) / len(timed):.2f} ms/step, "
          f"best candidates {best[:4]}")


if __name__ == "__main__":
    main()
