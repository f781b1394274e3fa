"""A small, real training loop for checking and measuring the collectors.

A CNN on 3x32x32 images fed by a DataLoader (pinned batches on a GPU, copies with
non_blocking), trained with SGD; it times itself with ``time.perf_counter()`` from the
end of one step to the end of the next (so a step includes fetching its batch; on a GPU
each step ends with ``torch.cuda.synchronize()``) and prints the step times as one JSON
line starting with ``MARK``. ``--torch-profiler A:B`` records steps A..B-1 with
torch.profiler (CPU and CUDA activities) for a reference trace.

`advisor doctor --gpu-checks` runs it under the CUPTI collector and under torch.profiler
and compares the two; benchmarks/collector_overhead.py times it under each collector.

    python -m advisor.doctor.loop --steps 25 --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MARK = "advisor-loop:"  # prefix of the JSON line the loop prints

__all__ = ["MARK", "build_model", "loop_parser", "main", "parse_window"]


def parse_window(text: str) -> tuple[int, int]:
    """``A:B`` -> (A, B): steps A to B-1, with 1 <= A < B (step 0 is never recorded:
    torch.profiler needs a warm-up step before its window)."""
    try:
        start_text, stop_text = text.split(":")
        start, stop = int(start_text), int(stop_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B, e.g. 3:23") from None
    if start < 1 or stop <= start:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= A < B")
    return start, stop


def loop_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m advisor.doctor.loop",
                                     description="The benchmark's training loop; prints its step times as JSON.")
    parser.add_argument("--steps", type=int, default=25, help="training steps in all")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--no-sync", action="store_true",
                        help="do not synchronise with the GPU at the end of each step")
    parser.add_argument("--torch-profiler", type=parse_window, metavar="A:B", default=None,
                        help="record steps A..B-1 with torch.profiler (CPU and CUDA activities); the "
                             "profiler stays on for step B, which absorbs its flush")
    parser.add_argument("--trace", type=Path, default=None,
                        help="with --torch-profiler: export the Chrome trace here")
    return parser


def build_model(nn):
    """A small CNN for 3x32x32 images (about 30 kernels forward and backward)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def main(argv: list[str] | None = None) -> int:
    args = loop_parser().parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    samples = args.steps * args.batch_size
    images = torch.randn(samples, 3, 32, 32)
    labels = torch.randint(0, 10, (samples,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed), pin_memory=cuda)
    model = build_model(nn).to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    profiler = None
    if args.torch_profiler is not None:
        start, stop = args.torch_profiler
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        trace = args.trace

        def on_ready(prof) -> None:
            if trace is not None:
                prof.export_chrome_trace(str(trace))

        # Steps 0..start-2 wait, start-1 warms up, start..stop are recorded: one step past
        # the window, so the flush at the end of the last recorded step lands outside it.
        profiler = torch.profiler.profile(
            activities=activities,
            record_shapes=True,
            schedule=torch.profiler.schedule(wait=start - 1, warmup=1, active=stop - start + 1, repeat=1),
            on_trace_ready=on_ready,
        )
        profiler.start()

    times: list[float] = []
    model.train()
    last = time.perf_counter()
    for batch_images, batch_labels in loader:
        batch_images = batch_images.to(device, non_blocking=True)
        batch_labels = batch_labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_images), batch_labels)
        loss.backward()
        optimizer.step()
        if cuda and not args.no_sync:
            torch.cuda.synchronize()
        if profiler is not None:
            profiler.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    if profiler is not None:
        profiler.stop()
    print(MARK + json.dumps({"what": "steps", "device": str(device), "step_s": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
