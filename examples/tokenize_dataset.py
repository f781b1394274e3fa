"""Text classification whose Dataset tokenizes every review in plain Python.

Planted problem (``dataloader-starvation``): ``ReviewDataset.__getitem__`` lowercases one
review, splits it into words with a regex, splits each word greedily into the longest
subwords found in a dict vocabulary (WordPiece style), then truncates and pads the ids.
That is pure-Python work, about a millisecond a review, done in the main process
(``num_workers=0``) while the model waits, so about half of each step is the data loader.
The model is a small 2-layer Transformer encoder trained with AdamW.

The fix, ``--num-workers 1``: one worker process tokenizes the next batches while the main
process trains, and the step shrinks to about its compute. Tokenizing every review once
before training (``--precompute``), or a compiled tokenizer, would also do.

    python examples/tokenize_dataset.py --steps 20
    python examples/tokenize_dataset.py --steps 20 --num-workers 1   # the fix
    python examples/tokenize_dataset.py --steps 20 --precompute      # made once
"""

from __future__ import annotations

import argparse
import random
import re
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

MAX_LEN = 64  # tokens kept per review
CLASSES = 2
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["th", "ng", "qu"]
WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")


def make_words(rng: random.Random, count: int) -> list[str]:
    return ["".join(rng.choices(SYLLABLES, k=rng.randint(2, 5))) for _ in range(count)]


def make_vocab(words: list[str]) -> dict[str, int]:
    """[PAD], [UNK], punctuation, every syllable alone and as a continuation, common words."""
    pieces = ["[PAD]", "[UNK]", ".", ",", "!", "?"] + SYLLABLES + ["##" + s for s in SYLLABLES]
    pieces += [w for w in words[:300] if w not in pieces] + ["##" + w[-4:] for w in words[300:600]]
    return {piece: i for i, piece in enumerate(dict.fromkeys(pieces))}


class ReviewDataset(Dataset):
    """Synthetic reviews kept as raw text; each item is tokenized when it is asked for."""

    def __init__(self, length: int, seed: int):
        rng = random.Random(seed)
        words = make_words(rng, 2000)
        self.vocab = make_vocab(words)
        good, bad, plain = words[:40], words[40:80], words[80:]
        self.texts, self.labels = [], []
        for _ in range(length):
            label = rng.randrange(CLASSES)
            tone = good if label else bad
            text = [rng.choice(tone) if rng.random() < 0.1 else rng.choice(plain) for _ in range(rng.randint(400, 900))]
            for i in range(7, len(text), 9):
                text[i] = text[i].capitalize() + rng.choice(".,!?")
            self.texts.append(" ".join(text))
            self.labels.append(label)
        self.done = None  # --precompute: every review tokenized once (make_all)

    def make_all(self) -> None:
        """Tokenize every review once, before training; each item is then a list lookup."""
        self.done = [self.tokenize(i) for i in range(len(self.texts))]

    def __len__(self) -> int:
        return len(self.texts)

    def subwords(self, word: str) -> list[int]:
        """Greedy longest-match-first split of one word into vocabulary pieces."""
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    start = end
                    break
            else:
                return [self.vocab["[UNK]"]]
        return ids

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.done is not None:
            return self.done[index]
        return self.tokenize(index)

    def tokenize(self, index: int) -> tuple[torch.Tensor, int]:
        ids = []
        for word in WORD.findall(self.texts[index].lower()):
            ids.extend(self.subwords(word))
        ids = ids[:MAX_LEN] + [self.vocab["[PAD]"]] * (MAX_LEN - len(ids))
        return torch.tensor(ids), self.labels[index]


class Classifier(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.position = nn.Parameter(torch.zeros(MAX_LEN, dim))
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pad = tokens == 0
        hidden = self.encoder(self.embed(tokens) + self.position, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((hidden * keep).sum(1) / keep.sum(1).clamp(min=1))


def build_model(vocab_size: int = 1000) -> Classifier:
    return Classifier(vocab_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (the fix: 1)")
    parser.add_argument("--precompute", action="store_true", help="tokenize every review once before training")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (one keeps the timing steady)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dataset = ReviewDataset(args.steps * args.batch_size, args.seed)
    if args.precompute:
        dataset.make_all()
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers)
    model = build_model(len(dataset.vocab)).to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    ends, waits = [], []
    last = time.perf_counter()
    model.train()
    for tokens, labels in loader:
        waits.append(time.perf_counter() - last)  # time spent waiting for this batch
        tokens, labels = tokens.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(tokens), labels)
        loss.backward()
        optimizer.step()
        last = time.perf_counter()
        ends.append(last)
    if device.type == "cuda":
        torch.cuda.synchronize()
        ends[-1] = time.perf_counter()
    timed = ends[-1] - ends[1] if len(ends) > 2 else float("nan")  # steps 2.. (two warm-up steps)
    print(f"tokenize_dataset: {len(ends)} steps, {1000 * timed / max(len(ends) - 2, 1):.1f} ms/step, "
          f"loader wait {100 * sum(waits[2:]) / timed:.1f}% of the step, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
