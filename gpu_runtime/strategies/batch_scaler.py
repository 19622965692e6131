"""Dynamic micro-batching (`optimizer.dynamic_batching`).

The global batch is fixed: the scaler picks the micro-batch and the accumulation
steps that add up to it, so the optimisation target never changes, only throughput
and memory do. Gradient statistics say how large a micro-batch they justify:

* `noise_scale` (default): the gradient noise scale B_simple = tr(Sigma) / |G|^2
  (McCandlish et al. 2018, App. A.1; AdaptDL), estimated during accumulation
  (`accumulation.GradientNormTracker`, `NoiseScaleEstimator`). The estimate needs two micro-batches
  a step, so this policy's largest micro-batch is half the global batch (AdaptDL
  instead keeps a copy of the last step's gradient: a model's worth of memory, spent
  exactly when memory is tightest).
* `grad_variance`: the design document's rule, tanh of the variance of the last
  gradient norms, made scale-free (variance / mean^2) so loss scaling and model size
  do not move it. Like the document's formula (not its prose), more variance -> larger.

Growth is checked against a memory model (peak bytes per sample measured at run
time); an out-of-memory error halves the micro-batch and the step is retried.
The bounds and the window can change while a run trains (`reconfigure`, a live update).
"""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from gpu_runtime.strategies.accumulation import (  # noqa: F401 - re-exported: the scaler's public API
    AccumulationPlan,
    GradientNormTracker,
    GradientStats,
    NoiseScaleEstimator,
    plan_accumulation,
)

POLICIES = ("noise_scale", "grad_variance")
_KEY = "optimizer.dynamic_batching"
T = TypeVar("T")


class MicroBatchFloorError(RuntimeError):
    """Out of memory at the smallest micro-batch allowed: halving cannot help."""


class MemoryModel:
    """Step peak above the resting baseline as fixed + per-sample * m, fitted on what was measured.

    With one micro-batch size seen, everything is charged per sample (pessimistic for
    growth); with several, a least-squares line over each size's worst peak.
    """

    def __init__(self) -> None:
        self.baseline_bytes = 0
        self._worst: dict[int, float] = {}  # micro-batch -> largest peak above baseline

    @property
    def samples(self) -> int:
        return len(self._worst)

    def record(self, *, micro_batch: int, peak_bytes: int, baseline_bytes: int) -> None:
        self.baseline_bytes = baseline_bytes
        extra = float(peak_bytes - baseline_bytes)
        self._worst[micro_batch] = max(self._worst.get(micro_batch, extra), extra)

    def predict_peak(self, micro_batch: int) -> float:
        sizes = list(self._worst)
        if len(sizes) == 1:
            return self.baseline_bytes + self._worst[sizes[0]] / sizes[0] * micro_batch
        mean_m = sum(sizes) / len(sizes)
        mean_e = sum(self._worst.values()) / len(sizes)
        slope = (sum((m - mean_m) * (self._worst[m] - mean_e) for m in sizes)
                 / sum((m - mean_m) ** 2 for m in sizes))
        slope = max(slope, 0.0)
        return self.baseline_bytes + mean_e + slope * (micro_batch - mean_m)


@dataclass(frozen=True)
class ScalerEvent:
    """One decision of the scaler, with the numbers it was made on."""

    step: int
    kind: str  # grow | shrink | memory_cap | oom | bounds
    old_micro_batch: int
    new_micro_batch: int
    detail: dict = field(default_factory=dict)


