"""A CPU optimizer's step, as torch's default runs it, against the same step with fused=True.

On a CPU, torch's optimizers default to the single-tensor implementation: a few operators
per parameter, each a full pass over the parameter's memory. ``fused=True`` (Adam, AdamW,
SGD and Adagrad, torch 2.4 or later) updates each parameter in one pass. The rule
optimizer-not-fused sizes its CPU saving from the share of the step's time the fused step
keeps (rules/builtin/optimizer-not-fused.yaml, thresholds ``cpu_kept_*``); this command measures that share on
this machine, for each optimizer and a few model shapes, so the figures can be checked
where they are used.

For each optimizer, model shape and thread count: the step timed alone (gradients set
once, ``--steps`` steps after a warm-up), default and fused in alternating blocks so the
machine's load falls on both alike; the median of each, and fused / default, the share
the fused step keeps. Then Adam over one parameter of 1 to 64 MiB: where its passes stop
fitting the CPU's caches, the share drops (the optimizer table's LARGE_TENSOR_BYTES).

    python benchmarks/cpu_fused_optimizer.py
    python benchmarks/cpu_fused_optimizer.py --threads 1 2 --steps 50 --blocks 5
    python benchmarks/cpu_fused_optimizer.py --optimizers --sizes 16 32   # the sizes alone
"""

from __future__ import annotations

import argparse
import statistics
import time

# (name, widths): a stack of Linear layers of these widths; the parameter counts span
# what a CPU job trains (a small classifier to a few million values).
SHAPES = (("small MLP", (128, 256, 128, 4)), ("8 x 512", (512,) * 9), ("4 x 1024", (1024,) * 5),
          ("29 x 256", (256,) * 30), ("2 x 4096", (4096,) * 3))
OPTIMIZERS = (("Adam", "Adam", {}), ("AdamW", "AdamW", {}), ("Adagrad", "Adagrad", {}),
              ("SGD momentum", "SGD", {"momentum": 0.9}), ("SGD", "SGD", {}))


def _model(torch, widths):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def _timed(optimizer, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="*", default=None,
                        help="torch threads to measure with (default: 1 and all this process may use)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps a block")
    parser.add_argument("--blocks", type=int, default=5, help="alternating blocks of each implementation")
    parser.add_argument("--optimizers", nargs="*", default=None,
                        help="only these (e.g. Adam 'SGD momentum'); none named: no model shapes")
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 4, 8, 16, 32, 64],
                        help="MiB of the one parameter Adam updates in the size sweep")
    args = parser.parse_args()

    import torch

    threads = args.threads or sorted({1, torch.get_num_threads()})
    print(f"torch {torch.__version__}; steps a block {args.steps}, blocks {args.blocks}")
    print(f"{'optimizer':<14}{'model':<11}{'params':>10}{'threads':>8}{'default ms':>12}{'fused ms':>10}"
          f"{'kept':>7}")
    kept_by_optimizer: dict[str, list[float]] = {}
    for count in threads:
        torch.set_num_threads(count)
        chosen = OPTIMIZERS if args.optimizers is None else [o for o in OPTIMIZERS if o[0] in args.optimizers]
        for label, name, options in chosen:
            for shape, widths in SHAPES:
                torch.manual_seed(0)
                model = _model(torch, widths)
                for parameter in model.parameters():
                    parameter.grad = torch.randn_like(parameter)
                cls = getattr(torch.optim, name)
                default = cls(model.parameters(), lr=1e-3, **options)
                fused = cls([p.detach().clone().requires_grad_() for p in model.parameters()], lr=1e-3, fused=True,
                            **options)
                for parameter, twin in zip(model.parameters(), fused.param_groups[0]["params"]):
                    twin.grad = parameter.grad.clone()
                for optimizer in (default, fused):
                    _timed(optimizer, 3)  # state made, first-call costs paid
                times: dict[str, list[float]] = {"default": [], "fused": []}
                for block in range(args.blocks):
                    order = (("default", default), ("fused", fused))
                    for key, optimizer in (order if block % 2 == 0 else order[::-1]):
                        times[key].append(_timed(optimizer, args.steps))
                plain, one = statistics.median(times["default"]), statistics.median(times["fused"])
                kept = one / plain
                kept_by_optimizer.setdefault(label, []).append(kept)
                params = sum(p.numel() for p in model.parameters())
                print(f"{label:<14}{shape:<11}{params:>10}{count:>8}{plain * 1e3:>12.3f}{one * 1e3:>10.3f}"
                      f"{kept:>7.2f}")
    if kept_by_optimizer:
        print("\nshare the fused step keeps, by optimizer (min, median, max over shapes and threads):")
        for label, kept in kept_by_optimizer.items():
            print(f"  {label:<14}{min(kept):.2f}  {statistics.median(kept):.2f}  {max(kept):.2f}")
    torch.set_num_threads(max(threads))
    print(f"\nAdam over one parameter ({max(threads)} threads):")
    for mib in args.sizes:
        elements = (mib << 20) // 4
        runs: dict[bool, list[float]] = {False: [], True: []}
        for block in range(args.blocks):
            for fused in ((False, True) if block % 2 == 0 else (True, False)):
                parameter = torch.nn.Parameter(torch.randn(elements))
                parameter.grad = torch.randn(elements)
                optimizer = torch.optim.Adam([parameter], lr=1e-3, fused=True if fused else None)
                _timed(optimizer, 3)
                runs[fused].append(_timed(optimizer, args.steps))
        plain, one = statistics.median(runs[False]), statistics.median(runs[True])
        print(f"  {mib:>4} MiB  default {plain * 1e3:8.2f} ms  fused {one * 1e3:8.2f} ms  kept {one / plain:.2f}")


if __name__ == "__main__":
    main()
