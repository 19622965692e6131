"""Training data: local text, instruction records (Alpaca or chat jsonl), or a seeded generator,
tokenized by the run's tokenizer (bytes by default).

A corpus is one token stream: each document framed as BOS + tokens + EOS (BOS or EOS left out
when the tokenizer has none, BOS when a chat template already wrote it, EOS when the document
already ends with it).

Loss masking lives in the stream itself, so a batch stays ONE integer tensor (global_batch,
seq_len + 1) and sharding, prefetching, pinning and micro-batching need no change: a position
whose token is read as an input but never trained on as a target (with ``loss_on: response``
BOS and the prompt; padding always) is stored as ``~id`` (= -id-1, always negative). With
``loss_on: response`` each response's tokens, and the EOS that ends a document whose last
segment is a response, are the targets.
``split_batch`` turns a batch into (inputs, targets) with those targets at -100;
``trained_tokens`` counts the targets that train.

The dataset hash (SHA-256) is over exactly the stored stream, marks included, little-endian:

* the byte tokenizer stores int16 and hashes it as uint16 (a marked ``~id`` reads 65535-id),
  so an unmarked byte corpus has the same tokens and hash as it always had;
* any other tokenizer hashes the stream as int32 (two's complement), and stores int32 when
  its vocabulary does not fit int16 (vocab_size > 32767), else int16;
* with ``packing: false``, and for jsonl records packed whole into rows, the record boundaries
  (int64 offsets) are hashed after the stream; packed records then add b"packed records".

So two runs with the same hash trained on the same tokens with the same targets and rows.

Batches are a pure function of (seed, step), which makes resuming from a checkpoint need no
data-loader state. ``packing: true``: random windows of seq_len+1 tokens of the stream (text,
synthetic), or for jsonl records whole records packed into rows of seq_len+1 (``pack_records``:
each epoch's records best-fit into rows, never split, the rows shuffled, the rest padded);
``packing: false``: one record per row, truncated to seq_len+1 or padded with ``~pad_id``.

With ``eval.holdout`` the records are split first (``gpu_runtime.holdout``: by a hash of each
record's content) and ``load_split_corpus`` makes two corpora of them, framed, masked and hashed
alike: the one trained on and the held-out one (``gpu_runtime.evaluation`` reads it).
"""

from __future__ import annotations

import bisect
import glob
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpu_runtime.errors import StrategyError
from gpu_runtime.holdout import KEY as HOLDOUT_KEY
from gpu_runtime.holdout import record_position, split_problem, split_records
from gpu_runtime.model import IGNORE_INDEX, PAD
from gpu_runtime.schema import DataSection
from gpu_runtime.synthetic import SYNTHETIC_TOKENS, synthetic_documents  # noqa: F401 (re-exported)
from gpu_runtime.tokenizer import (
    CHAT_ROLES,
    ByteTokenizer,
    Segments,
    Tokenizer,
    encode_segments,
)

INT16_MAX_VOCAB = 32767


@dataclass(frozen=True)
class Corpus:
    tokens: torch.Tensor  # 1-D int16 (int32 for vocabularies past int16); ~id = not a target
    sha256: str
    description: str
    # record i is tokens[records[i]:records[i + 1]] (int64): jsonl records, and text files with
    # packing false; None: one stream cut in windows
    records: torch.Tensor | None = None
    packed: bool = False  # records packed whole into rows (jsonl with packing true)
    pad_id: int = PAD
    trained_fraction: float = 1.0  # of the stream's tokens, the share that are targets
    tokenizer: str = "bytes"


# A document: its ids, and per id whether it is trained on as a target (None: all are).
_Doc = tuple[np.ndarray, np.ndarray | None]


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


def alpaca_segments(record: dict[str, str]) -> Segments:
    """The Alpaca template as (prompt, False), (output, True)."""
    prompt = alpaca_prompt({**record, "output": ""})
    return [(prompt, False), (record["output"], True)]


def _jsonl(path: Path, expected: str):
    """(where, record) for each non-blank line: a JSON object, or refused naming the line."""
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
                    "data.path", f"{where}: expected an object with {expected}"
                )
            yield where, record


