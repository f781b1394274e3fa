"""advisor.Profiler(timer_only=True): throughput of a training loop at no measurable cost.

Nothing is profiled: each ``step()`` reads the clock and the DataLoader's reads are timed.
``step_info()`` prints reader_cost, batch_cost and ips since its previous call, and
``stop()`` (the end of the ``with`` block) prints the Perf summary. ``prof.session`` then
holds the timed steps, so even this run can be diagnosed.

    python examples/profiler_api_timer.py --steps 40 --log-every 10
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import advisor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.steps * args.batch_size, 3, 16, 16),
                         torch.randint(0, 10, (args.steps * args.batch_size,)))
    loader = DataLoader(data, batch_size=args.batch_size)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    with advisor.Profiler(timer_only=True) as prof:
        for step, (images, labels) in enumerate(loader, 1):
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step(num_samples=len(images))
            if step % args.log_every == 0:
                print(f"step {step}: loss {loss.item():.3f} {prof.step_info(unit='images')}")
    findings = prof.diagnose()
    print(f"findings: {', '.join(f.rule for f in findings) or 'none'}")


if __name__ == "__main__":
    main()
