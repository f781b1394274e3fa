"""A data set already in memory, handed out one sample at a time by the DataLoader.

Planted problem (``dataloader-starvation``): the whole data set is two in-memory tensors in
a ``TensorDataset``, and ``DataLoader(batch_size=64, shuffle=True)`` builds each batch the
usual way: 64 calls to ``__getitem__``, each indexing both tensors for one row, then
``default_collate`` stacks the 64 rows again. That per-item Python is a real share of a
step this short (a small MLP with SGD). Worker processes do not help here, they make it
slower (``--num-workers 2``): every batch is then pickled through shared memory to the
main process, and the workers take the same two cores the training needs.

The fix, ``--batched``: let the sampler hand out a whole batch of indices (a
``BatchSampler`` over a ``RandomSampler``, ``batch_size=None``) so each batch is one
``X[indices]`` per tensor, with no per-item Python and no collation.

    python examples/in_memory_loop.py --steps 200
    python examples/in_memory_loop.py --steps 200 --num-workers 2   # slower still
    python examples/in_memory_loop.py --steps 200 --batched         # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

FEATURES = 64
HIDDEN = 64
CLASSES = 10


def build_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--batched", action="store_true", help="the fix: index the tensors a whole batch at a time")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    samples = args.steps * args.batch_size
    centres = torch.randn(CLASSES, FEATURES)
    labels = torch.randint(0, CLASSES, (samples,))
    inputs = 0.3 * centres[labels] + torch.randn(samples, FEATURES)
    dataset = TensorDataset(inputs, labels)
    if args.batched:
        batches = BatchSampler(RandomSampler(dataset), batch_size=args.batch_size, drop_last=False)
        loader = DataLoader(dataset, sampler=batches, batch_size=None, num_workers=args.num_workers)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers)
    model = build_model().to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    ends, waits = [], []
    last = time.perf_counter()
    model.train()
    for batch_inputs, batch_labels in loader:
        waits.append(time.perf_counter() - last)  # time spent waiting for this batch
        batch_inputs, batch_labels = batch_inputs.to(device), batch_labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_inputs), batch_labels)
        loss.backward()
        optimizer.step()
        last = time.perf_counter()
        ends.append(last)
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"in_memory_loop: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.2f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
