"""Dynamic batching (`optimizer.dynamic_batching`): the micro-batch for throughput, the global
batch opt-in.

The micro-batch changes throughput and memory, never the optimisation: the global batch
is fixed and accumulation adds the micro-batches up to it. So the scaler moves the
micro-batch by what it costs, not by gradient statistics:

* **probe**: after `probe_steps` timed steps at a size (one warm-up step dropped), it
  tries the next size up (powers of two and the bounds) if the memory model predicts it
  fits (`MemoryModel`: step peak above the resting baseline, per sample, fitted on what
  was measured; CUDA's allocator, or the process's RSS on CPU, against the capacity);
* **keep or step back**: the larger size is kept only if its median throughput beats the
  smaller one's by `min_speedup`; otherwise the scaler steps back and stops probing;
* **out of memory**: halves the micro-batch, retries the step on the same batch, and
  never tries that size again.

Every change is an event with its reason and the numbers it was made on.

Gradient statistics describe the *global* batch. With the opt-in `adaptive_global_batch`
they choose it, within [min_global_batch, train.global_batch], once per stability window;
the learning rate follows (`lr_scale`: sqrt or linear in batch / train.global_batch, the
rules Pollux and AdaptDL use for Adam and SGD):

* `noise_scale` (default): the gradient noise scale B_simple = tr(Sigma) / |G|^2
  (McCandlish et al. 2018, App. A.1; AdaptDL), estimated during accumulation
  (`accumulation.GradientNormTracker`, `NoiseScaleEstimator`): the global batch moves to
  the candidate nearest B_simple. The estimate needs two micro-batches a step, so with
  this policy the micro-batch stays at most half the global batch.
* `grad_variance`: the design document's rule, tanh of the variance of the last
  gradient norms, made scale-free (variance / mean^2) so loss scaling and model size
  do not move it. Like the document's formula (not its prose), more variance -> larger.

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
LR_SCALINGS = ("sqrt", "linear")
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
        slope = sum((m - mean_m) * (self._worst[m] - mean_e) for m in sizes) / sum(
            (m - mean_m) ** 2 for m in sizes
        )
        slope = max(slope, 0.0)
        return self.baseline_bytes + mean_e + slope * (micro_batch - mean_m)


@dataclass(frozen=True)
class ScalerEvent:
    """One decision of the scaler, with the numbers it was made on."""

    step: int
    kind: str  # grow | shrink | memory_cap | oom | bounds | global_grow | global_shrink
    old_micro_batch: int
    new_micro_batch: int
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ScalerConfig:
    """What optimizer.dynamic_batching asks of the scaler (gpu_runtime.batching builds it from the
    strategy): the global batch and the micro-batch bounds, the policy and its knobs, memory."""

    global_batch: int
    min_micro_batch: int
    max_micro_batch: int
    stability_window: int
    policy: str = "noise_scale"
    initial_micro_batch: int | None = None
    memory_capacity_bytes: int | None = None
    memory_headroom: float = 0.9
    probe_steps: int = 4
    min_speedup: float = 0.03
    adaptive_global_batch: bool = False
    min_global_batch: int | None = None
    lr_scaling: str = "sqrt"
    ema_decay: float = 0.9
    variance_window: int = 10
    variance_threshold: float = 0.1
    variance_width: float = 0.1
    max_floor_retries: int = 2


class BatchScaler:
    """Chooses the micro-batch in [min, max] by measured throughput; with the opt-in key, the
    global batch too."""

    def __init__(self, config: ScalerConfig):
        c = self.config = config
        if c.policy not in POLICIES:
            raise ValueError(f"{_KEY}.policy: {c.policy!r} is not one of {', '.join(POLICIES)}")
        if c.lr_scaling not in LR_SCALINGS:
            raise ValueError(
                f"{_KEY}.lr_scaling: {c.lr_scaling!r} is not one of {', '.join(LR_SCALINGS)}"
            )
        if c.probe_steps < 1:
            raise ValueError(f"{_KEY}.probe_steps must be >= 1, got {c.probe_steps}")
        self.base_global_batch = (
            c.global_batch  # train.global_batch: the LR's reference and the upper bound
        )
        self.adaptive = c.adaptive_global_batch
        floor = (
            max(c.min_micro_batch, c.global_batch // 8)
            if c.min_global_batch is None
            else c.min_global_batch
        )
        if self.adaptive and not c.min_micro_batch <= floor <= c.global_batch:
            raise ValueError(
                f"{_KEY}.min_global_batch ({floor}) must lie in [min_micro_batch "
                f"({c.min_micro_batch}), train.global_batch ({c.global_batch})]"
            )
        self.min_global_batch = floor if self.adaptive else c.global_batch
        self.global_batch = self.min_global_batch
        self.lr_scaling = c.lr_scaling
        self.policy = c.policy
        self._check_bounds(c.min_micro_batch, c.max_micro_batch, c.stability_window)
        self.min_micro_batch, self._max_requested = c.min_micro_batch, c.max_micro_batch
        self.stability_window = c.stability_window
        self.probe_steps, self.min_speedup = c.probe_steps, c.min_speedup
        self.memory_capacity_bytes = c.memory_capacity_bytes
        self.memory_headroom = c.memory_headroom
        self.variance_threshold = c.variance_threshold
        self.variance_width = c.variance_width
        self.max_floor_retries = c.max_floor_retries
        self.memory = MemoryModel()
        self.noise = NoiseScaleEstimator(ema_decay=c.ema_decay)
        self._norms: deque[float] = deque(maxlen=c.variance_window)
        self._oom_limit: int | None = (
            None  # the largest micro-batch below one that ran out of memory
        )
        self._floor_failures = 0
        start = c.min_micro_batch if c.initial_micro_batch is None else c.initial_micro_batch
        self.micro_batch = min(max(start, c.min_micro_batch), self.max_micro_batch)
        self.step = 0
        self._last_change = 0  # step of the last global-batch change
        self._seconds: dict[
            int, list[float]
        ] = {}  # micro-batch -> seconds per sample of its timed steps
        self._warm = False  # the current size has run one (untimed) warm-up step
        self._probing = True
        self._smaller: int | None = None  # the size probed just before the current, larger one
        self.events: list[ScalerEvent] = []

    def _check_bounds(
        self, min_micro_batch: int, max_micro_batch: int, stability_window: int
    ) -> None:
        if not 1 <= min_micro_batch <= max_micro_batch:
            raise ValueError(
                f"{_KEY}: need 1 <= min_micro_batch ({min_micro_batch}) "
                f"<= max_micro_batch ({max_micro_batch})"
            )
        if min_micro_batch > self.min_global_batch:
            raise ValueError(
                f"{_KEY}.min_micro_batch ({min_micro_batch}) exceeds the global batch "
                f"({self.min_global_batch}): the micro-batch cannot be larger than the batch"
            )
        if stability_window < 1:
            raise ValueError(f"{_KEY}.stability_window must be >= 1, got {stability_window}")

    @property
    def max_micro_batch(self) -> int:
        usable = min(self._max_requested, self.global_batch)  # more would change the global batch
        if (
            self.adaptive
            and self.policy == "noise_scale"
            and self.global_batch >= 2 * self.min_micro_batch
        ):
            # the estimate differences micro-batch and step gradients: keep two micro-batches a step
            usable = min(usable, self.global_batch // 2)
        return usable

    @property
    def _ceiling(self) -> int:
        return (
            self.max_micro_batch
            if self._oom_limit is None
            else min(self.max_micro_batch, self._oom_limit)
        )

    @property
    def lr_scale(self) -> float:
        """The learning rate's factor for the current global batch (1.0 unless
        adaptive_global_batch)."""
        ratio = self.global_batch / self.base_global_batch
        return ratio if self.lr_scaling == "linear" else math.sqrt(ratio)

    def reconfigure(
        self, *, min_micro_batch: int, max_micro_batch: int, stability_window: int
    ) -> AccumulationPlan:
        """New bounds and window (a live update), applied now: a step boundary.

        A micro-batch outside the new bounds is clamped into them at once (event
        `bounds`) and probing starts again inside them. What the run learnt (timings,
        noise estimate, memory model, an out-of-memory limit) is kept.
        """
        self._check_bounds(min_micro_batch, max_micro_batch, stability_window)
        self.min_micro_batch, self._max_requested = min_micro_batch, max_micro_batch
        self.stability_window = stability_window
        clamped = min(max(self.micro_batch, self.min_micro_batch), self.max_micro_batch)
        if clamped != self.micro_batch:
            self._change(
                "bounds",
                clamped,
                {"min_micro_batch": min_micro_batch, "max_micro_batch": max_micro_batch},
            )
        self._probing, self._smaller = True, None
        return self.plan

    @property
    def plan(self) -> AccumulationPlan:
        return plan_accumulation(self.global_batch, min(self.micro_batch, self.global_batch))

    @property
    def relative_grad_variance(self) -> float | None:
        """var / mean^2 of the last gradient norms; None until the window is full."""
        if len(self._norms) < (self._norms.maxlen or 0):
            return None
        mean = sum(self._norms) / len(self._norms)
        var = sum((n - mean) ** 2 for n in self._norms) / len(self._norms)
        return var / mean**2 if mean > 0 else 0.0

    def update(
        self,
        stats: GradientStats | None = None,
        *,
        peak_memory_bytes: int | None = None,
        baseline_memory_bytes: int | None = None,
        step_seconds: float | None = None,
    ) -> AccumulationPlan:
        """Record a finished optimizer step (its compute time, memory peak, gradient stats); plan
        the next."""
        self.step += 1
        self._floor_failures = 0
        if peak_memory_bytes is not None:
            self.memory.record(
                micro_batch=self.micro_batch,
                peak_bytes=peak_memory_bytes,
                baseline_bytes=baseline_memory_bytes or 0,
            )
        if step_seconds is not None:
            if (
                self._warm
            ):  # the first step at a size pays for new shapes and allocations: not timed
                self._seconds.setdefault(self.micro_batch, []).append(
                    step_seconds / self.global_batch
                )
            self._warm = True
        if self.adaptive:
            if stats is not None and stats.finite:
                self.noise.observe(stats)
                self._norms.append(math.sqrt(stats.big_sq_norm))
            if self.step - self._last_change >= self.stability_window:
                target = self._policy_target()
                if target is not None:
                    self._move_global_towards(target)
        if self._probing and len(self._seconds.get(self.micro_batch, ())) >= self.probe_steps:
            self._probe()
        return self.plan

    # -- the micro-batch: throughput ---------------------------------------------------------

    def samples_per_s(self, micro_batch: int) -> float | None:
        """Median measured throughput at a micro-batch size, in samples (sequences) per second."""
        seconds = sorted(self._seconds.get(micro_batch, ()))
        if not seconds:
            return None
        return 1.0 / seconds[len(seconds) // 2]

    def _probe(self) -> None:
        here = self.samples_per_s(self.micro_batch)
        assert here is not None
        detail: dict = {"reason": "", "samples_per_s": here}
        if self._smaller is not None:
            before = self.samples_per_s(self._smaller)
            assert before is not None
            gain = here / before - 1
            detail |= {"smaller": self._smaller, "smaller_samples_per_s": before, "speedup": gain}
            if gain < self.min_speedup:
                self._probing = False
                self._change(
                    "shrink",
                    self._smaller,
                    detail
                    | {
                        "reason": f"not faster: {gain:+.1%} < min_speedup {self.min_speedup:.0%}; "
                        "probing stops"
                    },
                )
                return
        larger = [c for c in self._candidates() if c > self.micro_batch]
        if not larger:
            self._probing = False
            return
        nxt = larger[0]
        if self.memory.samples:
            detail["predicted_peak_bytes"] = self.memory.predict_peak(nxt)
        if not self._fits(nxt):
            self._probing = False
            detail |= {
                "reason": "the memory model predicts it does not fit; probing stops",
                "capacity_bytes": self.memory_capacity_bytes,
                "wanted": nxt,
            }
            self.events.append(
                ScalerEvent(self.step, "memory_cap", self.micro_batch, self.micro_batch, detail)
            )
            return
        self._smaller = self.micro_batch
        self._change("grow", nxt, detail | {"reason": "probe: predicted to fit; keep it if faster"})

    def _candidates(self) -> list[int]:
        """Powers of two inside the bounds plus the bounds: few shapes, few recompiles."""
        lo, hi = self.min_micro_batch, self.max_micro_batch
        powers = {2**i for i in range(hi.bit_length() + 1) if lo <= 2**i <= hi}
        return sorted(c for c in powers | {lo, hi} if c <= self._ceiling or c == lo)

    def _fits(self, micro_batch: int) -> bool:
        if self.memory_capacity_bytes is None:
            return True
        if not self.memory.samples:  # nothing measured yet: at most double
            return micro_batch <= 2 * self.micro_batch
        return (
            self.memory.predict_peak(micro_batch)
            <= self.memory_headroom * self.memory_capacity_bytes
        )

    def _change(self, kind: str, new: int, detail: dict) -> None:
        self.events.append(ScalerEvent(self.step, kind, self.micro_batch, new, detail))
        self.micro_batch = new
        self._warm = False

    # -- the global batch: gradient statistics (opt-in) --------------------------------------

    def _policy_target(self) -> float | None:
        lo, hi = self.min_global_batch, self.base_global_batch
        if self.policy == "noise_scale":
            return self.noise.noise_scale
        variance = self.relative_grad_variance
        if variance is None:
            return None
        return (
            lo
            + (hi - lo)
            * (1 + math.tanh((variance - self.variance_threshold) / self.variance_width))
            / 2
        )

    def _global_candidates(self) -> list[int]:
        lo, hi = self.min_global_batch, self.base_global_batch
        return sorted({lo * 2**i for i in range(hi.bit_length() + 1) if lo * 2**i <= hi} | {hi})

    def _move_global_towards(self, target: float) -> None:
        log_target = math.log(min(max(target, 1e-9), 1e12))
        wanted = min(self._global_candidates(), key=lambda c: (abs(math.log(c) - log_target), c))
        if wanted == self.global_batch:
            return
        old_micro, old_lr = self.micro_batch, self.lr_scale
        kind = "global_grow" if wanted > self.global_batch else "global_shrink"
        self.global_batch = wanted
        self.micro_batch = min(max(self.micro_batch, self.min_micro_batch), self.max_micro_batch)
        self.events.append(
            ScalerEvent(
                self.step,
                kind,
                old_micro,
                self.micro_batch,
                {
                    "reason": f"{self.policy} target {target:.4g}",
                    "policy": self.policy,
                    "target": target,
                    "global_batch": wanted,
                    "lr_scale": self.lr_scale,
                    "old_lr_scale": old_lr,
                },
            )
        )
        self._last_change = self.step
        self._warm = False

    # -- out of memory ---------------------------------------------------------------------

    def on_out_of_memory(self, error: BaseException | None = None) -> AccumulationPlan:
        """Halve the micro-batch (never below min), keep it below the size that failed, stop
        probing."""
        detail = {
            "reason": "out of memory",
            "error": str(error)[:200] if error else "out of memory",
        }
        self._probing = False
        if self.micro_batch == self.min_micro_batch:
            self._floor_failures += 1
            self.events.append(
                ScalerEvent(self.step, "oom", self.micro_batch, self.micro_batch, detail)
            )
            if self._floor_failures > self.max_floor_retries:
                raise MicroBatchFloorError(
                    f"{_KEY}.min_micro_batch: out of memory at the minimum micro-batch "
                    f"({self.min_micro_batch}) {self._floor_failures} times; "
                    "lower it or free memory"
                )
            return self.plan
        self._oom_limit = max(self.min_micro_batch, self.micro_batch - 1)
        self._change("oom", max(self.min_micro_batch, self.micro_batch // 2), detail)
        return self.plan


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_step_with_oom_retry(
    step_fn: Callable[[AccumulationPlan], T],
    scaler: BatchScaler,
    *,
    cleanup: Callable[[], None] | None = None,
    tracker: GradientNormTracker | None = None,
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
