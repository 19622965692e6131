"""Training data: byte-level tokens from local text, Alpaca jsonl, or a seeded generator.

A corpus is one token stream (each document framed by BOS ... EOS). Its SHA-256 is
taken over exactly the stream the model trains on (tokens as uint16 little-endian),
so two runs with the same hash saw the same data. Batches are a pure function of
(seed, step), which makes resuming from a checkpoint need no data-loader state.
"""

from __future__ import annotations

import glob
import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_runtime.errors import StrategyError
from gpu_runtime.model import BOS, EOS
from gpu_runtime.schema import DataSection

SYNTHETIC_TOKENS = 1 << 18
_BOS_LE = BOS.to_bytes(2, "little")
_EOS_LE = EOS.to_bytes(2, "little")


@dataclass(frozen=True)
class Corpus:
    tokens: torch.Tensor  # 1-D int16
    sha256: str
    description: str


def _framed(document: bytes) -> bytearray:
    """BOS + document bytes + EOS as uint16 little-endian."""
    wide = bytearray(2 * len(document))
    wide[0::2] = document
    return bytearray(_BOS_LE) + wide + bytearray(_EOS_LE)


def _corpus(documents: list[bytes], description: str) -> Corpus:
    stream = bytearray().join(_framed(d) for d in documents)
    digest = hashlib.sha256(stream).hexdigest()
    if sys.byteorder != "little":  # the stream is little-endian by definition
        stream[0::2], stream[1::2] = stream[1::2], stream[0::2]
    tokens = (
        torch.frombuffer(stream, dtype=torch.int16).clone()
        if stream
        else torch.empty(0, dtype=torch.int16)
    )
    return Corpus(tokens=tokens, sha256=digest, description=description)


def _files(pattern: str) -> list[Path]:
    paths = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
    files = [p for p in paths if p.is_file()]
    if not files:
        raise StrategyError.single("data.path", f"no files match {pattern!r}")
    return files


def alpaca_prompt(record: dict[str, str]) -> str:
    """The Alpaca template: instruction, optional input, response."""
    parts = [f"### Instruction:\n{record['instruction']}\n\n"]
    if record.get("input"):
        parts.append(f"### Input:\n{record['input']}\n\n")
    parts.append(f"### Response:\n{record['output']}")
    return "".join(parts)


def _alpaca_records(path: Path) -> list[bytes]:
    documents = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path.name} line {lineno}"
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise StrategyError.single(
                    "data.path", f"{where}: not valid JSON ({exc})"
                ) from None
            if not isinstance(record, dict):
                raise StrategyError.single(
                    "data.path", f"{where}: expected an object with instruction/input/output"
                )
            for field, required in (("instruction", True), ("input", False), ("output", True)):
                value = record.get(field)
                if (value is None and required) or (
                    value is not None and not isinstance(value, str)
                ):
                    raise StrategyError.single("data.path", f"{where}: '{field}' must be a string")
            documents.append(alpaca_prompt(record).encode("utf-8"))
    return documents


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


def load_corpus(data: DataSection, *, seed: int) -> Corpus:
    """Read (or generate) the corpus a strategy's data section names."""
    if data.source == "synthetic":
        return _corpus(synthetic_documents(seed), f"synthetic(seed={seed})")
    files = _files(data.path or "")
    if data.source == "text":
        return _corpus([f.read_bytes() for f in files], f"text({len(files)} files)")
    documents = [doc for f in files for doc in _alpaca_records(f)]
    if not documents:
        raise StrategyError.single("data.path", f"no Alpaca records in {data.path!r}")
    return _corpus(documents, f"alpaca({len(documents)} records)")


class StepBatches:
    """The rows of step s: ``global_batch`` random windows of seq_len+1 tokens, fixed by
    (seed, s)."""

    def __init__(self, corpus: Corpus, *, seq_len: int, global_batch: int, seed: int):
        if corpus.tokens.numel() < seq_len + 1:
            raise StrategyError.single(
                "model.seq_len",
                f"the corpus has {corpus.tokens.numel()} tokens; "
                f"a window needs seq_len+1 = {seq_len + 1}",
            )
        self.tokens = corpus.tokens
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        self._offsets = torch.arange(seq_len + 1)

    def batch(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (2**63 - 1))
        starts = torch.randint(
            0, self.tokens.numel() - self.seq_len, (self.global_batch,), generator=gen
        )
        return self.tokens[starts[:, None] + self._offsets].long()
