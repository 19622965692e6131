"""How the trainer cuts each global batch into micro-batches: a fixed plan, or a BatchScaler.

With `optimizer.dynamic_batching.enabled` the micro-batch follows the gradient noise
scale (or the variance rule) inside [min_micro_batch, max_micro_batch]; an
out-of-memory error halves it and retries the step on the same batch; a live update
of the bounds or the window reaches the scaler at the next step boundary. Otherwise
the plan is `train.micro_batch` (or the whole global batch), fixed.

The statistics add no host sync: the two gradient norms of a step stay on the device
until the trainer reads them together with the loss, in its one sync per step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from gpu_runtime.schema import DynamicBatchingSection, StrategyConfig
from gpu_runtime.strategies.accumulation import AccumulationPlan, GradientNormTracker, plan_accumulation
from gpu_runtime.strategies.batch_scaler import BatchScaler, ScalerEvent, run_step_with_oom_retry

log = logging.getLogger(__name__)
T = TypeVar("T")


def _memory_capacity(device: torch.device) -> int | None:
    """Bytes this process may allocate on a CUDA device (its memory fraction applied); None on CPU."""
    if device.type != "cuda":
        return None  # host memory is not what limits a CPU run's micro-batch: no growth cap
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _device: 1.0)(device)
    return int(total * fraction)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def event_dict(event: ScalerEvent) -> dict[str, Any]:
    """A scaler event as JSON-safe data (a noise scale can be infinite)."""
    return {"step": event.step, "kind": event.kind, "old_micro_batch": event.old_micro_batch,
            "new_micro_batch": event.new_micro_batch, "detail": {k: _finite(v) for k, v in event.detail.items()}}


class MicroBatching:
    """The micro-batch policy of one run, and the events it took."""

    def __init__(self, config: StrategyConfig, *, params: Iterable[torch.nn.Parameter], device: torch.device):
        self.device = device
        self.global_batch = config.train.global_batch
        dyn = config.optimizer.dynamic_batching
        self.scaler: BatchScaler | None = None
        self.tracker: GradientNormTracker | None = None
        self.run_peak_bytes = 0  # CUDA: the largest step peak (per-step peaks reset the allocator's)
        self._baseline = 0
        if dyn.enabled:
            self.scaler = BatchScaler(
                global_batch=self.global_batch, min_micro_batch=dyn.min_micro_batch,
                max_micro_batch=dyn.max_micro_batch, stability_window=dyn.stability_window, policy=dyn.policy,
                initial_micro_batch=config.train.micro_batch, memory_capacity_bytes=_memory_capacity(device))
            # device parameters first: a norm over mixed devices lands on the first one's device,
            # and a CPU-first order would pull the device's norm to the host (a sync)
            ordered = sorted(params, key=lambda p: p.device.type == "cpu")
            self.tracker = GradientNormTracker(ordered)
        else:
            self._plan = plan_accumulation(self.global_batch, config.train.micro_batch or self.global_batch)

    @property
    def enabled(self) -> bool:
        return self.scaler is not None

    @property
    def plan(self) -> AccumulationPlan:
        return self.scaler.plan if self.scaler is not None else self._plan

    @property
    def events(self) -> list[dict[str, Any]]:
        return [] if self.scaler is None else [event_dict(e) for e in self.scaler.events]

    def run(self, accumulate: Callable[[AccumulationPlan], T], *, cleanup: Callable[[], None]
            ) -> tuple[T, AccumulationPlan]:
        """Accumulate one step's gradients; with dynamic batching, survive out-of-memory by halving."""
        if self.scaler is None:
            return accumulate(self._plan), self._plan
        if self.device.type == "cuda":  # host-side allocator counters: no sync
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)
        ran: list[AccumulationPlan] = []
        seen = len(self.scaler.events)

        def attempt(plan: AccumulationPlan) -> T:
            ran.append(plan)
            return accumulate(plan)

        result = run_step_with_oom_retry(attempt, self.scaler, cleanup=cleanup, tracker=self.tracker)
        self._log_new(seen)  # out-of-memory retries, if any
        return result, ran[-1]

    def after_micro_batch(self, plan: AccumulationPlan, index: int) -> None:
        if self.tracker is not None:
            self.tracker.after_micro_batch(plan, index)

    def pending_norms(self, *, loss_scale: torch.Tensor | None) -> torch.Tensor | None:
        """The step's two squared gradient norms, unscaled, still on the device (read with the loss)."""
        if self.tracker is None:
            return None
        return self.tracker.pending_sq_norms(divide_by=None if loss_scale is None else loss_scale.square())

    def finish_step(self, norms: list[float] | None) -> None:
        """After the step's one sync: feed the scaler what it measured; it picks the next plan."""
        if self.scaler is None or self.tracker is None:
            return
        stats = self.tracker.stats_from(*norms) if norms is not None else None
        peak = None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            self.run_peak_bytes = max(self.run_peak_bytes, peak)
        seen = len(self.scaler.events)
        self.scaler.update(stats, peak_memory_bytes=peak, baseline_memory_bytes=self._baseline if peak else None)
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
        self.scaler.reconfigure(min_micro_batch=section.min_micro_batch, max_micro_batch=section.max_micro_batch,
                                stability_window=section.stability_window)
        self._log_new(seen)

    def _log_new(self, seen: int) -> None:
        assert self.scaler is not None
        for event in self.scaler.events[seen:]:
            log.info("micro-batch %s at step %d: %d -> %d %s", event.kind, event.step, event.old_micro_batch,
                     event.new_micro_batch, event.detail)