def _alpaca_records(path: Path) -> list[dict[str, str]]:
    records = []
    for where, record in _jsonl(path, "instruction/input/output"):
        for field, required in (("instruction", True), ("input", False), ("output", True)):
            value = record.get(field)
            if (value is None and required) or (value is not None and not isinstance(value, str)):
                raise StrategyError.single("data.path", f"{where}: '{field}' must be a string")
        records.append(record)
    return records


def _chat_records(path: Path) -> list[list[dict[str, str]]]:
    conversations = []
    for where, record in _jsonl(path, "'messages': [{role, content}, ...]"):
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            raise StrategyError.single(
                "data.path", f"{where}: 'messages' must be a non-empty list of {{role, content}}"
            )
        clean = []
        for n, message in enumerate(messages, start=1):
            if not isinstance(message, dict):
                raise StrategyError.single(
                    "data.path", f"{where}: message {n} must be an object with role and content"
                )
            role, content = message.get("role"), message.get("content")
            if role not in CHAT_ROLES:
                raise StrategyError.single(
                    "data.path",
                    f"{where}: message {n} has role {role!r}; expected one of "
                    + ", ".join(CHAT_ROLES),
                )
            if not isinstance(content, str):
                raise StrategyError.single(
                    "data.path", f"{where}: message {n}: 'content' must be a string"
                )
            clean.append({"role": role, "content": content})
        if not any(m["role"] == "assistant" for m in clean):
            raise StrategyError.single(
                "data.path", f"{where}: a conversation needs at least one assistant turn"
            )
        conversations.append(clean)
    return conversations


class _Encoder:
    """Documents to framed, masked id arrays for one tokenizer and loss_on."""

    def __init__(self, tokenizer: Tokenizer, *, response_only: bool):
        self.tok = tokenizer
        self.response_only = response_only
        self.is_bytes = isinstance(tokenizer, ByteTokenizer)

    def text(self, document: bytes | str, where: str) -> _Doc:
        if self.is_bytes:
            raw = document.encode("utf-8") if isinstance(document, str) else document
            ids = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        else:
            if isinstance(document, bytes):
                try:
                    document = document.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise StrategyError.single(
                        "data.path", f"{where}: not UTF-8 text ({exc})"
                    ) from None
            ids = np.asarray(self.tok.encode(document), dtype=np.int64)
        return self._framed(ids, None, last_is_response=True)

    def segments(self, segments: Segments) -> _Doc:
        ids, mask = encode_segments(self.tok, segments)
        trained = np.asarray(mask, dtype=bool) if self.response_only else None
        last = bool(segments) and segments[-1][1]
        return self._framed(np.asarray(ids, dtype=np.int64), trained, last_is_response=last)

    def _framed(
        self, ids: np.ndarray, trained: np.ndarray | None, *, last_is_response: bool
    ) -> _Doc:
        bos, eos = self.tok.bos_id, self.tok.eos_id
        head = bos is not None and not (ids.size and ids[0] == bos)
        tail = eos is not None and not (ids.size and ids[-1] == eos)
        parts = [np.asarray([bos], np.int64)] * head + [ids] + [np.asarray([eos], np.int64)] * tail
        framed = np.concatenate(parts) if len(parts) > 1 else ids
        if trained is None:
            return framed, None
        flags = [np.zeros(1, bool)] * head + [trained] + [np.full(1, last_is_response)] * tail
        return framed, np.concatenate(flags)


