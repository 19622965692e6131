"""The sampler: a daemon thread that reads this rank's device every interval and merges the
training's latest numbers into one telemetry sample.

The training side publishes one immutable ``Progress`` tuple per ``Run.log()`` (a single
attribute assignment, atomic under the GIL): no lock on the hot path. Everything else (probing
the device, integrating energy, turning a 0-d tensor into a number, averaging step times)
happens here, off the training thread.

A held-out evaluation is an event, not a reading: ``Run.log_eval`` queues it with the progress
of its moment, wakes this thread, and it goes as a sample of its own (its own seq, that step and
those tokens), before any later reading, so it is sent once and never merged into another.
``Run.log_metrics`` and ``Run.log_params`` queue theirs the same way (keys ``metrics`` with
``metrics_step``, and ``params``), without the wake: they go with the next reading.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from costlab.probes import CpuProbe, NvmlProbe, Reading

log = logging.getLogger(__name__)


class Progress(NamedTuple):
    step: int  # optimizer steps completed (the world's)
    tokens_own: Any  # this rank's cumulative tokens: an int, or a 0-d tensor summed lazily
    tokens_seen: Any  # the world's cumulative tokens as the framework counts them, or None
    step_time_total: float  # seconds, summed over the steps logged
    steps_timed: int
    loss: Any  # a number or a 0-d tensor, read here; None: not known yet
    at: float  # perf_counter() of the last log()


def number(value: Any) -> float | None:
    """A finite float of a number or a 0-d tensor, else None (JSON has no NaN)."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return value if math.isfinite(value) else None


class Evaluation(NamedTuple):
    progress: Progress  # the training's progress when it was taken: its step and tokens
    fields: dict[str, Any]  # eval_loss / quality / eval_s, checked (costlab.evaluation)


