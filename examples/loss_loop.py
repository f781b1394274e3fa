"""A text classifier whose label-smoothed loss is written as a Python loop over the batch.

Planted problem (``host-bound``): ``smoothed_loss`` takes each row of the logits in turn
(a log-softmax, the target's entry, the mean, a weighted sum), five or six small operators
an item, so a batch of 128 makes some 700 tiny operators a step, outside the model's phases.
Each of them also leaves an autograd node that ``loss.backward()`` runs: the loop's cost
is paid twice, the second time inside the Backward phase, where nothing names the loop.
The model is a small MLP over bag-of-features inputs, trained with SGD.

The fix, ``--vectorized``: one ``F.cross_entropy(logits, target, label_smoothing=0.1)``
over the whole batch, the same loss.

    python examples/loss_loop.py --steps 40
    python examples/loss_loop.py --steps 40 --vectorized   # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, HIDDEN, CLASSES = 300, 512, 20
SMOOTHING = 0.1


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Label-smoothed cross-entropy, one item at a time."""
    total = logits.new_zeros(())
    for i in range(logits.shape[0]):
        log_p = F.log_softmax(logits[i], dim=-1)
        total = total + (1 - SMOOTHING) * -log_p[target[i]] + SMOOTHING * -log_p.mean()
    return total / logits.shape[0]


def smoothed_loss_batch(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The same loss over the whole batch."""
    return F.cross_entropy(logits, target, label_smoothing=SMOOTHING)


def build_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--vectorized", action="store_true", help="the fix: the loss over the whole batch at once")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    samples = args.steps * args.batch_size
    inputs = torch.randn(samples, FEATURES, device=device)
    labels = torch.randint(0, CLASSES, (samples,), device=device)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = smoothed_loss_batch if args.vectorized else smoothed_loss

    ends = []
    for start in range(0, samples, args.batch_size):
        batch, target = inputs[start:start + args.batch_size], labels[start:start + args.batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch), target)
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"loss_loop: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.1f} ms/step, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
