"""The seeded synthetic corpus (``data.source: synthetic``), torch-free: the schema reads it to
check an ``eval.holdout`` fraction at validation, the runtime to train on it."""

from __future__ import annotations

import random

SYNTHETIC_TOKENS = 1 << 18


def synthetic_documents(seed: int, n_tokens: int = SYNTHETIC_TOKENS) -> list[bytes]:
    """Zipf-distributed words from a seeded 512-word vocabulary: learnable,
    and the same for a seed."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))).encode() + b" "
        for _ in range(512)
    ]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    docs, total = [], 0
    while total < n_tokens:
        ids = rng.choices(range(len(words)), weights=weights, k=rng.randint(64, 512))
        doc = b"".join(words[i] for i in ids)
        docs.append(doc)
        total += len(doc) + 2
    return docs
