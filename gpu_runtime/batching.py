"""How the trainer cuts each global batch into micro-batches: a fixed plan, or a BatchScaler.

With `optimizer.dynamic_batching.enabled` the global batch stays `train.global_batch`
and the micro-batch grows inside [min_micro_batch, max_micro_batch] while the memory
model predicts the next size fits and the measured throughput rises
(`strategies.batch_scaler`); an out-of-memory error halves it and retries the step on
the same batch; a live update of the bounds reaches the scaler at the next step boundary.
Only the opt-in `adaptive_global_batch` lets gradient statistics move the global batch
(and the learning rate with it). Otherwise the plan is `train.micro_batch` (or the
whole global batch), fixed.

Memory: on CUDA the allocator's peak against the device's capacity; on CPU the
process's peak RSS (Linux: VmHWM, reset each step through /proc/self/clear_refs;
elsewhere the current RSS) against `cpu_memory_budget_mb` (unset: half the host's RAM).

Throughput is timed with the wall clock on CUDA and with the process's CPU time on CPU
(on a shared host, other tenants move the wall clock by tens of per cent, not this).
Nothing here adds a host sync: a step's compute time is read on the host after the
trainer's one sync per step (the loss), and the two gradient norms of the adaptive
global batch stay on the device until that same sync.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import psutil
import torch

from gpu_runtime.schema import DynamicBatchingSection, StrategyConfig
from gpu_runtime.strategies.accumulation import (
    AccumulationPlan,
    GradientNormTracker,
    plan_accumulation,
)
from gpu_runtime.strategies.batch_scaler import (
    BatchScaler,
    ScalerConfig,
    ScalerEvent,
    run_step_with_oom_retry,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


def _memory_capacity(device: torch.device, budget_mb: int | None) -> int:
    """Bytes the step's peak may reach: CUDA's memory (its fraction applied), or the CPU budget."""
    if device.type != "cuda":
        return budget_mb * 2**20 if budget_mb is not None else psutil.virtual_memory().total // 2
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _device: 1.0)(device)
    return int(total * fraction)


class HostMemory:
    """This process's resident memory: now, and its peak since the last reset (Linux), host-side
    reads only."""

    _CLEAR_REFS, _STATUS = "/proc/self/clear_refs", "/proc/self/status"

    def __init__(self) -> None:
        self._process = psutil.Process()
        self.resettable = self._reset()

    def _reset(self) -> bool:
        try:
            with open(self._CLEAR_REFS, "w") as handle:
                handle.write("5")  # resets VmHWM to the current RSS
            return True
        except OSError:
            return False

    def rss(self) -> int:
        return self._process.memory_info().rss

    def reset_peak(self) -> None:
        if self.resettable:
            self.resettable = self._reset()

    def peak(self) -> int:
        """Peak RSS since reset_peak (bytes); the current RSS where the kernel cannot say."""
        if self.resettable:
            try:
                with open(self._STATUS) as handle:
                    for line in handle:
                        if line.startswith("VmHWM:"):
                            return int(line.split()[1]) * 1024
            except OSError:
                pass
        return self.rss()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def event_dict(event: ScalerEvent) -> dict[str, Any]:
    """A scaler event as JSON-safe data (a noise scale can be infinite)."""
    return {
        "step": event.step,
        "kind": event.kind,
        "old_micro_batch": event.old_micro_batch,
        "new_micro_batch": event.new_micro_batch,
        "detail": {k: _finite(v) for k, v in event.detail.items()},
    }


class MicroBatching:
    """The micro-batch policy of one run, and the events it took."""

    def __init__(
        self, config: StrategyConfig, *, params: Iterable[torch.nn.Parameter], device: torch.device
    ):
        self.device = device
        self.global_batch = config.train.global_batch
        dyn = config.optimizer.dynamic_batching
        self.scaler: BatchScaler | None = None
        self.tracker: GradientNormTracker | None = None
        self.host: HostMemory | None = None
        self.run_peak_bytes = (
            0  # CUDA: the largest step peak (per-step peaks reset the allocator's)
        )
        self._baseline = 0
        self._started: float | None = None  # the clock at the step's start; None after an OOM retry
        # CPU: this process's CPU time, which other tenants' load on a shared host does not move
        # (the wall clock swings by tens of per cent there); CUDA: the wall clock, after the step's
        # sync
        self._clock = time.perf_counter if device.type == "cuda" else time.process_time
        if dyn.enabled:
            self.scaler = BatchScaler(
                ScalerConfig(
                    global_batch=self.global_batch,
                    min_micro_batch=dyn.min_micro_batch,
                    max_micro_batch=dyn.max_micro_batch,
                    stability_window=dyn.stability_window,
                    policy=dyn.policy,
                    initial_micro_batch=config.train.micro_batch,
                    memory_capacity_bytes=_memory_capacity(device, dyn.cpu_memory_budget_mb),
                    probe_steps=dyn.probe_steps,
                    min_speedup=dyn.min_speedup,
                    adaptive_global_batch=dyn.adaptive_global_batch,
                    min_global_batch=dyn.min_global_batch,
                    lr_scaling=dyn.lr_scaling,
                )
            )
            if device.type != "cuda":
                self.host = HostMemory()
            if dyn.adaptive_global_batch:  # statistics only where they decide something
                # device parameters first: a norm over mixed devices lands on the first one's
                # device, and a CPU-first order would pull the device's norm to the host (a sync)
                ordered = sorted(params, key=lambda p: p.device.type == "cpu")
                self.tracker = GradientNormTracker(ordered)
        else:
            self._plan = plan_accumulation(
                self.global_batch, config.train.micro_batch or self.global_batch
            )

    @property
    def lr_scale(self) -> float:
        """The learning rate's factor: 1.0 unless adaptive_global_batch moved the global batch."""
        return 1.0 if self.scaler is None else self.scaler.lr_scale

    @property
    def enabled(self) -> bool:
        return self.scaler is not None

    @property
    def plan(self) -> AccumulationPlan:
        return self.scaler.plan if self.scaler is not None else self._plan

    @property
    def events(self) -> list[dict[str, Any]]:
        return [] if self.scaler is None else [event_dict(e) for e in self.scaler.events]

    def run(
        self, accumulate: Callable[[AccumulationPlan], T], *, cleanup: Callable[[], None]
    ) -> tuple[T, AccumulationPlan]:
        """Accumulate one step's gradients; with dynamic batching, survive out-of-memory by
        halving."""
        if self.scaler is None:
            return accumulate(self._plan), self._plan
        if self.device.type == "cuda":  # host-side allocator counters: no sync
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)
        elif self.host is not None:
            self.host.reset_peak()
            self._baseline = self.host.rss()
        self._started = self._clock()
        ran: list[AccumulationPlan] = []
        seen = len(self.scaler.events)

        def attempt(plan: AccumulationPlan) -> T:
            ran.append(plan)
            return accumulate(plan)

        result = run_step_with_oom_retry(
            attempt, self.scaler, cleanup=cleanup, tracker=self.tracker
        )
        if len(ran) > 1:
            self._started = None  # the failed attempts' time is not this micro-batch's cost
        self._log_new(seen)  # out-of-memory retries, if any
        return result, ran[-1]

    def after_micro_batch(self, plan: AccumulationPlan, index: int) -> None:
        if self.tracker is not None:
            self.tracker.after_micro_batch(plan, index)

    def pending_norms(self, *, loss_scale: torch.Tensor | None) -> torch.Tensor | None:
        """The step's two squared gradient norms, unscaled, still on the device (read with the
        loss)."""
        if self.tracker is None:
            return None
        return self.tracker.pending_sq_norms(
            divide_by=None if loss_scale is None else loss_scale.square()
        )

    def finish_step(self, norms: list[float] | None) -> None:
        """After the step's one sync: feed the scaler its time, memory peak and statistics; it
        plans the next."""
        if self.scaler is None:
            return
        seconds = None if self._started is None else self._clock() - self._started
        stats = (
            self.tracker.stats_from(*norms)
            if self.tracker is not None and norms is not None
            else None
        )
        peak = None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            self.run_peak_bytes = max(self.run_peak_bytes, peak)
        elif self.host is not None:
            peak = self.host.peak()
        seen = len(self.scaler.events)
        self.scaler.update(
            stats,
            peak_memory_bytes=peak,
            baseline_memory_bytes=self._baseline if peak else None,
            step_seconds=seconds,
        )
        self._log_new(seen)

    def adopt(self, micro_batch: int) -> None:
        """Follow another process's decision (a DDP rank takes rank 0's micro-batch)."""
        if self.scaler is not None:
            self.scaler.micro_batch = micro_batch

    def reconfigure(self, section: DynamicBatchingSection) -> None:
        """A live update of the bounds or the window, applied at this step boundary."""
        if self.scaler is None:
            return
        seen = len(self.scaler.events)
        self.scaler.reconfigure(
            min_micro_batch=section.min_micro_batch,
            max_micro_batch=section.max_micro_batch,
            stability_window=section.stability_window,
        )
        self._log_new(seen)

    def _log_new(self, seen: int) -> None:
        assert self.scaler is not None
        for event in self.scaler.events[seen:]:
            log.info(
                "batch %s at step %d: micro-batch %d -> %d %s",
                event.kind,
                event.step,
                event.old_micro_batch,
                event.new_micro_batch,
                event.detail,
            )
