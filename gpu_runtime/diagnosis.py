"""What bounds a run's kernels, from NVML GPM's tensor-pipe activity and DRAM bandwidth.

The design document's kernel chapter ends in a decision table over two Nsight Compute metrics
(load efficiency, instruction throughput) that says which refactor to make. NVML GPM has no such
per-kernel counters, but it has the two that decide the same question for a whole run: how much of
the time the tensor pipes worked, and how much of the DRAM bandwidth was used. The rule (its
thresholds are in docs/gpu-check.md):

- tensor activity >= TENSOR_ACTIVE_LOW_PCT: **compute-bound**; the tensor cores do the work, and
  what is left is fewer FLOPs (a lower precision, less recomputation);
- below it, DRAM bandwidth >= DRAM_BW_HIGH_PCT: **memory-bound**; kernels wait on memory: fuse
  them (fused RMSNorm+QKV, compile) or raise arithmetic intensity (a larger micro-batch);
- below both: **launch- or input-bound**; neither pipe is busy, so the GPU waits on kernel
  launches or on data: raise the micro-batch, prefetch, compile (fewer, larger kernels);
- no GPM figures (a CPU, a GPU before Hopper, GPM off): **unavailable**, never a guess.

Means are taken over the samples after the first optimizer step (model building and the first
compile are not the run's steady state). Pure: no torch, no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

TENSOR_ACTIVE_LOW_PCT = 30.0
DRAM_BW_HIGH_PCT = 60.0
MIN_SAMPLES = 3  # fewer GPM readings than this say nothing about a run

COMPUTE_BOUND = "compute_bound"
MEMORY_BOUND = "memory_bound"
LAUNCH_OR_INPUT_BOUND = "launch_or_input_bound"
UNAVAILABLE = "unavailable"

_WORDS = {
    COMPUTE_BOUND: (
        "compute-bound",
        "the tensor cores do the work; fewer FLOPs is what is left (a lower precision, less "
        "recomputation)",
    ),
    MEMORY_BOUND: (
        "memory-bound",
        "fuse kernels (kernels.fused_rmsnorm_qkv, kernels.compile) or raise arithmetic intensity "
        "(a larger micro-batch)",
    ),
    LAUNCH_OR_INPUT_BOUND: (
        "launch- or input-bound",
        "raise the micro-batch, prefetch data (data.prefetch, pin_memory), compile "
        "(kernels.compile: fewer, larger kernels)",
    ),
    UNAVAILABLE: (
        "unavailable",
        "no NVML GPM figures: a CPU, a GPU before Hopper, or GPM off",
    ),
}


@dataclass(frozen=True)
class KernelDiagnosis:
    verdict: str  # one of the four constants above
    label: str  # the verdict in words
    action: str  # what to try, in the strategy's keys
    samples: int  # GPM readings the means are over
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_low_pct: float = TENSOR_ACTIVE_LOW_PCT
    dram_bw_high_pct: float = DRAM_BW_HIGH_PCT

    @property
    def available(self) -> bool:
        return self.verdict != UNAVAILABLE

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kernel_verdict(
    *,
    tensor_active_pct: float | None,
    dram_bw_pct: float | None,
    sm_occupancy_pct: float | None = None,
    samples: int,
) -> KernelDiagnosis:
    """The decision on a run's mean tensor-pipe activity and DRAM bandwidth (both in %)."""
    if tensor_active_pct is None or dram_bw_pct is None or samples < MIN_SAMPLES:
        verdict = UNAVAILABLE
    elif tensor_active_pct >= TENSOR_ACTIVE_LOW_PCT:
        verdict = COMPUTE_BOUND
    elif dram_bw_pct >= DRAM_BW_HIGH_PCT:
        verdict = MEMORY_BOUND
    else:
        verdict = LAUNCH_OR_INPUT_BOUND
    label, action = _WORDS[verdict]
    shown = verdict != UNAVAILABLE
    return KernelDiagnosis(
        verdict=verdict,
        label=label,
        action=action,
        samples=samples if shown else 0,
        tensor_active_pct=_round(tensor_active_pct) if shown else None,
        dram_bw_pct=_round(dram_bw_pct) if shown else None,
        sm_occupancy_pct=_round(sm_occupancy_pct) if shown else None,
    )


def kernel_diagnosis(samples: Iterable[Mapping[str, Any]]) -> KernelDiagnosis:
    """The decision over telemetry samples (gpu_runtime's sample dicts, or rows with the same
    keys): the means of those after the first step that carry both GPM figures."""
    tensor, dram, occupancy = [], [], []
    for s in samples:
        if (s.get("step") or 0) < 1:
            continue
        t, d = s.get("tensor_active_pct"), s.get("dram_bw_pct")
        if t is None or d is None:
            continue
        tensor.append(float(t))
        dram.append(float(d))
        if s.get("sm_occupancy_pct") is not None:
            occupancy.append(float(s["sm_occupancy_pct"]))
    return kernel_verdict(
        tensor_active_pct=_mean(tensor),
        dram_bw_pct=_mean(dram),
        sm_occupancy_pct=_mean(occupancy),
        samples=len(tensor),
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
