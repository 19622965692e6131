"""Telemetry: the sink contract, energy, MFU, RAPL and the modelled CPU power."""

from __future__ import annotations

import time

import pytest

from gpu_runtime import train
from gpu_runtime.mfu import mfu, peak_flops
from gpu_runtime.model import Transformer, preset_args
from gpu_runtime.probes import CpuProbe, RaplCounter, Reading
from gpu_runtime.telemetry import SAMPLE_KEYS, Progress, RunCounters, Sampler

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SINK_KEYS = {
    "seq",
    "ts",
    "step",
    "rank",
    "device",
    "util_pct",
    "mem_used_mb",
    "mem_total_mb",
    "power_w",
    "energy_j",
    "step_time_s",
    "tokens",
    "tokens_per_s",
    "micro_batch",
    "loss",
    "overlap_ratio",
    "mfu",
    "sm_clock_mhz",
    "temperature_c",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_bw_pct",
    "estimated",
}


@pytest.fixture(scope="module")
def sampled_run(tiny_config):
    config = tiny_config(train={"steps": 20}, telemetry={"peak_flops": 1.0e12})
    samples = []
    result = train(config, sink=samples.append)
    return config, result, samples


def test_sink_sees_every_key_increasing_seq_and_cumulative_counters(sampled_run):
    _, result, samples = sampled_run
    assert len(samples) >= 3 and result.samples == len(samples)
    assert SINK_KEYS == set(SAMPLE_KEYS)
    for sample in samples:
        assert set(sample) == SINK_KEYS
    assert [s["seq"] for s in samples] == list(range(len(samples)))
    for before, after in zip(samples, samples[1:], strict=False):
        assert after["ts"] >= before["ts"]
        assert after["energy_j"] >= before["energy_j"]
        assert after["tokens"] >= before["tokens"] and after["step"] >= before["step"]
    final = samples[-1]
    assert (final["step"], final["tokens"]) == (result.steps, result.tokens)
    assert final["energy_j"] == pytest.approx(result.energy_j)
    assert final["device"] == "cpu" == result.device
    assert final["estimated"] is CpuProbe(tdp_w=65.0).estimated is result.energy_estimated
    assert final["micro_batch"] == 4 and final["loss"] == pytest.approx(result.final_loss)
    assert (
        final["sm_clock_mhz"] is None and final["temperature_c"] is None
    )  # no such thing on a CPU
    timed = [s for s in samples if s["step_time_s"] is not None]
    assert timed and all(0 < s["step_time_s"] < 5 for s in timed)
    overlaps = [s["overlap_ratio"] for s in samples if s["overlap_ratio"] is not None]
    assert overlaps and all(0.0 <= r <= 1.0 for r in overlaps)


def test_mfu_is_tokens_per_second_times_6n_plus_12ldt_over_the_peak(sampled_run):
    config, _, samples = sampled_run
    model = Transformer(preset_args("tiny", 32))
    n = sum(p.numel() for p in model.parameters()) - model.tok_embeddings.weight.numel()
    flops_per_token = 6 * n + 12 * 4 * 256 * 32  # tiny: 4 layers, d=256; T=32
    measured = [s for s in samples if s["tokens_per_s"]]
    assert measured
    for s in measured:
        assert s["mfu"] == pytest.approx(s["tokens_per_s"] * flops_per_token / 1.0e12, rel=1e-9)


