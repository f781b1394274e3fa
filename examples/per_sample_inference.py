"""An inference loop that runs the model on one sample at a time.

A classifier scores a list of samples by calling the model on each one alone (a batch of
one) and reading the prediction back with ``.item()``: every call pays the full dispatch of
every operator for one row of work, and the loop runs as many model calls as there are
samples. ``--batched`` scores the same samples in batches of 64, one model call per batch.

It prints its own pace as the time per sample ("ms/step": a step is one sample's model
call, as advisor counts it), after two warm-up calls:

    python examples/per_sample_inference.py --samples 2000
    python examples/per_sample_inference.py --samples 2000 --batched
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

FEATURES = 64
HIDDEN = 128
CLASSES = 10
BATCH = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--batched", action="store_true", help=f"the fix: score {BATCH} samples per model call")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    samples = torch.randn(args.samples, FEATURES)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES)).eval()
    predictions: list[int] = []
    with torch.inference_mode():
        start = None
        if args.batched:
            for i in range(0, args.samples, BATCH):
                if i == 2 * BATCH:
                    start, done = time.perf_counter(), i
                predictions.extend(model(samples[i:i + BATCH]).argmax(dim=1).tolist())
        else:
            for i in range(args.samples):
                if i == 2:
                    start, done = time.perf_counter(), i
                predictions.append(int(model(samples[i:i + 1]).argmax(dim=1).item()))  # the smell: one at a time
    timed = time.perf_counter() - start
    per_sample = 1000 * timed / max(args.samples - done, 1)
    print(f"per_sample_inference: {args.samples} samples, {per_sample:.4f} ms/step (a step: one sample), "
          f"{sum(predictions)} summed predictions")


if __name__ == "__main__":
    main()