def _corpus(
    docs: list[_Doc],
    description: str,
    tokenizer: Tokenizer,
    *,
    packing: bool,
    records: bool = False,
) -> Corpus:
    lengths = [d.size for d, _ in docs]
    ids = np.concatenate([d for d, _ in docs]) if docs else np.zeros(0, np.int64)
    if any(m is not None for _, m in docs):
        trained = np.concatenate([np.ones(d.size, bool) if m is None else m for d, m in docs])
        ids = np.where(trained, ids, ~ids)
    is_bytes = isinstance(tokenizer, ByteTokenizer)
    wide = not is_bytes and tokenizer.vocab_size > INT16_MAX_VOCAB
    stored = ids.astype(np.int32 if wide else np.int16)
    hashed = stored.astype("<i2" if is_bytes else "<i4")
    digest = hashlib.sha256(hashed.tobytes())
    offsets = None
    if not packing or records:
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype("<i8")
        digest.update(offsets.tobytes())
        if packing:  # whole records packed into rows: other rows than one record each
            digest.update(b"packed records")
    tokens = torch.from_numpy(stored.copy())
    fraction = float((stored >= 0).mean()) if stored.size else 1.0
    return Corpus(
        tokens=tokens,
        sha256=digest.hexdigest(),
        description=description,
        records=None if offsets is None else torch.from_numpy(offsets.astype(np.int64)),
        packed=packing and records,
        pad_id=tokenizer.pad_id,
        trained_fraction=fraction,
        tokenizer=tokenizer.name,
    )


def _describe(kind: str, data: DataSection, tokenizer: Tokenizer) -> str:
    notes = []
    if tokenizer.name != "bytes":
        notes.append(f"tokenizer {tokenizer.name}")
    if data.loss_on == "response":
        notes.append("loss on responses")
    if not data.packing:
        notes.append("one record per row")
    return kind if not notes else f"{kind[:-1]}; {'; '.join(notes)})"


def _canonical(record: object) -> bytes:
    """A jsonl record's identity for the holdout split: its fields as canonical JSON."""
    return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _documents(
    data: DataSection, enc: _Encoder, *, seed: int
) -> tuple[list[_Doc], list[bytes], str]:
    """The documents a data section names, each with its content (the holdout split's key),
    and what they are (``kind(n ...)``)."""
    tok = enc.tok
    if data.source == "synthetic":
        raw = synthetic_documents(seed)
        return [enc.text(d, "synthetic") for d in raw], raw, f"synthetic(seed={seed})"
    files = _files(data.path or "")
    if data.source == "text":
        raw = [f.read_bytes() for f in files]
        docs = [enc.text(content, f.name) for f, content in zip(files, raw, strict=True)]
        return docs, raw, f"text({len(files)} files)"
    if data.format == "chat":
        conversations = [c for f in files for c in _chat_records(f)]
        if not conversations:
            raise StrategyError.single("data.path", f"no chat records in {data.path!r}")
        docs = [enc.segments(tok.render_chat(c)) for c in conversations]
        return docs, [_canonical(c) for c in conversations], f"chat({len(docs)} records)"
    records = [r for f in files for r in _alpaca_records(f)]
    if not records:
        raise StrategyError.single("data.path", f"no Alpaca records in {data.path!r}")
    docs = [enc.segments(alpaca_segments(r)) for r in records]
    # what the template reads: no input and an empty one are the same record
    fields = [[r["instruction"], r.get("input") or "", r["output"]] for r in records]
    return docs, [_canonical(f) for f in fields], f"alpaca({len(docs)} records)"


def _encoder(data: DataSection, tokenizer: Tokenizer | None) -> _Encoder:
    tok = tokenizer if tokenizer is not None else ByteTokenizer()
    return _Encoder(tok, response_only=data.loss_on == "response")


def _of(docs: list[_Doc], kind: str, data: DataSection, tok: Tokenizer) -> Corpus:
    return _corpus(
        docs,
        _describe(kind, data, tok),
        tok,
        packing=data.packing,
        records=data.source == "jsonl",
    )


def load_corpus(data: DataSection, *, seed: int, tokenizer: Tokenizer | None = None) -> Corpus:
    """Read (or generate) the corpus a strategy's data section names, tokenized by
    ``tokenizer`` (None: bytes)."""
    enc = _encoder(data, tokenizer)
    docs, _, kind = _documents(data, enc, seed=seed)
    return _of(docs, kind, data, enc.tok)


@dataclass(frozen=True)
class SplitCorpus:
    """The corpus trained on and the held-out one (``eval.holdout``), and how they were split."""

    train: Corpus
    held_out: Corpus
    report: dict  # the holdout, the records on each side