def test_peak_table_and_cpu_without_a_configured_peak():
    assert peak_flops("cuda:0 NVIDIA H200", "bf16") == 989e12
    assert peak_flops("cuda:1 NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops("cuda:0 NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak_flops("cpu", "fp32") is None
    assert peak_flops("cpu", "fp32", configured=2e12) == 2e12
    assert mfu(1000.0, 1e9, None) is None
    assert mfu(1000.0, 1e9, 312e12) == pytest.approx(1e12 / 312e12)


def _fake_rapl(root, domain: str, energy_uj: int, max_uj: int) -> None:
    d = root / domain
    d.mkdir(exist_ok=True)
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_sums_packages_and_survives_a_wrap(tmp_path):
    _fake_rapl(tmp_path, "intel-rapl:0", 900_000, 1_000_000)
    _fake_rapl(tmp_path, "intel-rapl:0:0", 5, 1_000_000)  # a sub-domain, already inside the package
    _fake_rapl(tmp_path, "intel-rapl:1", 100, 1_000_000)
    counter = RaplCounter(tmp_path)
    assert counter.available and len(counter.domains) == 2
    assert counter.read_j() == 0.0
    _fake_rapl(tmp_path, "intel-rapl:0", 50_000, 1_000_000)  # wrapped: +150_000 uJ
    _fake_rapl(tmp_path, "intel-rapl:1", 2_100, 1_000_000)  # +2_000 uJ
    assert counter.read_j() == pytest.approx(0.152)
    probe = CpuProbe(tdp_w=100.0, rapl_root=tmp_path)
    assert probe.estimated is False and probe.read().energy_j is not None


def test_cpu_power_without_rapl_is_tdp_times_utilisation(tmp_path):
    probe = CpuProbe(tdp_w=80.0, rapl_root=tmp_path / "missing")
    assert probe.estimated is True
    # Busy until this process has used 0.2 CPU-s, however long a loaded machine makes that take:
    # the utilisation read is then at least that share of the cores over the wall time it took.
    started, used = time.perf_counter(), sum(probe.process.cpu_times()[:2])
    while sum(probe.process.cpu_times()[:2]) - used < 0.2 and time.perf_counter() - started < 20:
        pass
    floor = 100.0 * 0.2 / (time.perf_counter() - started) / probe.cores
    reading = probe.read()
    assert reading.util_pct >= 0.5 * floor > 0
    assert reading.power_w == pytest.approx(80.0 * reading.util_pct / 100.0)
    assert reading.energy_j is None and reading.mem_used_mb > 0


class _ScriptedProbe:
    label = "fake"

    def __init__(self, readings, estimated=False):
        self.readings, self.estimated = list(readings), estimated

    def read(self):
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def close(self):
        pass


def _sampler(probe, sink=None):
    return Sampler(
        probe=probe,
        counters=RunCounters(Progress(0, 0, 0.0, 0, None, 1)),
        interval_s=60.0,
        sink=sink,
        flops_per_token=1.0,
        peak=None,
        overlap=None,
    )


def test_energy_comes_from_the_counter_and_never_decreases():
    probe = _ScriptedProbe(
        [
            Reading(energy_j=1000.0),
            Reading(energy_j=1010.0),
            Reading(energy_j=1004.0),
            Reading(energy_j=1030.0),
        ]
    )
    sampler = _sampler(probe)
    energies = [sampler.sample()["energy_j"] for _ in range(3)]
    assert energies == [pytest.approx(10.0), pytest.approx(10.0), pytest.approx(30.0)]


def test_energy_without_a_counter_is_power_times_time():
    sampler = _sampler(_ScriptedProbe([Reading(power_w=100.0)], estimated=True))
    start = time.perf_counter()
    time.sleep(0.1)
    first = sampler.sample()
    elapsed = time.perf_counter() - start
    assert first["estimated"] is True
    assert 100.0 * 0.1 <= first["energy_j"] <= 100.0 * elapsed + 1e-9
    assert (
        _sampler(_ScriptedProbe([Reading()])).sample()["energy_j"] is None
    )  # nothing known: None, not 0


def test_a_failing_sink_does_not_stop_the_run(tiny_config):
    def broken_sink(sample):
        raise ConnectionError("database down")

    result = train(tiny_config(train={"steps": 3}), sink=broken_sink)
    assert result.status == "completed" and result.samples >= 1


def test_the_training_loop_never_probes_the_device(tiny_config, monkeypatch):
    reads = []
    original = CpuProbe.read
    monkeypatch.setattr(CpuProbe, "read", lambda self: reads.append(1) or original(self))
    result = train(tiny_config(train={"steps": 6}, telemetry={"interval_s": 3600.0}))
    assert result.steps == 6
    assert (
        len(reads) == 2
    )  # the baseline when the sampler starts and the final sample: none per step


def test_a_diverged_loss_is_reported_as_unknown_not_nan():
    sampler = _sampler(_ScriptedProbe([Reading(power_w=1.0)]))
    sampler.counters.progress = Progress(3, 300, 0.3, 3, float("nan"), 1)
    sample = sampler.sample()
    assert sample["loss"] is None and sample["step"] == 3


@pytest.mark.slow
def test_a_live_update_retimes_the_sampler_and_bad_ones_are_ignored(tiny_config):
    updates = [
        {"telemetry": {"interval_s": 0.02}},
        {
            "optimizer": {"dynamic_batching": {"min_micro_batch": 100}}
        },  # min > max: refused, run goes on
        {"model": {"preset": "small"}},
    ]  # not a live key: ignored
    calls = []

    def live():
        calls.append(1)
        return updates.pop(0) if updates else None

    samples = []
    result = train(
        tiny_config(train={"steps": 12}, telemetry={"interval_s": 3600.0}),
        sink=samples.append,
        live=live,
    )
    assert result.status == "completed" and len(calls) == 12
    assert len(samples) > 3  # an hourly sampler would have sent only the final sample
