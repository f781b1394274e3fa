"""A training loop that measures validation accuracy after every step.

The script marks its validation with ``torch.profiler.record_function("validate")``, as a
team does to watch it, and runs it over the whole validation set after every training
step, so most of each step is spent validating. The example rule pack's slow-user-region
rule must fire on the "validate" range (rules/examples/team.yaml); the fix, ``--every N``,
validates every N steps.

    python examples/validate_every_step.py --steps 20
    python examples/validate_every_step.py --steps 20 --every 10
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.profiler import record_function
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 128
HIDDEN = 256
CLASSES = 10
VALIDATION_SAMPLES = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--every", type=int, default=1, help="validate every N steps (the fix: 10 or more)")
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
    val_inputs = torch.randn(VALIDATION_SAMPLES, FEATURES)
    val_labels = torch.randint(0, CLASSES, (VALIDATION_SAMPLES,))
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=args.batch_size, shuffle=False)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    accuracy = torch.zeros(())
    for step, (batch_inputs, batch_labels) in enumerate(loader):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_inputs), batch_labels)
        loss.backward()
        optimizer.step()
        if step % args.every == 0:
            with record_function("validate"), torch.no_grad():
                model.eval()
                # Several passes over the set, as test-time augmentation would make.
                for _ in range(4):
                    predictions = model(val_inputs).argmax(dim=1)
                accuracy = (predictions == val_labels).float().mean()
    print(f"validate_every_step: {args.steps} steps, last loss {loss.detach():.4f}, "
          f"accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