def _held_out_file(data: DataSection, path: str, enc: _Encoder, *, seed: int):
    """The held-out file's documents, read as data.path's are; its errors name eval.holdout."""
    try:
        return _documents(data.model_copy(update={"path": path}), enc, seed=seed)
    except StrategyError as exc:
        raise StrategyError(
            [{**e, "key": HOLDOUT_KEY if e["key"] == "data.path" else e["key"]} for e in exc.errors]
        ) from None


def load_split_corpus(
    data: DataSection, holdout: float | str, *, seed: int, tokenizer: Tokenizer | None = None
) -> SplitCorpus:
    """The corpus split by ``eval.holdout``: a fraction (records held out by the hash of their
    content, in hash order) or a held-out file (its records in hash order; records of data.path
    identical to one of them are left out of training). Refused naming eval.holdout when a side
    would be empty."""
    enc = _encoder(data, tokenizer)
    docs, keys, kind = _documents(data, enc, seed=seed)
    if isinstance(holdout, str):
        held_docs, held_keys, held_kind = _held_out_file(data, holdout, enc, seed=seed)
        order = sorted(range(len(held_docs)), key=lambda i: record_position(held_keys[i]))
        held = [held_docs[i] for i in order]
        seen = set(held_keys)
        trained = [i for i, k in enumerate(keys) if k not in seen]
        if not trained:
            raise StrategyError.single(
                HOLDOUT_KEY,
                f"every record of data.path ({len(keys)}) is also in the held-out file "
                f"{holdout!r}: nothing left to train",
            )
        left_out = len(keys) - len(trained)
        report = {
            "holdout": holdout,
            "records_held_out": len(held),
            "records_trained": len(trained),
            "duplicates_left_out": left_out,
        }
        train_note = f"{left_out} held-out duplicates left out" if left_out else None
    else:
        trained, order = split_records(keys, holdout)
        synthetic = data.source == "synthetic"
        problem = split_problem(
            holdout,
            records=len(keys),
            held=len(order),
            what=f"the synthetic corpus (seed {seed})" if synthetic else "data.path",
            unit={"synthetic": "document", "text": "file"}.get(data.source, "record"),
        )
        if problem is not None:
            raise StrategyError.single(HOLDOUT_KEY, problem)
        held, held_kind = [docs[i] for i in order], f"{len(order)} of {kind}"
        train_note = f"{len(held)} held out"
        report = {
            "holdout": holdout,
            "records_held_out": len(held),
            "records_trained": len(trained),
        }
    if train_note is not None:
        kind = f"{kind[:-1]}; {train_note})"
    train = _of([docs[i] for i in trained], kind, data, enc.tok)
    held_out = _of(held, f"held out: {held_kind}", data, enc.tok)
    if not int((held_out.tokens >= 0).sum()):
        raise StrategyError.single(HOLDOUT_KEY, "the held-out records have no token to evaluate")
    return SplitCorpus(train=train, held_out=held_out, report=report)


