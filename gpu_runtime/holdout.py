"""Which records ``eval.holdout`` keeps out of training: a split by a hash of each record.

Torch-free (the schema checks a synthetic corpus's split with it).

A record is held out when the hash of its content (BLAKE2b, 64 bits, read as a fraction of
2**64) falls below the fraction. So the split is the same on every run and every host, whatever
the order of the files or of the records in them, and two copies of a record always land on the
same side (a duplicate can never leak a held-out record into training). What a record's content
is: a synthetic document's bytes, a text file's bytes, a jsonl record's fields as canonical JSON
(``gpu_runtime.data``).

The held-out records are evaluated in the order of their hashes, so every run of every arm with
the same data and ``eval`` keys evaluates the same tokens.

A synthetic corpus is a function of the seed: the schema checks its split at validation
(``synthetic_split_problem``); a corpus of files is checked when it is read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

from gpu_runtime.synthetic import synthetic_documents

KEY = "eval.holdout"
_PERSON = b"costlab.holdout"  # BLAKE2b personalisation: this hash is the split's alone


def record_position(content: bytes) -> float:
    """Where a record falls in [0, 1): held out when below the fraction."""
    digest = hashlib.blake2b(content, digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") / 2**64


def split_records(keys: Sequence[bytes], fraction: float) -> tuple[list[int], list[int]]:
    """(indices trained on, in the given order; indices held out, in the order of their hashes)."""
    positions = [record_position(k) for k in keys]
    trained = [i for i, p in enumerate(positions) if p >= fraction]
    held = sorted((i for i, p in enumerate(positions) if p < fraction), key=lambda i: positions[i])
    return trained, held


def split_problem(
    fraction: float, *, records: int, held: int, what: str, unit: str = "record"
) -> str | None:
    """Why a split is refused (it leaves nothing to evaluate or nothing to train), or None.
    ``unit``: what a record of this corpus is (a text corpus holds out whole files)."""
    units = f"{records} {unit}{'s' if records != 1 else ''}"
    if held == 0:
        return (
            f"{fraction:g} of {what} ({units}) holds out none of them: nothing to evaluate (a "
            f"{unit} is held out when the hash of its content falls below the fraction); raise "
            "the fraction, or name a held-out file"
        )
    if held == records:
        return f"{fraction:g} of {what} ({units}) holds out every one: nothing left to train; " + (
            "lower the fraction" if records > 1 else "name a held-out file instead"
        )
    return None


@lru_cache(maxsize=16)
def _synthetic_positions(seed: int) -> tuple[float, ...]:
    return tuple(record_position(doc) for doc in synthetic_documents(seed))


def synthetic_split_problem(seed: int, fraction: float) -> str | None:
    """``split_problem`` for the synthetic corpus of ``seed`` (about 10 ms, once per seed)."""
    positions = _synthetic_positions(seed)
    held = sum(p < fraction for p in positions)
    return split_problem(
        fraction,
        records=len(positions),
        held=held,
        what=f"the synthetic corpus (seed {seed})",
        unit="document",
    )
