"""The Paddle profiler guide's case on a CPU, with advisor.Profiler in the training code.

A small image classifier trains on a dataset whose samples are slow to read and decode
one at a time. With a single-process DataLoader (num_workers=0) the loop waits for its
input; profiling shows it, advisor's diagnosis names it, worker processes fix it. For
each configuration the script

1. profiles steps 3..13 with ``advisor.Profiler(scheduler=(3, 14))`` and prints the Model
   summary and the findings of ``prof.diagnose()``, then
2. times a run with ``advisor.Profiler(timer_only=True)``, which costs the loop nothing
   measurable, for the real throughput,

and at the end compares the two configurations.

    python examples/profiler_api_dataloader.py                  # num_workers 0, then 4, compared
    python examples/profiler_api_dataloader.py --workers 0      # one configuration
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import advisor
from advisor.tables import compute_tables

CLASSES = 10


class SlowImages(Dataset):
    """CIFAR-sized samples that take a while each: a pause stands in for reading the file,
    then a little decoding work."""

    def __init__(self, length: int, read_ms: float, seed: int = 0):
        self.length = length
        self.read_s = read_ms / 1000.0
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.read_s)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.rand(3, 32, 32, generator=generator).sub_(0.5).mul_(2.0)
        return image, index % CLASSES


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, CLASSES),
    )


def train(prof: advisor.Profiler, args: argparse.Namespace, workers: int) -> None:
    """The training loop, as one would write it, with ``prof.step()`` at the end of each
    iteration."""
    torch.manual_seed(0)
    dataset = SlowImages(args.steps * args.batch_size, args.read_ms)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    with prof:
        for images, labels in loader:
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step(num_samples=len(images))


def run(args: argparse.Namespace, workers: int) -> dict:
    print(f"=== num_workers={workers} ===")
    first, end = args.record
    profiled = advisor.Profiler(scheduler=(first, end))
    train(profiled, args, workers)
    print(f"profiled steps {profiled.recorded_steps[0]}-{profiled.recorded_steps[-1]}:")
    profiled.summary(tables=["model"])
    findings = profiled.diagnose()
    if findings:
        print("findings:")
        for rank, finding in enumerate(findings, 1):
            print(f"  {rank}. {finding.severity.value.upper()} {finding.title} [{finding.rule}]: "
                  f"saves {finding.saving.ms_per_step:.1f} ms/step ({finding.saving.share_of_step:.0%} of the step)")
    else:
        print("findings: none")
    model_table = compute_tables(profiled.session, ["model"])["model"]

    timed = advisor.Profiler(timer_only=True)
    train(timed, args, workers)
    perf = compute_tables(timed.session, ["perf"])["perf"]
    return {
        "workers": workers,
        "dataloader_share": float(model_table.loc["Dataloader", "cpu_ratio"]),
        "findings": [f"{f.rule} ({f.severity.value}, {f.saving.ms_per_step:.1f} ms/step)" for f in findings],
        "reader_cost_s": float(perf.loc["reader_cost", "avg"]) / 1e9,
        "batch_cost_s": float(perf.loc["batch_cost", "avg"]) / 1e9,
        "ips": float(perf.loc["ips", "avg"]),
    }


def compare(before: dict, after: dict) -> None:
    print("=== before and after ===")
    label_before, label_after = f"num_workers={before['workers']}", f"num_workers={after['workers']}"
    print(f"{'':<34}{label_before:>16}{label_after:>16}")
    print(f"{'Dataloader share (profiled)':<34}{before['dataloader_share']:>16.1%}{after['dataloader_share']:>16.1%}")
    print(f"{'reader_cost (timer_only)':<34}{before['reader_cost_s'] * 1e3:>13.2f} ms{after['reader_cost_s'] * 1e3:>13.2f} ms")
    print(f"{'batch_cost (timer_only)':<34}{before['batch_cost_s'] * 1e3:>13.2f} ms{after['batch_cost_s'] * 1e3:>13.2f} ms")
    print(f"{'ips (timer_only, samples/s)':<34}{before['ips']:>16.1f}{after['ips']:>16.1f}")
    print(f"speed-up: {after['ips'] / before['ips']:.2f}x the samples per second")
    for result, label in ((before, label_before), (after, label_after)):
        print(f"findings with {label}: {'; '.join(result['findings']) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, action="append",
                        help="DataLoader worker processes (repeatable; default: 0, then 4 or the CPU count if lower)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--read-ms", type=float, default=0.5, help="pause per sample")
    parser.add_argument("--record", type=int, nargs=2, default=(3, 14), metavar=("START", "END"),
                        help="the steps to profile, START..END-1")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the training process")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [run(args, workers) for workers in (args.workers or [0, min(4, os.cpu_count() or 1)])]
    if len(results) == 2:
        compare(*results)


if __name__ == "__main__":
    main()