class BatchScaler:
    """Chooses the micro-batch in [min, max], changing it at most once per stability window."""

    def __init__(
        self, *, global_batch: int, min_micro_batch: int, max_micro_batch: int, stability_window: int,
        policy: str = "noise_scale", initial_micro_batch: int | None = None,
        memory_capacity_bytes: int | None = None, memory_headroom: float = 0.9,
        ema_decay: float = 0.9, variance_window: int = 10, variance_threshold: float = 0.1,
        variance_width: float = 0.1, max_floor_retries: int = 2,
    ):
        if policy not in POLICIES:
            raise ValueError(f"{_KEY}.policy: {policy!r} is not one of {', '.join(POLICIES)}")
        self.global_batch = global_batch
        self.policy = policy
        self._check_bounds(min_micro_batch, max_micro_batch, stability_window)
        self.min_micro_batch, self.max_micro_batch = min_micro_batch, self._usable_max(min_micro_batch, max_micro_batch)
        self.stability_window = stability_window
        self.memory_capacity_bytes = memory_capacity_bytes
        self.memory_headroom = memory_headroom
        self.variance_threshold = variance_threshold
        self.variance_width = variance_width
        self.max_floor_retries = max_floor_retries
        self.memory = MemoryModel()
        self.noise = NoiseScaleEstimator(ema_decay=ema_decay)
        self._norms: deque[float] = deque(maxlen=variance_window)
        self._oom_limit: int | None = None  # the largest micro-batch below one that ran out of memory
        self._floor_failures = 0
        start = min_micro_batch if initial_micro_batch is None else initial_micro_batch
        self.micro_batch = min(max(start, min_micro_batch), self.max_micro_batch)
        self.step = 0
        self._last_change = 0
        self.events: list[ScalerEvent] = []

    def _check_bounds(self, min_micro_batch: int, max_micro_batch: int, stability_window: int) -> None:
        if not 1 <= min_micro_batch <= max_micro_batch:
            raise ValueError(f"{_KEY}: need 1 <= min_micro_batch ({min_micro_batch}) "
                             f"<= max_micro_batch ({max_micro_batch})")
        if min_micro_batch > self.global_batch:
            raise ValueError(f"{_KEY}.min_micro_batch ({min_micro_batch}) exceeds the global batch "
                             f"({self.global_batch}): the micro-batch cannot be larger than the batch")
        if stability_window < 1:
            raise ValueError(f"{_KEY}.stability_window must be >= 1, got {stability_window}")

    def _usable_max(self, min_micro_batch: int, max_micro_batch: int) -> int:
        usable = min(max_micro_batch, self.global_batch)  # more would change the global batch
        if self.policy == "noise_scale" and self.global_batch >= 2 * min_micro_batch:
            # the estimate differences micro-batch and step gradients: keep two micro-batches a step
            usable = min(usable, self.global_batch // 2)
        return usable

    @property
    def _ceiling(self) -> int:
        return self.max_micro_batch if self._oom_limit is None else min(self.max_micro_batch, self._oom_limit)

    def reconfigure(self, *, min_micro_batch: int, max_micro_batch: int, stability_window: int) -> AccumulationPlan:
        """New bounds and window (a live update), applied now: a step boundary.

        A micro-batch outside the new bounds is clamped into them at once (event
        `bounds`); the policy's next change then waits a full window. What the run
        learnt (noise estimate, memory model, an out-of-memory limit) is kept.
        """
        self._check_bounds(min_micro_batch, max_micro_batch, stability_window)
        self.min_micro_batch, self.max_micro_batch = min_micro_batch, self._usable_max(min_micro_batch, max_micro_batch)
        self.stability_window = stability_window
        clamped = min(max(self.micro_batch, self.min_micro_batch), self.max_micro_batch)
        if clamped != self.micro_batch:
            self._change("bounds", clamped, {"min_micro_batch": min_micro_batch, "max_micro_batch": max_micro_batch})
        return self.plan

    @property
    def plan(self) -> AccumulationPlan:
        return plan_accumulation(self.global_batch, self.micro_batch)

    @property
    def relative_grad_variance(self) -> float | None:
        """var / mean^2 of the last gradient norms; None until the window is full."""
        if len(self._norms) < (self._norms.maxlen or 0):
            return None
        mean = sum(self._norms) / len(self._norms)
        var = sum((n - mean) ** 2 for n in self._norms) / len(self._norms)
        return var / mean**2 if mean > 0 else 0.0

    def update(
        self, stats: GradientStats | None, *, peak_memory_bytes: int | None = None,
        baseline_memory_bytes: int | None = None,
    ) -> AccumulationPlan:
        """Record a finished optimizer step; return the plan for the next one."""
        self.step += 1
        self._floor_failures = 0
        if peak_memory_bytes is not None:
            self.memory.record(micro_batch=self.micro_batch, peak_bytes=peak_memory_bytes,
                               baseline_bytes=baseline_memory_bytes or 0)
        if stats is not None and stats.finite:
            self.noise.observe(stats)
            self._norms.append(math.sqrt(stats.big_sq_norm))
        if self.step - self._last_change >= self.stability_window:
            target = self._policy_target()
            if target is not None:
                self._move_towards(target)
        return self.plan

    def _policy_target(self) -> float | None:
        lo, hi = self.min_micro_batch, self.max_micro_batch
        if self.policy == "noise_scale":
            return self.noise.noise_scale
        variance = self.relative_grad_variance
        if variance is None:
            return None
        return lo + (hi - lo) * (1 + math.tanh((variance - self.variance_threshold) / self.variance_width)) / 2

    def _candidates(self) -> list[int]:
        """Powers of two inside the bounds plus the bounds: few shapes, few recompiles."""
        lo, hi = self.min_micro_batch, self.max_micro_batch
        powers = {2**i for i in range(hi.bit_length() + 1) if lo <= 2**i <= hi}
        return sorted(c for c in powers | {lo, hi} if c <= self._ceiling or c == lo)

    def _move_towards(self, target: float) -> None:
        candidates = self._candidates()
        log_target = math.log(min(max(target, 1e-9), 1e12))
        wanted = min(candidates, key=lambda c: (abs(math.log(c) - log_target), c))
        chosen, kind = wanted, ("grow" if wanted > self.micro_batch else "shrink")
        if wanted > self.micro_batch:
            fitting = [c for c in candidates if self.micro_batch <= c <= wanted and self._fits(c)]
            chosen = max(fitting, default=self.micro_batch)
            if chosen < wanted:
                kind = "memory_cap"
        if chosen == self.micro_batch:
            return
        detail = {"policy": self.policy, "target": target}
        if self.memory.samples:
            detail["predicted_peak_bytes"] = self.memory.predict_peak(chosen)
        self._change(kind, chosen, detail)

    def _fits(self, micro_batch: int) -> bool:
        if self.memory_capacity_bytes is None:
            return True
        if not self.memory.samples:  # nothing measured yet: at most double
            return micro_batch <= 2 * self.micro_batch
        return self.memory.predict_peak(micro_batch) <= self.memory_headroom * self.memory_capacity_bytes

    def _change(self, kind: str, new: int, detail: dict) -> None:
        self.events.append(ScalerEvent(self.step, kind, self.micro_batch, new, detail))
        self.micro_batch = new
        self._last_change = self.step

    def on_out_of_memory(self, error: BaseException | None = None) -> AccumulationPlan:
        """Halve the micro-batch (never below min) and keep it below the size that failed."""
        detail = {"error": str(error)[:200] if error else "out of memory"}
        if self.micro_batch == self.min_micro_batch:
            self._floor_failures += 1
            self.events.append(ScalerEvent(self.step, "oom", self.micro_batch, self.micro_batch, detail))
            if self._floor_failures > self.max_floor_retries:
                raise MicroBatchFloorError(
                    f"{_KEY}.min_micro_batch: out of memory at the minimum micro-batch "
                    f"({self.min_micro_batch}) {self._floor_failures} times; lower it or free memory")
            return self.plan
        self._oom_limit = max(self.min_micro_batch, self.micro_batch - 1)
        self._change("oom", max(self.min_micro_batch, self.micro_batch // 2), detail)
        return self.plan


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_step_with_oom_retry(
    step_fn: Callable[[AccumulationPlan], T], scaler: BatchScaler, *,
    cleanup: Callable[[], None] | None = None, tracker: GradientNormTracker | None = None,
) -> T:
    """Run one optimizer step; on out-of-memory free, halve, record and retry until it fits.

    `cleanup` drops what the failed attempt left (e.g. optimizer.zero_grad(set_to_none=True)).
    Only MicroBatchFloorError escapes: the minimum micro-batch itself does not fit.
    """
    while True:
        failure: BaseException | None = None
        try:
            return step_fn(scaler.plan)
        except Exception as error:  # only out-of-memory is handled; the rest re-raises
            if not is_out_of_memory(error):
                raise
            failure = RuntimeError(str(error))  # keep the text, drop the frames holding tensors
        # outside the except block, so the traceback and its tensors are gone before freeing
        if cleanup is not None:
            cleanup()
        if tracker is not None:
            tracker.reset()
        free_device_memory()
        scaler.on_out_of_memory(failure)


class SimulatedOom:
    """Test hook: raises torch.OutOfMemoryError for micro-batches above `fits_up_to`."""

    def __init__(self, fits_up_to: int):
        self.fits_up_to = fits_up_to
        self.raised = 0

    def check(self, micro_batch: int) -> None:
        if micro_batch > self.fits_up_to:
            self.raised += 1
            raise torch.OutOfMemoryError(
                f"simulated out of memory: micro-batch {micro_batch} > {self.fits_up_to} (test hook)")
