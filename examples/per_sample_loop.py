"""A training loop that runs the model one sample at a time.

Each step slices its batch into single samples and calls the model, the loss and (in
backward) their gradients once per sample, so a step of 32 samples makes thousands of
operator calls where one batched call would make a few dozen. On a GPU each of those is at
least one kernel launch, and the host's launch rate bounds the step. The example rule
pack's too-many-launches rule must fire here (rules/examples/team.yaml); the fix,
``--batched``, runs the batch in one call.

    python examples/per_sample_loop.py --steps 20
    python examples/per_sample_loop.py --steps 20 --batched
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 32
HIDDEN = 64
CLASSES = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batched", action="store_true", help="the fix: one call for the whole batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    samples = args.steps * args.batch_size
    inputs = torch.randn(samples, FEATURES)
    labels = torch.randint(0, CLASSES, (samples,))
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=args.batch_size, shuffle=False)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    model.train()
    ends = [time.perf_counter()]
    for batch_inputs, batch_labels in loader:
        optimizer.zero_grad(set_to_none=True)
        if args.batched:
            loss = loss_fn(model(batch_inputs), batch_labels)
        else:
            loss = torch.zeros(())
            for i in range(batch_inputs.shape[0]):  # the smell: one sample per call
                loss = loss + loss_fn(model(batch_inputs[i:i + 1]), batch_labels[i:i + 1])
            loss = loss / batch_inputs.shape[0]
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
    # The script's own pace, for comparing with and without a profiler: the mean step
    # after two warm-up steps.
    timed = ends[-1] - ends[min(2, len(ends) - 1)]
    print(f"per_sample_loop: {args.steps} steps, {1000 * timed / max(len(ends) - 3, 1):.2f} ms/step, "
          f"last loss {loss.detach():.4f}")


if __name__ == "__main__":
    main()
