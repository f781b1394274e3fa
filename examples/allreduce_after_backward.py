"""Gradients averaged by hand after backward: every all-reduce runs with nothing to hide it.

Planted problem (``communication-not-overlapped``, on GPUs with NCCL): after
``loss.backward()`` the loop all-reduces each parameter's gradient itself, one collective
per parameter, when backward is already over, so no computation is left to overlap with
and each small collective pays its own launch. The fix (``--ddp``) wraps the model in
DistributedDataParallel, which all-reduces bucket by bucket during backward.

Run it under torchrun (``torchrun --nproc-per-node=2 examples/allreduce_after_backward.py``)
or alone: alone it forms a one-rank group of its own (NCCL on a GPU, gloo on a CPU), which
still launches every collective.

    python examples/allreduce_after_backward.py --steps 20
    python examples/allreduce_after_backward.py --steps 20 --ddp
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

WIDTH = 512
LAYERS = 12
CLASSES = 10
WARMUP = 2  # steps before the timed ones


def build_model() -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of all-reduce by hand")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    on_gpu = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory() as folder:
        if "RANK" in os.environ:  # started by torchrun
            dist.init_process_group("nccl" if on_gpu else "gloo")
        else:
            dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"file://{folder}/rendezvous",
                                    rank=0, world_size=1)
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if on_gpu else "cpu")
        torch.manual_seed(args.seed)
        model = build_model().to(device)
        if args.ddp:
            model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(args.seed + rank)
        inputs = torch.randn(args.batch_size, WIDTH, generator=generator).to(device)
        labels = torch.randint(0, CLASSES, (args.batch_size,), generator=generator).to(device)

        started, timed = time.perf_counter(), args.steps
        for step in range(args.steps):
            if step == WARMUP and args.steps > WARMUP:
                if on_gpu:
                    torch.cuda.synchronize()
                started, timed = time.perf_counter(), args.steps - WARMUP
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            if not args.ddp:
                for parameter in model.parameters():  # planted: one collective per parameter, after backward
                    dist.all_reduce(parameter.grad)
                    parameter.grad /= world
            optimizer.step()
        if on_gpu:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        if rank == 0:
            print(f"allreduce_after_backward: {args.steps} steps on {device} x{world}, "
                  f"{elapsed / timed * 1e3:.2f} ms/step, last loss {loss.item():.4f}")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