class Sampler:
    """Samples every ``interval_s`` on a daemon thread, and once more, finally, from ``stop()``.

    seq: this rank's n-th sample is ``n * world_size + rank``, so the ranks of one run share its
    seq space without talking to each other, and each rank's stream rises with its seq.
    """

    def __init__(
        self,
        *,
        probe: CpuProbe | NvmlProbe,
        progress: Callable[[], Progress],
        interval_s: float,
        emit: Callable[[dict[str, Any]], None],
        rank: int = 0,
        world_size: int = 1,
        evaluations: deque[Evaluation] | None = None,
        stream: str | None = None,
    ):
        self.probe, self.progress, self.interval_s, self.emit = probe, progress, interval_s, emit
        # This sampler's id on every sample: the server takes one sampler per (run, rank).
        self.stream = stream
        self.rank, self.world_size = rank, world_size
        # Appended by the training thread (deque.append: atomic), drained here, oldest first.
        self.evaluations: deque[Evaluation] = deque() if evaluations is None else evaluations
        self.count = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="costlab-sampler", daemon=True)
        first = self._read()
        self._energy_base = first.energy_j
        self._last_counter = first.energy_j
        self.energy_j: float | None = (
            0.0 if first.energy_j is not None or first.power_w is not None else None
        )
        self._last_mono = time.perf_counter()
        self._last_ts = 0.0
        self._last = progress()
        self._last_tokens = 0
        self._last_step = 0

    def start(self) -> Sampler:
        self.sample()  # seq 0 at the start: billed time opens here
        self._thread.start()
        return self

    def wake(self) -> None:
        """An evaluation is queued: send it now, not at the next interval."""
        self._wake.set()

    def _loop(self) -> None:
        due = time.perf_counter() + self.interval_s
        while True:
            self._wake.wait(max(0.0, due - time.perf_counter()))
            self._wake.clear()  # before draining: an evaluation queued from here on wakes again
            if self._stop.is_set():
                return
            try:
                if time.perf_counter() >= due:
                    due = time.perf_counter() + self.interval_s
                    self.sample()
                else:
                    self.sample_evaluations()
            except Exception:  # keep sampling: one bad reading must not end the run's telemetry
                log.exception("costlab: telemetry sample failed")

    def stop(self) -> None:
        """Stop the thread and take the final sample (the training's last numbers), after any
        evaluation still queued."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
        self.sample()
        self.probe.close()

    def _read(self) -> Reading:
        try:
            return self.probe.read()
        except Exception:  # a vanished /proc entry or an NVML hiccup: report unknowns, not a crash
            log.exception("costlab: device probe failed; this sample reports unknowns")
            return Reading()

    def _energy(self, reading: Reading, dt: float) -> tuple[float | None, float | None]:
        """Cumulative energy since the start (J): the device's counter where it has one, else
        power x time."""
        power_w, counter = reading.power_w, reading.energy_j
        if counter is not None and self._energy_base is not None:
            if power_w is None and self._last_counter is not None and dt > 0:
                power_w = max(0.0, counter - self._last_counter) / dt
            self._last_counter = counter
            self.energy_j = max(self.energy_j or 0.0, counter - self._energy_base)
        elif power_w is not None:
            self.energy_j = (self.energy_j or 0.0) + power_w * dt
        return power_w, self.energy_j

    def _tokens(self, progress: Progress) -> int:
        """The world's cumulative tokens: the framework's count where it keeps one, else this
        rank's times the world size (DDP hands every rank an equal share of the batch)."""
        if progress.tokens_seen is not None:
            seen = number(progress.tokens_seen)
        else:
            own = number(progress.tokens_own)
            seen = None if own is None else own * self.world_size
        # A cumulative counter never runs backwards (the server refuses one that does).
        return max(self._last_tokens, 0 if seen is None else round(seen))

    def sample(self) -> dict[str, Any]:
        """The queued evaluations, each a sample of its own, then a reading of now; returns it."""
        with self._lock:
            self._drain()
            return self._take(self.progress(), None)

    def sample_evaluations(self) -> None:
        """The queued evaluations only, each a sample of its own."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        while self.evaluations:
            evaluation = self.evaluations.popleft()
            self._take(evaluation.progress, evaluation.fields)

    def _take(self, progress: Progress, evaluation: dict[str, Any] | None) -> dict[str, Any]:
        """One sample of `progress` and the device now, emitted; under the lock, so a stream's
        seq, ts, tokens and step all rise in the order its samples are put."""
        now_mono = time.perf_counter()
        dt = now_mono - self._last_mono
        reading = self._read()
        power_w, energy_j = self._energy(reading, dt)
        last = self._last
        steps = progress.steps_timed - last.steps_timed
        step_time = (progress.step_time_total - last.step_time_total) / steps if steps > 0 else None
        tokens = self._tokens(progress)
        step = max(self._last_step, int(progress.step))
        # Wall-clock time for the server, never backwards within this stream (an NTP step
        # back would otherwise make the batch refused).
        ts = max(time.time(), self._last_ts + 1e-6)
        sample = {
            "seq": self.count * self.world_size + self.rank,
            "ts": ts,
            "step": step,
            "rank": self.rank,
            "stream": self.stream,
            "device": self.probe.label,
            "util_pct": reading.util_pct,
            "mem_used_mb": reading.mem_used_mb,
            "mem_total_mb": reading.mem_total_mb,
            "power_w": power_w,
            "energy_j": energy_j,
            "step_time_s": step_time,
            "tokens": tokens,
            "tokens_per_s": (tokens - self._last_tokens) / dt if dt > 0 else None,
            "loss": number(progress.loss),
            "sm_clock_mhz": reading.sm_clock_mhz,
            "temperature_c": reading.temperature_c,
            "sm_occupancy_pct": reading.sm_occupancy_pct,
            "tensor_active_pct": reading.tensor_active_pct,
            "dram_bw_pct": reading.dram_bw_pct,
            "estimated": bool(self.probe.estimated),
        }
        sample = {
            k: v
            for k, v in sample.items()
            if v is not None and not (isinstance(v, float) and not math.isfinite(v))
        }
        if "util_pct" in sample:
            sample["util_pct"] = min(100.0, sample["util_pct"])
        if evaluation:
            sample.update(evaluation)
        self.count += 1
        self._last_mono, self._last_ts = now_mono, ts
        if steps >= 0:  # an evaluation's progress is never newer than the training's
            self._last = progress
        self._last_tokens, self._last_step = tokens, step
        self.emit(sample)
        return sample
