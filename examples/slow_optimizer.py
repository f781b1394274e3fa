"""A training loop whose optimizer step costs more than forward and backward together.

The model looks tokens up in a large embedding table (400,000 rows) of which each step uses
a few hundred, and trains it with dense Adam: the backward pass writes a gradient the size
of the whole table and Adam then updates every one of its 12.8 M values, and two state
tensors as large, each step. The example rule pack's slow-optimizer-step rule must fire
here (rules/examples/team.yaml). The fix, ``--sparse``, uses a sparse embedding with
SparseAdam, which touches the rows the step used only.

    python examples/slow_optimizer.py --steps 20
    python examples/slow_optimizer.py --steps 20 --sparse
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCABULARY = 400_000
WIDTH = 32
TOKENS = 8
CLASSES = 10


class BagOfTokens(nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH, sparse=sparse)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(tokens).mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sparse", action="store_true", help="the fix: sparse gradients and SparseAdam")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    samples = args.steps * args.batch_size
    tokens = torch.randint(0, VOCABULARY, (samples, TOKENS))
    labels = torch.randint(0, CLASSES, (samples,))
    loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size, shuffle=False)
    model = BagOfTokens(sparse=args.sparse)
    loss_fn = nn.CrossEntropyLoss()
    if args.sparse:
        optimizers = [torch.optim.SparseAdam(model.embedding.parameters(), lr=1e-3),
                      torch.optim.Adam(model.head.parameters(), lr=1e-3)]
    else:
        optimizers = [torch.optim.Adam(model.parameters(), lr=1e-3)]

    model.train()
    for batch_tokens, batch_labels in loader:
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_tokens), batch_labels)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
    print(f"slow_optimizer: {args.steps} steps, last loss {loss.detach():.4f}")


if __name__ == "__main__":
    main()
