"""Training in child processes started by torch.multiprocessing.spawn; the parent only waits.

Planted problem: the work is not in the process you launched. ``main()`` starts
``--procs`` children with ``torch.multiprocessing.spawn(train, nprocs=2)`` and then blocks
until they finish; each child (a "rank") builds a small MLP and trains it on its own
synthetic data for ``--steps`` steps through a DataLoader. A profiler that watches only the
parent sees one idle process with no steps, no operators and nothing to rank, however slow
the ranks are. With ``--gloo`` the children also form a gloo process group (a ``file://``
rendezvous in a temporary folder) and average their gradients by hand with
``all_reduce`` after each backward, as DistributedDataParallel would, so each rank also
waits on the others.

The fix is on the profiler's side: profile each rank (the children, not the parent), and
report them per rank or side by side.

    python examples/spawn_train.py --steps 50
    python examples/spawn_train.py --steps 50 --gloo
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 64
HIDDEN = 256
CLASSES = 10


def build_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def train(rank: int, args: argparse.Namespace, rendezvous: str, results) -> None:
    """One rank: its own data, the same initial model on every rank, --steps steps."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{rank % torch.cuda.device_count()}")
    if args.gloo:
        dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=args.procs)
    torch.manual_seed(args.seed)
    model = build_model().to(device)
    generator = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    samples = args.steps * args.batch_size
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    inputs = torch.randn(samples, FEATURES, generator=generator) + 0.1 * labels[:, None]
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=args.batch_size, shuffle=True)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    ends, waits = [], []
    last = time.perf_counter()
    for batch_inputs, batch_labels in loader:
        waits.append(time.perf_counter() - last)  # time spent waiting for this batch
        batch_inputs, batch_labels = batch_inputs.to(device), batch_labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_inputs), batch_labels)
        loss.backward()
        if args.gloo:
            for parameter in model.parameters():  # what DistributedDataParallel does for you
                dist.all_reduce(parameter.grad)
                parameter.grad /= args.procs
        optimizer.step()
        last = time.perf_counter()
        ends.append(last)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    results.put((rank, len(ends), timed / max(len(ends) - 2, 1), sum(waits[2:]) / timed, loss.item()))
    if args.gloo:
        # Every rank done before any tears its connections down: gloo aborts a rank whose
        # peer left first ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps (batches) on each rank")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--procs", type=int, default=2, help="child processes (ranks) to spawn")
    parser.add_argument("--gloo", action="store_true", help="a gloo process group; all-reduce the gradients")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads in each rank")
    args = parser.parse_args()

    results = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(train, args=(args, f"file://{folder}/rendezvous", results), nprocs=args.procs)
    ranks = sorted(results.get() for _ in range(args.procs))
    step_ms = sum(1000 * r[2] for r in ranks) / len(ranks)
    wait = sum(100 * r[3] for r in ranks) / len(ranks)
    per_rank = ", ".join(f"rank {r[0]} {1000 * r[2]:.2f} ms" for r in ranks)
    print(f"spawn_train: {ranks[0][1]} steps on each of {len(ranks)} ranks, {step_ms:.2f} ms/step (mean of ranks: "
          f"{per_rank}), loader wait {wait:.1f}% of the step, last loss {ranks[0][4]:.4f}")


if __name__ == "__main__":
    main()
