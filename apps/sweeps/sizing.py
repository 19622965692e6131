"""vCPU right-sizing: the design document's estimate from a run's profile beside a measured answer.

Pure, no Django. The measured answer comes from a sizing sweep (the run's strategy probed at
1..N CPU threads): the smallest thread count whose USD per 1M tokens is within ``WITHIN`` of the
cheapest. Compliance is throughput at a size / the best throughput measured.
"""

from __future__ import annotations

from dataclasses import dataclass

WITHIN = 0.05


def estimate_vcpus(*, cpu_util: float, io_wait: float, mem_usage_gb: float) -> int:
    """The design document's estimate_vcpus(profile), as written there
    (cpu_util and io_wait as 0..1)."""
    return max(int(cpu_util * 8), int(io_wait * 16), int(mem_usage_gb / 2))


@dataclass(frozen=True)
class SizePoint:
    threads: int
    usd_per_mtok: float
    tokens_per_s: float


@dataclass(frozen=True)
class Recommendation:
    recommended: int
    cheapest: int
    best_tokens_per_s: float
    compliance_recommended: float  # tokens/s at the recommended size / the best
    compliance_actual: (
        float | None
    )  # tokens/s at the run's own size / the best (None: that size not probed)


def recommend(points: list[SizePoint], *, actual: int | None) -> Recommendation | None:
    """The smallest size within WITHIN of the cheapest USD per 1M tokens;
    None without measurements."""
    if not points:
        return None
    cheapest = min(points, key=lambda p: (p.usd_per_mtok, p.threads))
    chosen = min(
        (p for p in points if p.usd_per_mtok <= cheapest.usd_per_mtok * (1 + WITHIN)),
        key=lambda p: p.threads,
    )
    best = max(p.tokens_per_s for p in points)
    at_actual = next((p for p in points if p.threads == actual), None)
    return Recommendation(
        recommended=chosen.threads,
        cheapest=cheapest.threads,
        best_tokens_per_s=best,
        compliance_recommended=chosen.tokens_per_s / best,
        compliance_actual=None if at_actual is None else at_actual.tokens_per_s / best,
    )
