"""The CUDA path: side-stream copies, NVML telemetry, bf16 by compute capability.
Skipped without a GPU."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from gpu_runtime import StrategyError, train
from gpu_runtime.data import StepBatches, load_corpus
from gpu_runtime.mfu import peak_flops
from gpu_runtime.prefetch import Prefetcher
from gpu_runtime.schema import DataSection
from gpu_runtime.timeline import Clock

pytestmark = pytest.mark.cuda


def test_side_stream_batches_arrive_intact_and_in_order():
    device = torch.device("cuda", 0)
    batches = StepBatches(load_corpus(DataSection(), seed=0), seq_len=64, global_batch=8, seed=0)
    prefetcher = Prefetcher(
        batches,
        start_step=0,
        end_step=6,
        device=device,
        depth=2,
        pin_memory=True,
        clock=Clock(device),
        io_log=deque(),
    )
    try:
        for step in range(6):
            batch = prefetcher.next()
            assert batch.side_stream and batch.tokens.is_cuda
            assert torch.equal(batch.tokens.cpu(), batches.batch(step))
    finally:
        prefetcher.close()


def test_trains_on_cuda_with_nvml_telemetry(tiny_config):
    samples = []
    result = train(
        tiny_config(train={"steps": 30, "global_batch": 8}, telemetry={"interval_s": 0.02}),
        sink=samples.append,
        device="cuda",
    )
    assert result.status == "completed" and result.device.startswith("cuda:0 ")
    assert result.peak_mem_mb > 0 and result.final_loss < 6.0
    final = samples[-1]
    assert final["device"] == result.device and final["mem_total_mb"] > 1000
    assert all(b["energy_j"] <= a["energy_j"] for b, a in zip(samples, samples[1:], strict=False))
    if final["power_w"] is not None:
        assert final["estimated"] is False and final["energy_j"] >= 0
    assert any(s["overlap_ratio"] is not None for s in samples)
    assert any(s["util_pct"] is not None for s in samples)


def test_bf16_runs_where_the_compute_capability_allows_it(tiny_config):
    config = tiny_config(precision={"compute_dtype": "bf16"}, telemetry={"enabled": False})
    if torch.cuda.get_device_capability(0) >= (8, 0):
        assert train(config, device="cuda", steps=3).status == "completed"
    else:
        with pytest.raises(StrategyError, match="compute capability"):
            train(config, device="cuda", steps=3)


def test_mfu_on_a_known_gpu_uses_its_dense_peak(tiny_config):
    name = torch.cuda.get_device_name(0)
    peak = peak_flops(f"cuda:0 {name}", "bf16")
    if peak is None:
        pytest.skip(f"{name} is not in the peak table")
    samples = []
    train(
        tiny_config(train={"steps": 20}, telemetry={"interval_s": 0.02}),
        sink=samples.append,
        device="cuda",
    )
    assert any(s["mfu"] is not None and 0 < s["mfu"] < 1 for s in samples if s["tokens_per_s"])
