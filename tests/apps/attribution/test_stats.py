"""The confidence sequence and the ratio estimates, against hand-computed figures, and the
property that matters: looked at every tick, the always-valid bound keeps false freezes
at or below alpha, where a fixed-n interval looked at as often does not."""

import math
import random
from decimal import Decimal

import pytest

from apps.attribution.decide import stats
from apps.attribution.decide.weights import rebalance


def test_halfwidth_matches_the_formula_by_hand():
    # s=1, t=100, alpha=0.05, r2=0.01: sqrt(2 * 2 / (10000 * 0.01) * log(sqrt(2) / 0.05)) =
    # sqrt(0.04 * 3.342306)
    assert stats.cs_halfwidth(sd=1.0, t=100, alpha=0.05, r2=0.01) == pytest.approx(
        0.365639, abs=1e-6
    )
    assert stats.cs_halfwidth(sd=2.0, t=100, alpha=0.05, r2=0.01) == pytest.approx(
        2 * 0.365639, abs=2e-6
    )


def test_tuning_is_growthbooks_choice_for_the_expected_sample_size():
    # (-2 log 0.05 + log(-2 log 0.05 + 1)) / 500 = (5.991465 + 1.944692) / 500
    assert stats.tuning_r2(alpha=0.05, expected_n=500) == pytest.approx(0.0158723, rel=1e-5)
    r2 = stats.tuning_r2(alpha=0.05, expected_n=500)
    widths = {
        t: stats.cs_halfwidth(sd=1, t=t, alpha=0.05, r2=r2) * math.sqrt(t) for t in (50, 500, 5000)
    }
    assert (
        widths[500] < widths[50] and widths[500] < widths[5000]
    )  # tightest (relative to 1/sqrt t) near t*


def test_the_sequence_is_wider_than_a_one_look_interval_and_shrinks_with_evidence():
    r2 = stats.tuning_r2(alpha=0.05, expected_n=500)
    for t in (10, 100, 1000, 100_000):
        assert stats.cs_halfwidth(sd=1, t=t, alpha=0.05, r2=r2) > 1.96 / math.sqrt(t)
    assert stats.cs_halfwidth(sd=1, t=100_000, alpha=0.05, r2=r2) < stats.cs_halfwidth(
        sd=1, t=100, alpha=0.05, r2=r2
    )


def test_ratio_estimate_by_hand():
    # (1, 10), (2, 10), (3, 20): R = 6/40 = 0.15; residuals -0.5, 0.5, 0: rss = 0.5;
    # var = rss * n / ((n - 1) * (sum units)^2) = 0.5 * 3 / (2 * 1600)
    est = stats.ratio_estimate(stats.RatioSums.of([(1, 10), (2, 10), (3, 20)]))
    assert est.value == pytest.approx(0.15) and est.n == 3
    assert est.variance == pytest.approx(0.00046875)


def test_ratio_estimate_needs_two_observations_and_units():
    assert stats.ratio_estimate(stats.RatioSums.of([(1, 10)])) is None
    assert stats.ratio_estimate(stats.RatioSums.of([(1, 0), (2, 0)])) is None


def test_exact_sums_keep_the_residual_variance_where_floats_cancel():
    # Costs exactly proportional to units but for one tiny wobble: the float formula
    # sum(x^2) - 2R sum(xy) + R^2 sum(y^2) loses it to cancellation at these magnitudes.
    pairs = [(Decimal("1000000.000001") * k, Decimal(10**12) * k) for k in range(1, 50)] + [
        (Decimal("3000000.000002"), Decimal(3 * 10**12))
    ]
    est = stats.ratio_estimate(stats.RatioSums.of(pairs))
    assert est.variance > 0


def test_relative_deviation_by_delta_method():
    arm = stats.RatioEstimate(value=1.1, variance=0.0004, n=100)
    control = stats.RatioEstimate(value=1.0, variance=0.0001, n=100)
    iv = stats.relative_deviation(arm, control, alpha=0.05, r2=0.01)
    variance = 0.0004 / 1.0 + 1.21 * 0.0001 / 1.0  # var(a)/c^2 + a^2 var(c)/c^4
    assert iv.estimate == pytest.approx(0.1)
    assert iv.halfwidth == pytest.approx(
        stats.cs_halfwidth(sd=math.sqrt(variance * 200), t=200, alpha=0.05, r2=0.01)
    )
    assert (
        stats.relative_deviation(arm, stats.RatioEstimate(0.0, 0.0, 10), alpha=0.05, r2=0.01)
        is None
    )


