"""Data-parallel training where rank 0 evaluates every step: the other ranks wait for it.

Planted problem (``straggler-rank``): after each optimizer step rank 0 alone runs a
validation pass (``--validate-every 1``), so at the next step's gradient all-reduce every
other rank waits for rank 0. Each rank's own profile shows only the symptom (long,
exposed collectives on the waiting ranks); the job's profile shows the cause. The fix
validates rarely (``--validate-every 50``), or spreads validation over the ranks.

With ``--validate-every 0`` it is a healthy DDP job. It runs on CPUs with gloo, or on GPUs
with NCCL, under torchrun:

    torchrun --nproc-per-node=2 examples/ddp_straggler.py --steps 12
    advisor diagnose torchrun --nproc-per-node=2 examples/ddp_straggler.py --steps 12
    advisor diagnose torchrun --nproc-per-node=2 examples/ddp_straggler.py --steps 12 --validate-every 50
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

WIDTH = 256
CLASSES = 10
WARMUP = 2  # steps before the timed ones


def evaluate(model: nn.Module, val_inputs: torch.Tensor, val_labels: torch.Tensor) -> float:
    """Accuracy on the validation set, batch by batch."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(val_inputs), 64):
            logits = model(val_inputs[start:start + 64])
            correct += int((logits.argmax(1) == val_labels[start:start + 64]).sum())
    model.train()
    return correct / len(val_inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--validate-every", type=int, default=1,
                        help="rank 0 validates every N steps (0: never)")
    parser.add_argument("--val-size", type=int, default=2048, help="validation samples")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("ddp_straggler: run it under torchrun (torchrun --nproc-per-node=2 ...)")

    on_gpu = args.device.startswith("cuda")
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if on_gpu else "cpu")
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                          nn.Linear(WIDTH, CLASSES)).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(args.seed + rank)
    inputs = torch.randn(args.batch_size, WIDTH, generator=generator).to(device)
    labels = torch.randint(0, CLASSES, (args.batch_size,), generator=generator).to(device)
    val_inputs = torch.randn(args.val_size, WIDTH, generator=generator).to(device)
    val_labels = torch.randint(0, CLASSES, (args.val_size,), generator=generator).to(device)

    started, timed, accuracy = time.perf_counter(), args.steps, None
    for step in range(args.steps):
        if step == WARMUP and args.steps > WARMUP:
            started, timed = time.perf_counter(), args.steps - WARMUP
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        if rank == 0 and args.validate_every and step % args.validate_every == 0:
            accuracy = evaluate(model.module, val_inputs, val_labels)  # planted: rank 0 alone, every step
    dist.barrier()
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"ddp_straggler: {args.steps} steps x{world}, {elapsed / timed * 1e3:.2f} ms/step, "
              f"last loss {loss.item():.4f}" + (f", accuracy {accuracy:.3f}" if accuracy is not None else ""))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
