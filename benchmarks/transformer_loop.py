"""A GPU-bound training loop: a small transformer encoder trained in fp32 on random tokens.

The workload benchmarks/step_overhead.py and the GPU checks use where the GPU, not the
host, should set the pace: on a GPU each step is some tens of milliseconds of matrix work
and a few hundred kernels, so a collector that costs the host little leaves the step as it
was. On a CPU it runs a much smaller model, only so the scripts can be tried anywhere.
It plants nothing; fp32 matrix work without TF32 is what advisor may say about it.

    python benchmarks/transformer_loop.py --steps 20
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    width, layers, seq, batch, vocab = (768, 6, 256, 16, 8192) if gpu else (64, 2, 32, 4, 512)
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (args.steps * batch, seq + 1))
    loader = DataLoader(TensorDataset(tokens), batch_size=batch, pin_memory=gpu)
    embed = nn.Embedding(vocab, width)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(width, 12 if gpu else 4, 4 * width, batch_first=True,
                                                               dropout=0.0), layers)
    head = nn.Linear(width, vocab)
    model = nn.Sequential(embed, encoder, head).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for (batch_tokens,) in loader:
        batch_tokens = batch_tokens.to(args.device, non_blocking=True)
        inputs, targets = batch_tokens[:, :-1], batch_tokens[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
