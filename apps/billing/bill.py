"""A run's bill as a pure function of its samples and the price schedule. No ORM, no Django.

Ingest bills a batch with the same code: the intervals a batch touches (the ones its new
samples close, and the one after each) are summed over the rows around it as they are now
and as they were before it, and the difference moves the run's totals (apps.billing.services).
The rules, in docs/billing.md ("The billing rules"):
- Samples are taken in seq order; each one closes the interval since the sample before it
  of the same rank (a DDP run has one stream per device), when that sample belongs to the
  same attempt. Time and energy add up over the streams; tokens and steps (the world's
  progress, which every rank reports) are counted from rank 0's stream only. An attempt's first
  sample has no interval (billed time starts at it), but its cumulative counters (energy, tokens,
  step) count from 0.
- An interval's time is split exactly at the price schedule's boundaries (``valid_from``):
  each part is priced with the table in force over it. Its energy is split in proportion
  to time; its tokens and steps fall where the closing sample was taken.
- The interval takes the closing sample's utilisation (NVML's is an average over the period
  just before the reading). Unknown utilisation counts as busy.
- Energy: the counter's growth where both ends have it, else the mean of the known power
  readings x dt, else (a GPU run that reports neither) the SKU's board power x GPUs x
  utilisation x dt, flagged estimated, else 0. Counters never run backwards in a bill.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from apps.billing.cost_engine import (
    CostBreakdown,
    Usage,
    Weights,
    _seconds,
    resource_weighted_cost,
)
from apps.pricing.prices import FREE, Prices

# A component's line in a run's cost_breakdown.
BREAKDOWN_KEYS = {
    "gpu": "gpu_usd",
    "energy": "energy_usd",
    "vcpu": "cpu_usd",
    "memory": "memory_usd",
}
# gCO2e's uncertainty band by how the energy was measured (docs/billing.md, "Carbon").
CARBON_BANDS = {"nvml": 0.05, "rapl": 0.10, "modelled": 0.50}


def carbon_method(*, estimated: bool, gpu: bool) -> str:
    """How a figure's energy was measured: modelled (from board power), nvml (the GPU's energy
    counter) or rapl (the CPU package's)."""
    return "modelled" if estimated else "nvml" if gpu else "rapl"


def carbon_figure(grams: float | None, *, method: str, unpriced: bool) -> dict:
    """gCO2e as shown everywhere (run, arm): the figure with its method and band, or unpriced
    (None, never 0) when nothing of it had an intensity."""
    if grams is None or (unpriced and not grams):
        return {
            "g_co2e": None,
            "method": method,
            "band": None,
            "low": None,
            "high": None,
            "unpriced": True,
        }
    band = CARBON_BANDS[method]
    return {
        "g_co2e": round(grams, 3),
        "method": method,
        "band": band,
        "low": round(grams * (1 - band), 3),
        "high": round(grams * (1 + band), 3),
        "unpriced": unpriced,
    }


def carbon_unmeasured(*, unpriced: bool = False) -> dict:
    """Carbon of usage that reported neither energy nor power: not known, never 0 g."""
    return {
        "g_co2e": None,
        "method": "unmeasured",
        "band": None,
        "low": None,
        "high": None,
        "unpriced": unpriced,
        "unmeasured": True,
    }


def carbon_shown(
    *,
    breakdown: Mapping | None,
    gpu_count: int,
    energy_estimated: bool,
    energy_j: float | None = None,
    wall_s: float = 0.0,
) -> dict:
    """A run's carbon as the API shows it: gCO2e with its method and band, unpriced, or
    unmeasured (time billed, and neither energy nor power reported nor modelled)."""
    b = breakdown or {}
    if energy_j is not None and energy_j <= 0 and wall_s > 0 and not energy_estimated:
        return carbon_unmeasured(unpriced=bool(b.get("carbon_unpriced_s")))
    return carbon_figure(
        float(b.get("carbon_g") or 0.0),
        method=carbon_method(estimated=energy_estimated, gpu=bool(gpu_count)),
        unpriced=bool(b.get("carbon_unpriced_s")),
    )


def breakdown_shown(breakdown: Mapping | None) -> dict:
    """A run's cost_breakdown as the API and pages show it: a component billed only where it had
    no price reads None (unpriced), never 0; `unpriced_s` says how long each went unpriced."""
    shown = dict(breakdown or {})
    for component in shown.get("unpriced_s") or {}:
        key = BREAKDOWN_KEYS[component]
        if not shown.get(key):
            shown[key] = None
    return shown


def unpriced_seconds(usage: Usage, prices: Prices) -> dict[str, float]:
    """Wall seconds of `usage` whose component has no price in `prices`, by component (only
    components the usage uses: GPU time of a GPU run, energy drawn, vCPUs and memory held).
    Billed at 0 and reported as unpriced, never as a $0 line."""
    used = {
        "gpu": usage.device_seconds > 0,
        "energy": usage.energy_j > 0,
        "vcpu": usage.vcpu_seconds > 0,
        "memory": usage.memory_gb_seconds > 0,
        "carbon": usage.energy_j > 0,
    }
    return {c: usage.wall_s for c in sorted(prices.unpriced) if used.get(c) and usage.wall_s > 0}


_INF = float("inf")


@dataclass
class PeriodSums:
    """What a stretch of samples adds to a bill, by price period (-1: before the first table)."""

    seconds: dict[int, list[float]] = field(
        default_factory=dict
    )  # wall, busy, energy, tokens, steps
    max_step: int = 0
    estimated: bool = False  # a sample says its power was modelled
    modelled: int = 0  # intervals whose energy was modelled from board power
    backwards_seq: int | None = None  # first sample timed before its predecessor (same attempt)
    # The step counts a stream had reached before each declared counter reset: the run's steps are
    # its highest step plus these (a maximum alone lost every step before a reset).
    reset_steps: int = 0

    def usage(self, *, gpu_count: float, vcpus: float, memory_gb: float) -> dict[int, Usage]:
        return {
            p: Usage(
                wall_s=w,
                device_seconds=w * gpu_count,
                busy_device_seconds=b * gpu_count,
                energy_j=e,
                vcpu_seconds=w * vcpus,
                memory_gb_seconds=w * memory_gb,
                tokens=int(t),
                steps=int(s),
            )
            for p, (w, b, e, t, s) in sorted(self.seconds.items())
        }


def period_sums(
    rows: Sequence[Mapping],
    *,
    edges: Sequence[float],
    count_after: int = -1,
    modelled_power_w: float = 0.0,
) -> PeriodSums:
    """Sum the intervals closed by rows with seq > count_after; rows sorted by seq, one per seq.

    `edges`: the schedule's start times (Unix seconds, ascending). A row at or below
    count_after only serves as the predecessor of the next one.
    """
    out = PeriodSums()
    acc = out.seconds
    prevs: dict[int, Mapping] = {}  # each rank's stream links to its own previous sample
    for cur in rows:
        t1 = _seconds(cur["ts"])
        rank = cur.get("rank") or 0
        prev = prevs.get(rank)
        prevs[rank] = cur
        if cur["seq"] <= count_after:
            continue
        linked = prev is not None and prev["attempt"] == cur["attempt"]
        own = bisect.bisect_right(edges, t1) - 1
        step, tokens, energy_now = cur["step"] or 0, cur["tokens"] or 0, cur["energy_j"]
        if step > out.max_step:
            out.max_step = step
        if cur["estimated"]:
            out.estimated = True
        if rank:  # the world's progress counts once, from rank 0; time and energy from every device
            step = tokens = 0
        if not linked:
            _add(acc, own, 1.0, 0.0, 0.0, max(0.0, energy_now or 0.0), tokens, step)
            continue
        t0 = _seconds(prev["ts"])
        if t1 < t0 and out.backwards_seq is None:
            out.backwards_seq = cur["seq"]
        dt = t1 - t0 if t1 > t0 else 0.0
        util = cur["util_pct"]
        busy = 1.0 if util is None else min(1.0, max(0.0, util / 100.0))
        energy_before, power_now, power_before = prev["energy_j"], cur["power_w"], prev["power_w"]
        if energy_now is not None and energy_before is not None:
            # A counter below its predecessor was reset (ingest refuses any other dip): the
            # interval counts from 0, as at an attempt's start, the reset sample's own count kept.
            energy = energy_now - energy_before if energy_now >= energy_before else energy_now
        elif power_now is not None or power_before is not None:
            mean = (
                (power_now + power_before) / 2
                if power_now is not None and power_before is not None
                else (power_now if power_now is not None else power_before)
            )
            energy = max(0.0, mean) * dt
        elif modelled_power_w > 0 and dt > 0:
            energy = modelled_power_w * busy * dt
            out.modelled += 1
        else:
            energy = 0.0
        step_before = prev["step"] or 0
        steps = (step - step_before if step >= step_before else step) if not rank else 0
        if not rank and step < step_before:  # a reset: counted from 0, what came before kept
            out.reset_steps += step_before
        tokens_before = prev["tokens"] or 0
        tokens_d = (
            (tokens - tokens_before if tokens >= tokens_before else tokens) if not rank else 0
        )
        first = bisect.bisect_right(edges, t0) - 1
        if dt <= 0 or first == own:
            _add(acc, own, 1.0, dt, dt * busy, energy, tokens_d, steps)
        else:  # the interval crosses a price boundary: split its time, and energy with it
            _add(acc, own, 0.0, 0.0, 0.0, 0.0, tokens_d, steps)
            for period in range(first, own + 1):
                lo = edges[period] if period >= 0 else -_INF
                hi = edges[period + 1] if period + 1 < len(edges) else _INF
                overlap = min(t1, hi) - max(t0, lo)
                if overlap > 0:
                    share = overlap / dt
                    _add(acc, period, share, dt, dt * busy, energy)
    return out


def _add(
    acc: dict,
    period: int,
    share: float,
    wall: float = 0.0,
    busy: float = 0.0,
    energy: float = 0.0,
    tokens: int = 0,
    steps: int = 0,
) -> None:
    sums = acc.get(period)
    if sums is None:
        sums = acc[period] = [0.0, 0.0, 0.0, 0, 0]
    sums[0] += share * wall
    sums[1] += share * busy
    sums[2] += share * energy
    sums[3] += tokens
    sums[4] += steps


@dataclass
class Bill:
    """Usage and cost of a run, by price period and in total."""

    periods: dict[int, Usage]
    usage: Usage
    cost: CostBreakdown
    max_step: int
    energy_estimated: bool
    unpriced_s: dict[str, float] = field(default_factory=dict)  # unpriced_seconds, summed


def price_periods(
    periods: dict[int, Usage], prices: Sequence[Prices], weights: Weights
) -> CostBreakdown:
    cost = CostBreakdown.zero()
    for period, usage in periods.items():
        cost = cost + resource_weighted_cost(
            usage, prices[period] if period >= 0 else FREE, weights
        )
    return cost


def run_bill(
    samples: Iterable[Mapping],
    *,
    starts: Sequence[datetime | float],
    prices: Sequence[Prices],
    weights: Weights = Weights(),  # noqa: B008
    gpu_count: float = 1,
    vcpus: float = 0,
    memory_gb: float = 0.0,
    modelled_power_w: float = 0.0,
    count_after: int = -1,
) -> Bill:
    """Bill the samples of one run (any order; one per seq, each with its attempt) under a price
    schedule.

    `starts[i]` is when `prices[i]` comes into force; `modelled_power_w`: board power of all
    the run's GPUs, used for intervals that report neither energy nor power (0: none).
    `count_after`: samples at or below this seq only open the interval of the next one (a
    strategy-search probe's warm-up before its timed stretch).
    """
    rows = sorted({s["seq"]: s for s in samples}.values(), key=lambda s: s["seq"])
    sums = period_sums(
        rows,
        edges=[_seconds(s) for s in starts],
        count_after=count_after,
        modelled_power_w=modelled_power_w,
    )
    periods = sums.usage(gpu_count=gpu_count, vcpus=vcpus, memory_gb=memory_gb)
    usage = Usage.zero()
    for u in periods.values():
        usage = usage + u
    unpriced: dict[str, float] = {}
    for period, u in periods.items():
        for component, seconds in unpriced_seconds(
            u, prices[period] if period >= 0 else FREE
        ).items():
            unpriced[component] = unpriced.get(component, 0.0) + seconds
    return Bill(
        periods=periods,
        usage=usage,
        cost=price_periods(periods, prices, weights),
        max_step=sums.max_step,
        energy_estimated=sums.estimated or sums.modelled > 0,
        unpriced_s=unpriced,
    )


def rollup_cost(
    *,
    prices: Prices,
    weights: Weights,
    device_seconds: float,
    wall_s: float,
    energy_j: float,
    vcpus: float,
    memory_gb: float,
) -> float:
    """USD of rolled-up usage (a run's summed intervals) at one table:
    what period_sums' usage costs there.

    Linear in usage under fixed prices, so a sum over any intervals prices like the intervals one by
    one.
    """
    usage = Usage(
        wall_s=wall_s,
        device_seconds=device_seconds,
        busy_device_seconds=device_seconds,
        energy_j=energy_j,
        vcpu_seconds=wall_s * vcpus,
        memory_gb_seconds=wall_s * memory_gb,
    )
    return resource_weighted_cost(usage, prices, weights).total_usd
