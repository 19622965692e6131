"""The telemetry sampler: a thread that turns the trainer's counters into samples for a sink.

The training loop publishes one immutable ``Progress`` tuple per step (a single
attribute assignment, atomic under the GIL) and appends its step window to a deque.
Everything else—probing the device, integrating energy, averaging, MFU, overlap—
happens here, on the sampler thread, every ``interval_s``.

A held-out evaluation (``gpu_runtime.evaluation``) runs while the trainer holds the sampler
(``Sampler.held``): no sample is taken in the middle of one, the evaluation's own sample (with
``EVAL_KEYS``) is emitted out of turn, and its seconds, published in ``Progress.eval_s``, are
left out of the tokens/s of the interval that holds them (they stay in the wall time and the
energy, which the bill counts).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from gpu_runtime.mfu import mfu
from gpu_runtime.probes import CpuProbe, NvmlProbe, Reading
from gpu_runtime.timeline import OverlapMeter

log = logging.getLogger(__name__)

SAMPLE_KEYS = (
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
)
# Only on the sample an evaluation emits: the held-out loss, and the wall seconds it took.
EVAL_KEYS = ("eval_loss", "eval_s")


class Progress(NamedTuple):
    step: int  # optimizer steps completed
    tokens: int  # cumulative tokens trained on
    step_time_total: float  # seconds, summed over the steps this process ran
    steps_timed: int
    loss: float | None
    micro_batch: int
    eval_s: float = 0.0  # seconds spent evaluating held-out loss, cumulative (not step time)


class RunCounters:
    """What the trainer publishes; read by the sampler without locks."""

    def __init__(self, progress: Progress):
        self.progress = progress


class Sampler:
    """Samples every ``interval_s`` on a thread and once more, finally, from ``stop()``."""

    def __init__(
        self,
        *,
        probe: CpuProbe | NvmlProbe,
        counters: RunCounters,
        interval_s: float,
        sink: Callable[[dict[str, Any]], None] | None,
        flops_per_token: float,
        peak: float | None,
        overlap: OverlapMeter | None,
        rank: int = 0,
        devices: int = 1,
    ):
        self.probe, self.counters, self.interval_s, self.sink = probe, counters, interval_s, sink
        # A DDP rank samples its own device; its progress is the world's, so MFU is the world's
        # tokens/s over every device's peak (equal shards in lockstep: the same as each rank's).
        self.rank = rank
        self.flops_per_token, self.peak, self.overlap = (
            flops_per_token,
            None if peak is None else peak * devices,
            overlap,
        )
        self.seq = 0
        self.peak_mem_mb = 0.0
        self.sink_errors = 0
        self._stop = threading.Event()
        self._retime = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._loop, name="gpu_runtime-telemetry", daemon=True
        )
        first = probe.read()
        self.energy_j: float | None = (
            0.0 if first.energy_j is not None or first.power_w is not None else None
        )
        self._energy_base = first.energy_j
        self._last_energy_counter = first.energy_j
        self._last_mono = time.perf_counter()
        self._last_progress = counters.progress
        self._out_of_turn = False  # the last sample was an evaluation's

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def set_interval(self, interval_s: float) -> None:
        """Sample every ``interval_s`` from now on (a live strategy update); wakes the thread to
        retime."""
        self.interval_s = interval_s
        self._retime.set()

    def _loop(self) -> None:
        while True:
            self._retime.wait(self.interval_s)  # returns early on stop() or set_interval()
            if self._stop.is_set():
                return
            if self._retime.is_set():
                self._retime.clear()
                continue
            try:
                self._tick()
            except Exception:  # keep sampling: one bad reading must not end the run's telemetry
                log.exception("telemetry sample failed")

    def _tick(self) -> None:
        with self._lock:
            if self._out_of_turn and time.perf_counter() - self._last_mono < self.interval_s / 2:
                return  # an evaluation's sample was just emitted: it stands for this interval
            self._sample()

    @contextlib.contextmanager
    def held(self) -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
        """Hold the sampler while work that is not training runs (a held-out evaluation); yields
        ``emit(extra)``, which emits a sample now with the extra keys."""
        with self._lock:
            yield self._sample

    def _read(self) -> Reading:
        try:
            return self.probe.read()
        except Exception:  # a vanished /proc entry or an NVML hiccup: report unknowns, not a crash
            log.exception("device probe failed; this sample reports unknowns")
            return Reading()

    def stop(self) -> dict[str, Any]:
        """Stop the thread and emit the final sample (also after a cancel or SIGTERM)."""
        self._stop.set()
        self._retime.set()
        if self._thread.is_alive():
            self._thread.join()
        final = self.sample()
        self.probe.close()
        return final

    def _energy(
        self, power_w: float | None, counter_j: float | None, dt: float
    ) -> tuple[float | None, float | None]:
        """Cumulative energy since the start, from the counter where there is one, else power x
        time."""
        if counter_j is not None and self._energy_base is not None:
            if power_w is None and self._last_energy_counter is not None and dt > 0:
                power_w = max(0.0, counter_j - self._last_energy_counter) / dt
            self._last_energy_counter = counter_j
            self.energy_j = max(self.energy_j or 0.0, counter_j - self._energy_base)
        elif power_w is not None:
            self.energy_j = (self.energy_j or 0.0) + power_w * dt
        return power_w, self.energy_j

    def sample(self) -> dict[str, Any]:
        with self._lock:
            return self._sample()

    def _sample(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """One sample (the lock held), with ``extra`` keys (an evaluation's) when given."""
        now_mono = time.perf_counter()
        dt = now_mono - self._last_mono
        reading = self._read()
        power_w, energy_j = self._energy(reading.power_w, reading.energy_j, dt)
        progress, last = self.counters.progress, self._last_progress
        steps = progress.steps_timed - last.steps_timed
        step_time = (progress.step_time_total - last.step_time_total) / steps if steps > 0 else None
        # the interval's training time: an evaluation's seconds are not the steps'
        busy = dt - max(0.0, progress.eval_s - last.eval_s)
        tokens_per_s = (progress.tokens - last.tokens) / busy if busy > 0 else None
        ratios = self.overlap.collect() if self.overlap is not None else []
        if reading.mem_used_mb is not None:
            self.peak_mem_mb = max(self.peak_mem_mb, reading.mem_used_mb)
        sample = {
            "seq": self.seq,
            "ts": time.time(),
            "step": progress.step,
            "rank": self.rank,
            "device": self.probe.label,
            "util_pct": reading.util_pct,
            "mem_used_mb": reading.mem_used_mb,
            "mem_total_mb": reading.mem_total_mb,
            "power_w": power_w,
            "energy_j": energy_j,
            "step_time_s": step_time,
            "tokens": progress.tokens,
            "tokens_per_s": tokens_per_s,
            "micro_batch": progress.micro_batch,
            "loss": progress.loss,
            "overlap_ratio": sum(ratios) / len(ratios) if ratios else None,
            "mfu": mfu(tokens_per_s, self.flops_per_token, self.peak),
            "sm_clock_mhz": reading.sm_clock_mhz,
            "temperature_c": reading.temperature_c,
            "sm_occupancy_pct": reading.sm_occupancy_pct,
            "tensor_active_pct": reading.tensor_active_pct,
            "dram_bw_pct": reading.dram_bw_pct,
            "estimated": bool(self.probe.estimated),
            **(extra or {}),
        }
        for (
            key,
            value,
        ) in sample.items():  # JSON has no NaN: a diverged loss is reported as unknown
            if isinstance(value, float) and not math.isfinite(value):
                sample[key] = None
        self.seq += 1
        self._last_mono, self._last_progress = now_mono, progress
        self._out_of_turn = extra is not None
        if self.sink is not None:
            try:
                self.sink(sample)
            except Exception:  # a failing sink must not kill the run or the sampler
                self.sink_errors += 1
                log.exception("telemetry sink failed on sample seq=%d", sample["seq"])
        return sample
