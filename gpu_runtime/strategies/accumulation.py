"""Gradient accumulation plans, and what the accumulated gradients say about the batch size.

The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, App.
A.1; AdaptDL) is estimated from the norm of the first micro-batch's gradient ("small")
and of the step's accumulated gradient ("big"), both read from `.grad` during
accumulation; |G|^2 and tr(Sigma) are smoothed separately (bias-corrected EMA)
before the ratio is taken.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AccumulationPlan:
    """How one optimizer step's global batch is cut into micro-batches (sizes sum to it)."""

    micro_batch: int
    micro_batch_sizes: tuple[int, ...]

    @property
    def global_batch(self) -> int:
        return sum(self.micro_batch_sizes)

    @property
    def accumulation_steps(self) -> int:
        return len(self.micro_batch_sizes)

    def loss_weight(self, index: int) -> float:
        """Multiply micro-batch `index`'s mean loss by this so the sum is the global mean."""
        return self.micro_batch_sizes[index] / self.global_batch


def plan_accumulation(global_batch: int, micro_batch: int) -> AccumulationPlan:
    """Full micro-batches and one smaller remainder, so the global batch is exact."""
    full, rest = divmod(global_batch, micro_batch)
    return AccumulationPlan(micro_batch, (micro_batch,) * full + ((rest,) if rest else ()))


@dataclass(frozen=True)
class GradientStats:
    """One step's squared gradient norms: micro-batch mean gradients and the
    step's mean gradient."""

    small_sq_norms: tuple[float, ...]  # |g_i|^2, g_i the mean gradient of micro-batch i
    small_sizes: tuple[int, ...]
    big_sq_norm: float  # |sum_i w_i g_i|^2, the global batch's mean gradient
    big_size: int

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (*self.small_sq_norms, self.big_sq_norm))


class GradientNormTracker:
    """Reads gradient norms during accumulation: no extra backward, no gradient copies.

    After micro-batch i's backward, `.grad` holds sum_{j<=i} w_j g_j. Its norm after the
    first micro-batch gives the small-batch gradient (|g_1|^2 = |.grad|^2 / w_1^2), after
    the last one the big-batch gradient: two fused norm calls a step, whatever the
    accumulation count. Call `after_micro_batch` right after each backward, before any
    unscale or clipping; the time it takes is summed in `overhead_s`.

    `step_stats` reads the two norms with one host sync. A training loop that already
    syncs once a step (for the loss) takes `pending_sq_norms` instead, reads it in the
    same transfer, and hands the numbers to `stats_from`: no sync of its own.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self._params = [p for p in params if p.requires_grad]
        self._small: tuple[torch.Tensor, int, float] | None = None
        self._big: tuple[torch.Tensor, int] | None = None
        self._sizes: tuple[int, float, int] | None = None
        self.overhead_s = 0.0
        self.norm_calls = 0  # fused norm computations so far: two a step, whatever the accumulation

    def _grad_sq_norm(self) -> torch.Tensor:
        grads = [p.grad for p in self._params if p.grad is not None]
        self.norm_calls += 1
        return torch.nn.utils.get_total_norm(grads, norm_type=2.0).float().square()

    def after_micro_batch(self, plan: AccumulationPlan, index: int) -> None:
        last = index == plan.accumulation_steps - 1
        if index != 0 and not last:
            return
        start = time.perf_counter()
        value = self._grad_sq_norm()
        if index == 0:
            self._small = (value, plan.micro_batch_sizes[0], plan.loss_weight(0))
        if last:
            self._big = (value, plan.global_batch)
        self.overhead_s += time.perf_counter() - start

    def pending_sq_norms(self, *, divide_by: torch.Tensor | None = None) -> torch.Tensor | None:
        """The step's (small, big) squared norms as one device tensor, not read yet; None if unseen.

        `divide_by` (a device scalar, e.g. a loss scale squared) is applied on the device.
        Forgets the step: read the tensor, then call `stats_from` with its two values.
        """
        small, big = self._small, self._big
        self.reset()
        if small is None or big is None:
            return None
        start = time.perf_counter()
        pair = torch.stack([small[0], big[0].to(small[0].device)])
        if divide_by is not None:
            pair = pair / divide_by.to(pair.device)
        self._sizes = (small[1], small[2], big[1])
        self.overhead_s += time.perf_counter() - start
        return pair

    def stats_from(self, small_sq: float, big_sq: float) -> GradientStats:
        """GradientStats of the step whose `pending_sq_norms` were read as these two numbers."""
        if self._sizes is None:
            raise RuntimeError("stats_from needs a pending_sq_norms call first")
        small_size, small_weight, big_size = self._sizes
        self._sizes = None
        # .grad held w_1 * g_1: undo the loss weight to get micro-batch 1's mean gradient
        return GradientStats((small_sq / small_weight**2,), (small_size,), big_sq, big_size)

    def step_stats(self) -> GradientStats | None:
        """Stats of the step just accumulated (one host sync), or None if it was not seen whole."""
        pair = self.pending_sq_norms()
        if pair is None:
            return None
        start = time.perf_counter()
        small_sq, big_sq = pair.tolist()
        self.overhead_s += time.perf_counter() - start
        return self.stats_from(small_sq, big_sq)

    def reset(self) -> None:
        """Forget a half-accumulated step (after an out-of-memory error)."""
        self._small = self._big = None


class NoiseScaleEstimator:
    """B_simple from small/big gradient norms, |G|^2 and tr(Sigma) smoothed separately."""

    def __init__(self, *, ema_decay: float = 0.9):
        self.ema_decay = ema_decay
        self._grad_sq = self._trace = 0.0
        self._weight = 0.0  # sum of EMA weights, for bias correction

    def observe(self, stats: GradientStats) -> bool:
        b_big = stats.big_size
        b_small = len(stats.small_sizes) / sum(
            1 / b for b in stats.small_sizes
        )  # E|g_i|^2 uses mean(1/b_i)
        if b_small >= b_big or not stats.finite:
            return False  # one micro-batch a step: nothing to difference
        small = sum(stats.small_sq_norms) / len(stats.small_sq_norms)
        grad_sq = (b_big * stats.big_sq_norm - b_small * small) / (b_big - b_small)
        trace = (small - stats.big_sq_norm) / (1 / b_small - 1 / b_big)
        d = self.ema_decay
        self._grad_sq = d * self._grad_sq + (1 - d) * grad_sq
        self._trace = d * self._trace + (1 - d) * trace
        self._weight = d * self._weight + (1 - d)
        return True

    @property
    def noise_scale(self) -> float | None:
        """Smoothed B_simple in samples; inf when the signal estimate is not positive."""
        if self._weight == 0.0:
            return None
        grad_sq, trace = self._grad_sq / self._weight, self._trace / self._weight
        if grad_sq <= 0.0:
            return math.inf
        return max(trace, 0.0) / grad_sq
