"""Held-out evaluation (``eval:``): the tokens it evaluates, its loss against an independent fp32
computation, when it runs during training, and that its time is billed but never step time."""

from __future__ import annotations

import json
import time

import pytest
import torch

from gpu_runtime import evaluation as evaluation_module
from gpu_runtime import train
from gpu_runtime.data import load_split_corpus
from gpu_runtime.evaluation import held_out_loss, held_out_rows, row_batches
from gpu_runtime.model import Transformer, preset_args
from gpu_runtime.schema import DataSection
from gpu_runtime.telemetry import EVAL_KEYS, SAMPLE_KEYS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EVAL = {"holdout": 0.1, "max_tokens": 256}


def _records(tmp_path, n: int = 60) -> str:
    path = tmp_path / "records.jsonl"
    lines = [
        {"instruction": f"Count ({i}).", "output": " ".join(map(str, range(i % 19 + 2)))}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return str(path)


def test_a_stream_is_evaluated_in_consecutive_windows_up_to_max_tokens():
    held = load_split_corpus(DataSection(), 0.1, seed=0).held_out
    rows = held_out_rows(held, seq_len=32, max_tokens=100)
    assert [r.numel() for r in rows] == [33, 33, 33, 5]  # 32 + 32 + 32 + 4 targets
    # each row starts where the last ended: every token is a target once, the first excepted
    joined = torch.cat([rows[0]] + [r[1:] for r in rows[1:]])
    assert torch.equal(joined, held.tokens[:101].long())
    everything = held_out_rows(held, seq_len=32, max_tokens=10**9)
    assert sum(r.numel() - 1 for r in everything) == held.tokens.numel() - 1


def test_the_loss_is_the_fp32_cross_entropy_of_the_targets_that_train(tmp_path):
    """Records one per row (prompts masked under loss_on: response; rows padded in batches of 3,
    the longest truncated), the first 150 targets: against a row-by-row fp64 log-softmax of the
    same model."""
    seq_len, max_tokens = 64, 150
    data = DataSection(source="jsonl", path=_records(tmp_path), loss_on="response", packing=False)
    held = load_split_corpus(data, 0.3, seed=0).held_out
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", seq_len))
    rows = held_out_rows(held, seq_len=seq_len, max_tokens=max_tokens)
    batches = row_batches(rows, rows_per_batch=3, pad_id=held.pad_id)
    assert any((x == held.pad_id).any() for x, _ in batches)  # padding is on the path
    assert any(r.numel() == seq_len + 1 for r in rows[:-1])  # and truncation
    loss = held_out_loss(model, batches)

    # independently: the held-out records in order, each alone, the first 150 trained targets
    bounds = held.records.tolist()
    total, count = 0.0, 0
    for a, b in zip(bounds, bounds[1:], strict=False):
        row = held.tokens[a : min(b, a + seq_len + 1)].long()
        ids = torch.where(row < 0, ~row, row)
        with torch.no_grad():
            logits = model(ids[None, :-1])[0][0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for t in range(row.numel() - 1):
            if row[t + 1] >= 0 and count < max_tokens:
                total -= float(logp[t, row[t + 1]])
                count += 1
    assert count == max_tokens == sum(int((y >= 0).sum()) for _, y in batches)
    assert loss == pytest.approx(total / count, abs=1e-5)
    assert model.training and all(p.grad is None for p in model.parameters())


def test_evaluations_stream_at_every_n_steps_and_once_at_the_end(tiny_config):
    samples = []
    config = tiny_config(train={"steps": 5}, eval={**EVAL, "every_steps": 2})
    result = train(config, sink=samples.append)
    evals = [s for s in samples if "eval_loss" in s]
    assert [s["step"] for s in evals] == [2, 4, 5]
    assert [s["tokens"] for s in evals] == [2 * 128, 4 * 128, 5 * 128]  # trained tokens so far
    for s in evals:
        assert set(s) == set(SAMPLE_KEYS) | set(EVAL_KEYS)
        assert s["eval_s"] > 0 and 0 < s["eval_loss"] < 10
    assert all(set(s) == set(SAMPLE_KEYS) for s in samples if "eval_loss" not in s)
    assert [e["step"] for e in result.evaluations] == [2, 4, 5]
    assert result.eval_loss == evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert result.eval_s == pytest.approx(sum(s["eval_s"] for s in evals))
    assert 0 < result.eval_s < result.wall_s  # inside the run's wall time: billed
    report = result.strategies["eval"]
    assert report["targets"] == 256 and report["records_held_out"] > 0
    json.dumps(result.to_dict(), allow_nan=False)

    only_end = train(tiny_config(train={"steps": 3}, eval=EVAL, telemetry={"enabled": False}))
    assert [e["step"] for e in only_end.evaluations] == [3]
    # the run trained on the records the holdout left: another corpus than without eval
    assert only_end.dataset_sha256 != train(tiny_config(train={"steps": 1})).dataset_sha256


def test_a_cancelled_run_does_not_evaluate_at_the_end(tiny_config):
    calls = []
    result = train(
        tiny_config(train={"steps": 5}, eval={**EVAL, "every_steps": 1}),
        cancel=lambda: calls.append(1) or len(calls) > 2,
    )
    assert result.status == "cancelled"
    assert [e["step"] for e in result.evaluations] == [1, 2]


def test_evaluation_time_is_reported_apart_and_never_counted_as_step_time(tiny_config, monkeypatch):
    pause = 1.5  # longer than any step of this tiny model, even on a loaded 2-core machine

    def slow_loss(*args, **kwargs) -> float:
        time.sleep(pause)
        return 2.0

    monkeypatch.setattr(evaluation_module, "held_out_loss", slow_loss)
    samples = []
    config = tiny_config(
        train={"steps": 2}, eval={**EVAL, "every_steps": 1}, telemetry={"interval_s": 60.0}
    )
    result = train(config, sink=samples.append)
    evals = [s for s in samples if "eval_loss" in s]
    assert [s["step"] for s in evals] == [1, 2] and result.eval_s >= 2 * pause
    assert all(s["eval_s"] >= pause for s in evals)
    for before, s in zip(evals, evals[1:], strict=False):
        # one step between two evaluations: its time and tokens/s leave the evaluation out (with
        # it counted, the step would take the pause and more; a loaded machine's step is slow)
        assert s["step_time_s"] < pause, s
        assert s["tokens_per_s"] > (s["tokens"] - before["tokens"]) / pause, s


@pytest.mark.cuda
def test_on_cuda_the_loss_is_the_cpus_and_bf16_evaluates_as_it_computes(tiny_config):
    held = load_split_corpus(DataSection(), 0.1, seed=0).held_out
    rows = held_out_rows(held, seq_len=64, max_tokens=2048)
    batches = row_batches(rows, rows_per_batch=8, pad_id=held.pad_id)
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 64))
    on_cpu = held_out_loss(model, batches)
    cuda = torch.device("cuda", 0)
    model.to(cuda)
    on_gpu = [(x.to(cuda), y.to(cuda)) for x, y in batches]
    assert held_out_loss(model, on_gpu) == pytest.approx(on_cpu, abs=1e-4)
    bf16 = held_out_loss(
        model, on_gpu, autocast=lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    )
    assert bf16 == pytest.approx(on_cpu, rel=0.02)

    samples = []
    result = train(
        tiny_config(train={"steps": 4}, eval={**EVAL, "every_steps": 2}),
        sink=samples.append,
        device="cuda",
    )
    assert [(s["step"], s["eval_s"] > 0) for s in samples if "eval_loss" in s] == [
        (2, True),
        (4, True),
    ]
    assert result.eval_loss is not None and result.eval_s > 0
