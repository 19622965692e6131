"""Data sources, the dataset hash, deterministic batches, the prefetcher and the overlap ratio."""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque

import pytest
import torch

from gpu_runtime.data import StepBatches, load_corpus
from gpu_runtime.errors import StrategyError
from gpu_runtime.model import BOS, EOS
from gpu_runtime.prefetch import Prefetcher
from gpu_runtime.schema import DataSection
from gpu_runtime.timeline import Clock, OverlapMeter, StepWindow, overlap_ratio

CPU = torch.device("cpu")


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