def _simulate(factor, *, replicates, ticks=200, runs=3, noise=0.02, threshold=0.05, seed=7):
    """Fraction of replicates frozen at any of `ticks` looks: (always-valid, fixed-n) rule."""
    alpha, r2 = 0.05, stats.tuning_r2(alpha=0.05, expected_n=500)
    rng = random.Random(seed)
    frozen = {"cs": 0, "fixed": 0}
    for _ in range(replicates):
        sums = [[0, 0.0, 0.0, 0.0, 0.0, 0.0], [0, 0.0, 0.0, 0.0, 0.0, 0.0]]
        hit = {"cs": False, "fixed": False}
        for tick in range(ticks):
            for arm, f in ((0, 1.0), (1, factor)):
                s = sums[arm]
                for _ in range(runs):
                    units = 300_000 * (1 + 0.05 * rng.gauss(0, 1))
                    cost = units * 8.3e-8 * f * (1 + noise * rng.gauss(0, 1))
                    s[0] += 1
                    s[1] += cost
                    s[2] += units
                    s[3] += cost * cost
                    s[4] += cost * units
                    s[5] += units * units
            if tick < 9:  # min samples: 30 observations per arm
                continue
            control, arm = (stats.ratio_estimate(stats.RatioSums(*s)) for s in sums)
            for kind, iv in (
                ("cs", stats.relative_deviation(arm, control, alpha=alpha, r2=r2)),
                ("fixed", stats.fixed_n_deviation(arm, control)),
            ):
                hit[kind] = hit[kind] or (iv.estimate > threshold and iv.low > threshold)
            if all(hit.values()):
                break
        for kind in frozen:
            frozen[kind] += hit[kind]
    return {kind: n / replicates for kind, n in frozen.items()}


@pytest.mark.slow
def test_a_a_arms_looked_at_200_times_are_falsely_frozen_at_most_alpha():
    # Threshold ~0, so the bound alone stands between A/A noise and a freeze.
    rates = _simulate(1.0, replicates=150, threshold=0.0001)
    assert rates["cs"] <= 0.05
    # The same data through a fixed-n 95 % interval: repeated looks inflate its error well past
    # alpha. (This is what makes the test able to fail: a bound that is not always-valid does.)
    assert rates["fixed"] > 0.05


def test_six_percent_is_caught_four_percent_is_not():
    assert _simulate(1.06, replicates=30, seed=1)["cs"] >= 0.95
    assert _simulate(1.04, replicates=30, seed=2)["cs"] == 0.0


def test_rebalance_moves_toward_cheaper_arms_within_bounds():
    shares = {"a": 0.5, "b": 0.5}
    nxt = rebalance(shares, {"a": 1.0, "b": 1.10}, tau=0.05, min_share=0.05, max_step=0.05)
    assert sum(nxt.values()) == pytest.approx(1.0)
    assert nxt["a"] == pytest.approx(0.55) and nxt["b"] == pytest.approx(0.45)  # capped at max_step
    for _ in range(100):
        nxt = rebalance(nxt, {"a": 1.0, "b": 1.10}, tau=0.05, min_share=0.05, max_step=0.05)
    # Converged to the target: b is 2 tau pricier, so exp(-2) of a's share.
    assert nxt["b"] / nxt["a"] == pytest.approx(math.exp(-2), rel=1e-6)


def test_rebalance_keeps_the_minimum_share_and_never_overshoots():
    nxt = rebalance(
        {"a": 0.34, "b": 0.33, "c": 0.33},
        {"a": 1.0, "b": 2.0, "c": 3.0},
        tau=0.05,
        min_share=0.1,
        max_step=1.0,
    )
    assert (
        nxt["b"] == pytest.approx(0.1)
        and nxt["c"] == pytest.approx(0.1)
        and nxt["a"] == pytest.approx(0.8)
    )
    current = {"a": 0.5, "b": 0.5}
    nxt = rebalance(current, {"a": 1.0, "b": 1.0}, tau=0.05, min_share=0.05, max_step=0.05)
    assert nxt == pytest.approx(current)  # equal costs: nothing to shift
    with pytest.raises(ValueError, match="costs must be > 0"):
        rebalance(current, {"a": 0.0, "b": 1.0}, tau=0.05, min_share=0.05, max_step=0.05)
