"""Data sources, the dataset hash, deterministic batches, loss masks, the prefetcher and the
overlap ratio."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import time
from collections import deque
from pathlib import Path

import pytest
import torch

import gpu_runtime
from gpu_runtime.data import StepBatches, load_corpus, pack_records, split_batch, trained_tokens
from gpu_runtime.errors import StrategyError
from gpu_runtime.model import BOS, EOS, PAD
from gpu_runtime.prefetch import Prefetcher
from gpu_runtime.schema import DataSection
from gpu_runtime.timeline import Clock, OverlapMeter, StepWindow, overlap_ratio

CPU = torch.device("cpu")
DATASETS = Path(gpu_runtime.__file__).parent / "datasets"


def _decode(tokens: torch.Tensor) -> list[int]:
    return tokens.tolist()


def test_alpaca_loader_frames_each_record_with_the_prompt_template(tmp_path):
    path = tmp_path / "alpaca.jsonl"
    records = [
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Say hi.", "input": "", "output": "hi"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    corpus = load_corpus(DataSection(source="jsonl", path=str(path)), seed=0)
    tokens = _decode(corpus.tokens)
    assert tokens.count(BOS) == 2 and tokens.count(EOS) == 2
    first = bytes(tokens[1 : tokens.index(EOS)]).decode()
    assert first == "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n5"
    second = bytes(tokens[tokens.index(EOS) + 2 : -1]).decode()
    assert second == "### Instruction:\nSay hi.\n\n### Response:\nhi"  # an empty input is left out
    assert "alpaca(2 records)" == corpus.description


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"instruction": "x"', "not valid JSON"),
        ('{"instruction": "x", "output": 3}', "'output' must be a string"),
        ('["instruction"]', "expected an object"),
    ],
)
def test_alpaca_loader_names_the_bad_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"instruction": "a", "output": "b"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(StrategyError) as info:
        load_corpus(DataSection(source="jsonl", path=str(path)), seed=0)
    assert info.value.errors[0]["key"] == "data.path"
    assert (
        "bad.jsonl line 2" in info.value.errors[0]["message"]
        and reason in info.value.errors[0]["message"]
    )


def test_text_glob_hash_is_over_the_token_stream(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"world")
    (tmp_path / "a.txt").write_bytes("h\u00e9".encode())
    corpus = load_corpus(DataSection(source="text", path=str(tmp_path / "*.txt")), seed=0)
    expected_tokens = [BOS, *"h\u00e9".encode(), EOS, BOS, *b"world", EOS]  # files in sorted order
    assert _decode(corpus.tokens) == expected_tokens
    stream = b"".join(t.to_bytes(2, "little") for t in expected_tokens)
    assert corpus.sha256 == hashlib.sha256(stream).hexdigest()
    (tmp_path / "b.txt").write_bytes(b"World")
    assert (
        load_corpus(DataSection(source="text", path=str(tmp_path / "*.txt")), seed=0).sha256
        != corpus.sha256
    )


def test_text_glob_without_matches_names_data_path(tmp_path):
    with pytest.raises(StrategyError) as info:
        load_corpus(DataSection(source="text", path=str(tmp_path / "none-*.txt")), seed=0)
    assert (
        info.value.errors[0]["key"] == "data.path"
        and "no files match" in info.value.errors[0]["message"]
    )


def test_synthetic_data_is_fixed_by_the_seed():
    a = load_corpus(DataSection(), seed=1)
    assert a.sha256 == load_corpus(DataSection(), seed=1).sha256
    assert a.sha256 != load_corpus(DataSection(), seed=2).sha256
    assert a.tokens.numel() >= 1 << 18 and int(a.tokens.max()) <= EOS


def test_step_batches_are_a_function_of_seed_and_step():
    corpus = load_corpus(DataSection(), seed=0)
    batches = StepBatches(corpus, seq_len=16, global_batch=4, seed=0)
    b3 = batches.batch(3)
    assert b3.shape == (4, 17) and b3.dtype == torch.int64
    assert torch.equal(b3, StepBatches(corpus, seq_len=16, global_batch=4, seed=0).batch(3))
    assert not torch.equal(b3, batches.batch(4))
    assert not torch.equal(b3, StepBatches(corpus, seq_len=16, global_batch=4, seed=1).batch(3))
    stream = corpus.tokens.long()
    for row in b3:  # every row is a contiguous window of the corpus
        hits = (stream.unfold(0, 17, 1) == row).all(dim=1)
        assert hits.any()


def test_a_corpus_shorter_than_a_window_is_refused(tmp_path):
    (tmp_path / "short.txt").write_bytes(b"abc")
    corpus = load_corpus(DataSection(source="text", path=str(tmp_path / "short.txt")), seed=0)
    with pytest.raises(StrategyError) as info:
        StepBatches(corpus, seq_len=64, global_batch=1, seed=0)
    assert info.value.errors[0]["key"] == "model.seq_len"


class _SlowBatches:
    """Batches that take ``load_s`` to build, like a slow disk."""

    def __init__(self, load_s: float):
        self.load_s = load_s

    def batch(self, step: int) -> torch.Tensor:
        time.sleep(self.load_s)
        return torch.full((2, 5), step)


def _run_prefetched(depth: int, *, load_s: float, compute_s: float, steps: int = 6) -> list[float]:
    clock = Clock(CPU)
    windows: deque = deque(maxlen=64)
    io_log: deque = deque(maxlen=64)
    prefetcher = Prefetcher(
        _SlowBatches(load_s),
        start_step=0,
        end_step=steps,
        device=CPU,
        depth=depth,
        pin_memory=True,
        clock=clock,
        io_log=io_log,
    )
    try:
        for step in range(steps):
            batch = prefetcher.next()
            assert batch.step == step and int(batch.tokens[0, 0]) == step
            start = clock.stamp()
            time.sleep(compute_s)
            windows.append(StepWindow(step + 1, start, clock.stamp(), batch.io_start, batch.io_end))
        with pytest.raises(StopIteration):
            prefetcher.next()
    finally:
        prefetcher.close()
    return OverlapMeter(clock, windows, io_log).collect()


def test_prefetching_overlaps_loading_with_compute_and_inline_loading_does_not():
    steps = 10
    threaded = _run_prefetched(2, load_s=0.02, compute_s=0.05, steps=steps)
    inline = _run_prefetched(0, load_s=0.02, compute_s=0.05, steps=steps)
    assert len(threaded) == len(inline) == steps
    assert inline == [0.0] * steps
    # While batches remain to be loaded, the next one loads during each step: about 0.02 / 0.05 of
    # it. The producer runs ahead by the queue depth plus the batch in hand,
    # so the last steps have nothing left.
    loading = sorted(threaded[1 : steps - 3])
    assert 0.25 < loading[len(loading) // 2] <= 1.0, threaded
    assert threaded[-1] == 0.0


def test_a_failing_loader_raises_in_the_training_thread():
    class Broken:
        def batch(self, step):
            raise OSError("disk gone")

    prefetcher = Prefetcher(
        Broken(),
        start_step=0,
        end_step=3,
        device=CPU,
        depth=2,
        pin_memory=False,
        clock=Clock(CPU),
        io_log=deque(),
    )
    with pytest.raises(OSError, match="disk gone"):
        prefetcher.next()
    prefetcher.close()


def test_overlap_ratio_is_intersection_over_the_longer():
    assert overlap_ratio((0.0, 1.0), [(0.5, 1.5)], io_len=1.0) == pytest.approx(0.5)
    assert overlap_ratio((0.0, 2.0), [(0.5, 1.0)], io_len=0.5) == pytest.approx(0.25)
    assert overlap_ratio((0.0, 1.0), [(1.0, 2.0)], io_len=1.0) == 0.0
    assert overlap_ratio((0.0, 1.0), [(0.0, 0.6), (0.5, 0.9)], io_len=0.6) == pytest.approx(1.0)


# -- loss masks, chat records, packing ------------------------------------------------------


def _jsonl(tmp_path, name: str, records: list) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def packed_rows_suffix(corpus) -> bytes:
    """What a packed-records corpus hashes after its stream: the record offsets (int64
    little-endian), then b"packed records" (its rows are not one record each)."""
    offsets = b"".join(int(o).to_bytes(8, "little", signed=True) for o in corpus.records.tolist())
    return offsets + b"packed records"


def _unmarked(tokens: torch.Tensor) -> list[int]:
    return torch.where(tokens < 0, ~tokens, tokens).tolist()


def _trained_text(tokens: torch.Tensor) -> tuple[bytes, int]:
    """The trained targets of a 1-D stream (as one row) as bytes, and how many were EOS."""
    _, targets = split_batch(tokens.long()[None])
    kept = [t for t in targets[0].tolist() if t != -100]
    return bytes(t for t in kept if t < 256), kept.count(EOS)


def test_split_batch_on_the_byte_path_is_the_plain_slice():
    corpus = load_corpus(DataSection(), seed=0)
    assert corpus.records is None and corpus.trained_fraction == 1.0
    batch = StepBatches(corpus, seq_len=32, global_batch=4, seed=0).batch(0)
    inputs, targets = split_batch(batch)
    assert torch.equal(inputs, batch[:, :-1]) and torch.equal(targets, batch[:, 1:])
    assert inputs.dtype == targets.dtype == torch.int64
    assert trained_tokens(batch) == 4 * 32


ALPACA = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "The sum is 5."},
    {"instruction": "Say hi.", "output": "hi there"},
]


def test_loss_on_response_trains_only_the_alpaca_outputs(tmp_path):
    path = _jsonl(tmp_path, "a.jsonl", ALPACA)
    full = load_corpus(DataSection(source="jsonl", path=path), seed=0)
    masked = load_corpus(DataSection(source="jsonl", path=path, loss_on="response"), seed=0)
    # the same ids are read as inputs; only the targets differ
    assert _unmarked(masked.tokens) == full.tokens.tolist()
    assert masked.tokens.dtype == torch.int16 and int(masked.tokens.min()) < 0
    text, eos = _trained_text(masked.tokens)
    assert text == b"The sum is 5.hi there" and eos == 2  # each output and the EOS ending it
    assert 0 < masked.trained_fraction < full.trained_fraction == 1.0
    # the hash covers the mask: the stored stream, uint16 little-endian (a mark reads 65535-id)
    assert masked.sha256 != full.sha256
    stream = b"".join((t & 0xFFFF).to_bytes(2, "little") for t in masked.tokens.tolist())
    assert masked.sha256 == hashlib.sha256(stream + packed_rows_suffix(masked)).hexdigest()
    assert "loss on responses" in masked.description


def test_the_prompt_targets_are_ignored_in_a_batch(tmp_path):
    path = _jsonl(tmp_path, "a.jsonl", ALPACA[:1])
    corpus = load_corpus(DataSection(source="jsonl", path=path, loss_on="response"), seed=0)
    n = corpus.tokens.numel()
    batch = StepBatches(corpus, seq_len=n - 1, global_batch=1, seed=0).batch(0)
    inputs, targets = split_batch(batch)
    prompt = len(b"### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n")
    assert inputs[0].tolist() == _unmarked(corpus.tokens)[:-1] and int(inputs.min()) >= 0
    assert targets[0, :prompt].tolist() == [-100] * prompt  # BOS + prompt: read, not trained
    assert bytes(targets[0, prompt:-1].tolist()) == b"The sum is 5." and targets[0, -1] == EOS
    assert trained_tokens(batch) == len(b"The sum is 5.") + 1


CHAT = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Add 2 and 3."},
            {"role": "assistant", "content": "It is 5."},
            {"role": "user", "content": "Sure?"},
            {"role": "assistant", "content": "Yes."},
        ]
    },
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
]


def test_a_multi_turn_chat_trains_only_the_assistant_turns(tmp_path):
    path = _jsonl(tmp_path, "chat.jsonl", CHAT)
    section = DataSection(source="jsonl", path=path, format="chat", loss_on="response")
    corpus = load_corpus(section, seed=0)
    assert corpus.description == "chat(2 records; loss on responses)"
    text, eos = _trained_text(corpus.tokens)
    assert text == b"It is 5.<|end|>Yes.<|end|>Hello!<|end|>" and eos == 2
    plain = _unmarked(corpus.tokens)
    first = bytes(plain[1 : plain.index(EOS)]).decode()
    assert first == (
        "<|system|>\nBe brief.\n<|user|>\nAdd 2 and 3.\n<|assistant|>\nIt is 5.<|end|>\n"
        "<|user|>\nSure?\n<|assistant|>\nYes.<|end|>"
    )
    everything = load_corpus(DataSection(source="jsonl", path=path, format="chat"), seed=0)
    assert everything.tokens.tolist() == plain and everything.sha256 != corpus.sha256


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"text": "no messages"}, "'messages' must be a non-empty list"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"messages": ["hi"]}, "message 1 must be an object"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "message 1 has role 'bot'"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": 5}]},
            "message 2: 'content' must be a string",
        ),
        ({"messages": [{"role": "user", "content": "x"}]}, "at least one assistant turn"),
    ],
)
def test_malformed_chat_records_name_the_file_and_line(tmp_path, record, reason):
    path = _jsonl(tmp_path, "talk.jsonl", [CHAT[1], record])
    with pytest.raises(StrategyError) as info:
        load_corpus(DataSection(source="jsonl", path=path, format="chat"), seed=0)
    error = info.value.errors[0]
    assert error["key"] == "data.path"
    assert "talk.jsonl line 2" in error["message"] and reason in error["message"], error


def test_unpacked_rows_are_one_record_each_padded_with_marked_pads(tmp_path):
    records = [{"instruction": "i" * n, "output": "o" * n} for n in (1, 5, 40)]
    path = _jsonl(tmp_path, "a.jsonl", records)
    section = DataSection(source="jsonl", path=path, packing=False)
    corpus = load_corpus(section, seed=0)
    lengths = torch.diff(corpus.records).tolist()
    assert corpus.records[0] == 0 and corpus.records[-1] == corpus.tokens.numel()
    assert lengths == [
        len(b"### Instruction:\n\n\n### Response:\n") + 2 + 2 * n for n in (1, 5, 40)
    ]
    seq_len = 48  # longer than two records, shorter than the third
    batches = StepBatches(corpus, seq_len=seq_len, global_batch=6, seed=0)
    batch = batches.batch(2)
    assert batch.shape == (6, seq_len + 1) and batch.dtype == torch.int64
    assert torch.equal(batch, StepBatches(corpus, seq_len=seq_len, global_batch=6, seed=0).batch(2))
    assert not torch.equal(batch, batches.batch(3))
    assert not torch.equal(
        batch, StepBatches(corpus, seq_len=seq_len, global_batch=6, seed=1).batch(2)
    )
    expected = {}  # each record's row: truncated, or padded with marked pads
    for start, end in zip(corpus.records[:-1].tolist(), corpus.records[1:].tolist(), strict=True):
        row = corpus.tokens[start : min(end, start + seq_len + 1)].tolist()
        expected[tuple(row + [~PAD] * (seq_len + 1 - len(row)))] = len(row) - 1
    rows = [tuple(r) for r in batch.tolist()]
    assert all(r in expected for r in rows) and len(set(rows)) > 1
    inputs, targets = split_batch(batch)
    assert int(inputs.min()) >= 0 and PAD in inputs.flatten().tolist()
    assert trained_tokens(batch) == sum(expected[r] for r in rows) == int((targets >= 0).sum())
    packed = load_corpus(DataSection(source="jsonl", path=path), seed=0)
    assert packed.tokens.tolist() == corpus.tokens.tolist() and packed.sha256 != corpus.sha256


def test_unpacked_response_rows_train_only_the_response(tmp_path):
    path = _jsonl(tmp_path, "a.jsonl", ALPACA)
    section = DataSection(source="jsonl", path=path, packing=False, loss_on="response")
    corpus = load_corpus(section, seed=0)
    batch = StepBatches(corpus, seq_len=128, global_batch=8, seed=0).batch(0)
    _, targets = split_batch(batch)
    for row in targets.tolist():
        text = bytes(t for t in row if 0 <= t < 256)
        assert text in (b"The sum is 5.", b"hi there") and row.count(EOS) == 1
    assert trained_tokens(batch) == sum(
        len(bytes(t for t in row if 0 <= t < 256)) + 1 for row in targets.tolist()
    )


def test_unpacked_text_is_one_file_per_row(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"alpha")
    (tmp_path / "b.txt").write_bytes(b"be")
    corpus = load_corpus(
        DataSection(source="text", path=str(tmp_path / "*.txt"), packing=False), seed=0
    )
    assert corpus.records.tolist() == [0, 7, 11]
    rows = StepBatches(corpus, seq_len=3, global_batch=16, seed=0).batch(0).tolist()
    assert {tuple(r) for r in rows} == {(BOS, *b"alp"), (BOS, *b"be", EOS)}


class _WideTokenizer:
    """A stub with a vocabulary past int16: ids 40000 + byte."""

    name = "Wide"
    vocab_size = 50_000
    bos_id, eos_id, pad_id = 49_990, 49_991, 49_992

    def encode(self, text: str) -> list[int]:
        return [40_000 + b for b in text.encode()]

    def render_chat(self, messages):
        from gpu_runtime.tokenizer import builtin_chat

        return builtin_chat(messages, "\n")


def test_a_vocabulary_past_int16_is_stored_as_int32_and_hashed_as_int32(tmp_path):
    path = _jsonl(tmp_path, "a.jsonl", ALPACA)
    section = DataSection(source="jsonl", path=path, loss_on="response")
    corpus = load_corpus(section, seed=0, tokenizer=_WideTokenizer())
    assert corpus.tokens.dtype == torch.int32 and corpus.tokenizer == "Wide"
    plain = _unmarked(corpus.tokens)
    assert plain[0] == 49_990 and plain.count(49_991) == 2 and max(plain) == 49_991
    expected = b"".join(t.to_bytes(4, "little", signed=True) for t in corpus.tokens.tolist())
    assert corpus.sha256 == hashlib.sha256(expected + packed_rows_suffix(corpus)).hexdigest()
    _, targets = split_batch(corpus.tokens.long()[None])
    trained = [t - 40_000 for t in targets[0].tolist() if 40_000 <= t < 40_256]
    assert bytes(trained) == b"The sum is 5.hi there"
    unpacked = load_corpus(
        DataSection(source="jsonl", path=path, packing=False), seed=0, tokenizer=_WideTokenizer()
    )
    batch = StepBatches(unpacked, seq_len=200, global_batch=4, seed=0).batch(0)
    lengths = (unpacked.records[1:] - unpacked.records[:-1]).tolist()
    # padded to the step's longest record, not to seq_len+1
    assert batch.shape[1] <= max(lengths) < 201
    pads = batch == ~49_992
    assert pads.any() and (pads[:, 1:] >= pads[:, :-1]).all()  # padding only at the tail
    assert split_batch(batch)[0].max() < 50_000


def test_the_shipped_datasets_load_and_match_their_generator():
    alpaca = load_corpus(
        DataSection(source="jsonl", path=str(DATASETS / "instructions.jsonl"), loss_on="response"),
        seed=0,
    )
    chat = load_corpus(
        DataSection(source="jsonl", path=str(DATASETS / "chat.jsonl"), format="chat"), seed=0
    )
    n_alpaca = int(alpaca.description.split("(")[1].split(" ")[0])
    n_chat = int(chat.description.split("(")[1].split(" ")[0])
    assert n_alpaca >= 300 and n_chat >= 300
    assert 0.1 < alpaca.trained_fraction < 0.6
    size = sum(p.stat().st_size for p in DATASETS.glob("*.jsonl"))
    assert size < 300_000
    spec = importlib.util.spec_from_file_location("generate", DATASETS / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    written = [json.loads(line) for line in (DATASETS / "instructions.jsonl").open()]
    assert written == generate.alpaca_records(random.Random(generate.SEED), generate.N_ALPACA)
    talks = [json.loads(line) for line in (DATASETS / "chat.jsonl").open()]
    assert talks == generate.chat_records(random.Random(generate.SEED + 1), generate.N_CHAT)
    assert any(len(t["messages"]) > 3 for t in talks)
    assert any(t["messages"][0]["role"] == "system" for t in talks)


# -- whole records packed into rows ----------------------------------------------------------


def test_pack_records_fits_whole_records_best_fit_decreasing():
    lengths = [70, 10, 50, 30, 40, 60, 20, 90, 5, 25]
    rows = pack_records(lengths, 100)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))  # each once
    assert all(sum(lengths[i] for i in row) <= 100 for row in rows)
    assert len(rows) == 4  # 400 tokens in rows of 100: best fit leaves no row half empty
    assert pack_records([150, 30], 100) == [[0], [1]]  # too long: alone (truncated there)


def _records(n: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"instruction": f"Task {i}.", "output": "w" * rng.randint(5, 60)} for i in range(n)]


def test_packed_records_are_whole_once_an_epoch_and_never_a_target_across(tmp_path):
    path = _jsonl(tmp_path, "r.jsonl", _records(30))
    corpus = load_corpus(DataSection(source="jsonl", path=path), seed=0)
    assert corpus.packed and corpus.records is not None
    unpacked = load_corpus(DataSection(source="jsonl", path=path, packing=False), seed=0)
    assert corpus.sha256 != unpacked.sha256  # the rows differ: so does the hash
    offsets = corpus.records.tolist()
    records = [corpus.tokens[a:b].tolist() for a, b in zip(offsets, offsets[1:], strict=False)]
    batches = StepBatches(corpus, seq_len=127, global_batch=2, seed=0)
    epoch_rows = len(pack_records([len(r) for r in records], 128))
    assert epoch_rows >= 3
    seen, trained = [], 0
    for step in range(-(-epoch_rows // 2)):
        batch = batches.batch(step)
        assert batch.shape == (2, 128)
        assert torch.equal(
            batch, StepBatches(corpus, seq_len=127, global_batch=2, seed=0).batch(step)
        )
        for row in batch.tolist()[: epoch_rows - 2 * step]:
            at = 0
            while at < len(row) and row[at] != ~PAD:
                ids = [~t if t < 0 else t for t in row[at:]]
                record = next(r for r in records if ids[: len(r)] == r)
                seen.append(records.index(record))
                if at:  # a record's first token follows another record's end: no target
                    assert row[at] == ~BOS
                at += len(record)
            assert all(t == ~PAD for t in row[at:])  # the rest is padding
            trained += sum(t >= 0 for t in row[1:])
    assert sorted(seen) == list(range(len(records)))  # every record once in the epoch
    assert trained == sum(len(r) - 1 for r in records)  # each record's targets, nothing else
    assert not torch.equal(
        batches.batch(0), StepBatches(corpus, seq_len=127, global_batch=2, seed=1).batch(0)
    )


def test_a_packed_step_trains_as_its_records_do_alone(tmp_path):
    """A packed row's loss and gradients are those of its records trained one row each."""
    from gpu_runtime.model import Transformer, preset_args

    path = _jsonl(tmp_path, "r.jsonl", _records(12, seed=3))
    corpus = load_corpus(DataSection(source="jsonl", path=path), seed=0)
    row = StepBatches(corpus, seq_len=255, global_batch=1, seed=0).batch(0)
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 256))
    model.document_end = EOS
    inputs, targets = split_batch(row)
    _, packed = model(inputs, targets)
    packed.backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.document_end = None
    ends = [i + 1 for i, t in enumerate(inputs[0].tolist()) if t == EOS]
    assert len(ends) >= 2  # more than one record in the row
    total, count = 0.0, 0
    for start, end in zip([0, *ends], ends, strict=False):
        alone = torch.where(row[:, start:end] < 0, ~row[:, start:end], row[:, start:end])
        x, y = split_batch(alone)
        _, loss = model(x, y)
        total, count = total + loss * y.numel(), count + y.numel()
    alone_loss = total / count
    alone_loss.backward()
    assert count == trained_tokens(row)
    assert abs(packed.item() - alone_loss.item()) < 1e-5
    for mine, theirs in zip(packed_grads, (p.grad for p in model.parameters()), strict=True):
        assert (mine - theirs).abs().max().item() < 1e-5