def split_batch(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a (rows, seq_len + 1) batch: inputs are the ids with the marks
    removed, targets the next ids with marked ones at -100 (never trained)."""
    inputs = torch.where(tokens < 0, ~tokens, tokens)[:, :-1]
    nxt = tokens[:, 1:]
    targets = nxt.masked_fill(nxt < 0, IGNORE_INDEX)
    return inputs, targets


def trained_tokens(tokens: torch.Tensor) -> int:
    """How many of a batch's targets are trained on (call it on the host copy)."""
    return int((tokens[:, 1:] >= 0).sum())


def pack_records(lengths: list[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: record indices into rows of ``capacity`` tokens, longest first (ties
    in the given order), each into the fullest row it still fits; a record longer than a row
    fills one alone (it is truncated there). Whole records only: none is split."""
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (tokens left, row), sorted
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        size = min(lengths[i], capacity)
        at = bisect.bisect_left(free, (size, -1))
        if at < len(free):
            left, row = free.pop(at)
        else:
            left, row = capacity, len(rows)
            rows.append([])
        rows[row].append(i)
        if left - size > 0:
            bisect.insort(free, (left - size, row))
    return rows


class StepBatches:
    """The rows of step s, fixed by (seed, s): ``global_batch`` random windows of seq_len+1
    tokens of the stream (packed stream); the next ``global_batch`` rows of whole records packed
    together (packed records: epoch after epoch, each epoch's records in a seeded order packed by
    ``pack_records`` and its rows shuffled); or ``global_batch`` random records, each truncated
    to seq_len+1 or padded with ``~pad_id`` to the step's longest (packing false).

    A packed-records row is its records one after the other, then ``~pad_id`` to seq_len+1. Each
    record's first token after the row's first is marked (never a target): what follows the
    previous record's end is no prediction to train on, as a record alone has none there."""

    def __init__(self, corpus: Corpus, *, seq_len: int, global_batch: int, seed: int):
        self.records = corpus.records
        self.packed = corpus.packed
        if self.records is None and corpus.tokens.numel() < seq_len + 1:
            raise StrategyError.single(
                "model.seq_len",
                f"the corpus has {corpus.tokens.numel()} tokens; "
                f"a window needs seq_len+1 = {seq_len + 1}",
            )
        if self.records is not None and (self.records.numel() < 2 or not corpus.tokens.numel()):
            raise StrategyError.single("data.path", "the corpus has no records")
        self.tokens = corpus.tokens
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        self.pad_mark = ~corpus.pad_id
        self._offsets = torch.arange(seq_len + 1)
        self._epochs: list[list[list[int]]] = []  # packed records: each epoch's rows
        self._epoch_starts = [0]  # the global row index each epoch starts at

    def batch(self, step: int) -> torch.Tensor:
        if self.packed:
            first = step * self.global_batch
            return torch.stack([self._packed_row(first + i) for i in range(self.global_batch)])
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (2**63 - 1))
        if self.records is None:
            starts = torch.randint(
                0, self.tokens.numel() - self.seq_len, (self.global_batch,), generator=gen
            )
            return self.tokens[starts[:, None] + self._offsets].long()
        picks = torch.randint(0, self.records.numel() - 1, (self.global_batch,), generator=gen)
        starts, ends = self.records[picks], self.records[picks + 1]
        # padded to the step's longest record (at most seq_len+1), not always to seq_len+1:
        # padding is never trained on, but it is computed
        width = max(2, min(self.seq_len + 1, int((ends - starts).max())))
        index = starts[:, None] + self._offsets[:width]
        inside = index < ends[:, None]
        rows = self.tokens[index.clamp(max=max(self.tokens.numel() - 1, 0))].long()
        return torch.where(inside, rows, torch.full_like(rows, self.pad_mark))

    def _epoch(self, epoch: int) -> list[list[int]]:
        """Epoch ``epoch``'s rows (record indices), a pure function of (seed, epoch)."""
        while len(self._epochs) <= epoch:
            e = len(self._epochs)
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + 7919 * e + 1) % (2**63))
            lengths = (self.records[1:] - self.records[:-1]).tolist()
            order = torch.randperm(len(lengths), generator=gen).tolist()
            rows = pack_records([lengths[i] for i in order], self.seq_len + 1)
            shuffled = torch.randperm(len(rows), generator=gen).tolist()
            self._epochs.append([[order[i] for i in rows[r]] for r in shuffled])
            self._epoch_starts.append(self._epoch_starts[-1] + len(rows))
        return self._epochs[epoch]

    def _packed_row(self, index: int) -> torch.Tensor:
        while self._epoch_starts[-1] <= index:
            self._epoch(len(self._epochs))
        epoch = bisect.bisect_right(self._epoch_starts, index) - 1
        picks = self._epoch(epoch)[index - self._epoch_starts[epoch]]
        width = self.seq_len + 1
        row = torch.full((width,), self.pad_mark, dtype=torch.long)
        at = 0
        for r in picks:
            start, end = int(self.records[r]), int(self.records[r + 1])
            n = min(end - start, width - at)
            row[at : at + n] = self.tokens[start : start + n]
            if at and row[at] >= 0:
                row[at] = ~row[at]
            at += n
        return row
