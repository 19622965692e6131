"""What a probe measured, from its telemetry samples: the warm-up excluded. Pure, no Django."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timed:
    """The timed stretch of a probe: the sample that closed the warm-up,
    and every sample after it."""

    boundary: dict[str, Any]
    samples: list[dict[str, Any]]
    steps: int
    step_time_s: float
    step_time_spread: float
    tokens_per_s: float | None


def timed_stretch(samples: list[dict[str, Any]], *, warmup_steps: int) -> Timed | None:
    """Samples after the first one taken at or past ``warmup_steps``;
    None when too few steps were timed."""
    ordered = sorted(samples, key=lambda s: s["seq"])
    start = next((i for i, s in enumerate(ordered) if s["step"] >= warmup_steps), None)
    if start is None or start == len(ordered) - 1:
        return None
    boundary, after = ordered[start], ordered[start + 1 :]
    steps = after[-1]["step"] - boundary["step"]
    elapsed = after[-1]["ts"] - boundary["ts"]
    if steps <= 0 or elapsed <= 0:
        return None
    per_sample = [s["step_time_s"] for s in after if s.get("step_time_s")]
    mean = statistics.fmean(per_sample) if per_sample else 0.0
    spread = statistics.pstdev(per_sample) / mean if len(per_sample) > 1 and mean > 0 else 0.0
    tokens = after[-1]["tokens"] - boundary["tokens"]
    return Timed(
        boundary=boundary,
        samples=after,
        steps=steps,
        step_time_s=elapsed / steps,
        step_time_spread=spread,
        tokens_per_s=tokens / elapsed if tokens > 0 else None,
    )


def peak_memory_mb(
    samples: list[dict[str, Any]], result_peak_mb: float | None, *, cuda: bool, baseline_mb: float
) -> float | None:
    """CUDA: the runtime's max allocated.
    CPU: the highest RSS seen minus the process's RSS before the probe."""
    if cuda:
        return result_peak_mb
    seen = [s["mem_used_mb"] for s in samples if s.get("mem_used_mb") is not None]
    if result_peak_mb is not None:
        seen.append(result_peak_mb)
    return max(0.0, max(seen) - baseline_mb) if seen else None
