"""The freeze rule holds alpha when a run's windows share the run's luck, as real runs do.

A/A simulations, seeded and vectorised with numpy: each run has its own cost effect (a slow
host stays slow: 2-20 %) shared by all its windows (10-100 of them), 5 % of runs are 50 %
dearer and 1 % of windows triple (outliers, the same in both arms), and the arms are unequal
(40 runs four at a time against 25 two at a time). The rule is looked at 60 times over the
experiment, runs in progress included, exactly as apps.attribution.decide.stats computes it (a
spot check ties this vectorised copy to the production functions). Run as the unit, false
freezes stay under alpha in every setting; counting run-windows as independent, as the rule
used to, they do not: that comparison is what makes this test able to fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from apps.attribution.decide import stats

ALPHA = 0.05
EXPECTED_RUNS = 50  # COSTLAB_CS_EXPECTED_RUNS
MIN_RUNS = 10  # COSTLAB_CS_MIN_RUNS
USD_PER_TOKEN = 8.3e-8


def _ratio(n, cost, units, cost_sq, cost_units, units_sq):
    """stats.ratio_estimate, vectorised over replicates."""
    r = cost / units
    rss = np.maximum(cost_sq - 2 * r * cost_units + r * r * units_sq, 0)
    return r, rss * n / ((n - 1) * units * units)


def _arm(rng, replicates, *, runs, concurrent, windows, factor, run_sd):
    """Cumulative (cost, tokens) of every run after 0..windows windows, and when each run starts."""
    effect = rng.normal(0, run_sd, (replicates, runs)) + 0.5 * (
        rng.random((replicates, runs)) < 0.05
    )
    tokens = 300_000 * (1 + 0.05 * rng.normal(0, 1, (replicates, runs, windows)))
    noise = 0.02 * rng.normal(0, 1, (replicates, runs, windows)) + 2.0 * (
        rng.random((replicates, runs, windows)) < 0.01
    )
    cost = tokens * USD_PER_TOKEN * factor * (1 + effect[:, :, None]) * (1 + noise)
    zero = np.zeros((replicates, runs, 1))
    return (
        np.concatenate([zero, cost.cumsum(2)], 2),
        np.concatenate([zero, tokens.cumsum(2)], 2),
        (np.arange(runs) // concurrent) * windows,
        cost,
        tokens,
    )


def simulate(
    factor, *, run_sd, windows, threshold=0.05, unit="run", replicates=400, looks=60, seed=0
):
    """Share of replicates the rule freezes at any look:
    deviation > threshold and its lower bound too."""
    rng = np.random.default_rng(seed)
    r2 = stats.tuning_r2(alpha=ALPHA, expected_n=EXPECTED_RUNS)
    arms = [
        _arm(rng, replicates, runs=40, concurrent=4, windows=windows, factor=1.0, run_sd=run_sd),
        _arm(rng, replicates, runs=25, concurrent=2, windows=windows, factor=factor, run_sd=run_sd),
    ]
    end = max(start[-1] + windows for _, _, start, _, _ in arms)
    frozen = np.zeros(replicates, bool)
    for tick in np.linspace(1, end, looks).astype(int):
        sums = []
        for cum_cost, cum_tokens, start, cost, tokens in arms:
            seen = np.clip(tick - start, 0, windows)  # windows each run has had by now
            if unit == "run":  # one observation per run: its cumulative figures
                c = cum_cost[:, np.arange(len(seen)), seen]
                u = cum_tokens[:, np.arange(len(seen)), seen]
                n = int((seen > 0).sum())
            else:  # every run-window its own observation
                mask = np.arange(windows)[None, None, :] < seen[None, :, None]
                c, u, n = (
                    (cost * mask).reshape(replicates, -1),
                    (tokens * mask).reshape(replicates, -1),
                    int(seen.sum()),
                )
            sums.append((n, c.sum(1), u.sum(1), (c * c).sum(1), (c * u).sum(1), (u * u).sum(1)))
        (n_control, *control), (n_arm, *arm) = sums
        if min(n_control, n_arm) < MIN_RUNS:
            continue
        rc, vc = _ratio(n_control, *control)
        ra, va = _ratio(n_arm, *arm)
        deviation = ra / rc - 1
        t = n_control + n_arm
        sd = np.sqrt((va / rc**2 + ra**2 * vc / rc**4) * t)
        tr = t * r2
        halfwidth = sd * math.sqrt(
            2 * (tr + 1) / (t * t * r2) * math.log(math.sqrt(tr + 1) / ALPHA)
        )
        frozen |= (deviation > threshold) & (deviation - halfwidth > threshold)
    return float(frozen.mean())


SETTINGS = [(run_sd, windows) for run_sd in (0.02, 0.10, 0.20) for windows in (10, 100)]


@pytest.mark.parametrize(("run_sd", "windows"), SETTINGS)
def test_a_a_arms_are_falsely_frozen_at_most_alpha_with_the_run_as_the_unit(run_sd, windows):
    assert simulate(1.0, run_sd=run_sd, windows=windows) <= ALPHA  # the full rule (5 % threshold)
    assert (
        simulate(1.0, run_sd=run_sd, windows=windows, threshold=1e-4, seed=1) <= ALPHA
    )  # the bound alone


def test_counting_run_windows_as_independent_freezes_a_a_arms_far_more_than_alpha():
    assert simulate(1.0, run_sd=0.10, windows=10, threshold=1e-4, unit="window") > 3 * ALPHA


def test_a_real_regression_is_caught():
    assert simulate(1.20, run_sd=0.02, windows=100, seed=3) >= 0.8
    assert simulate(1.20, run_sd=0.10, windows=100, seed=3) >= 0.5


def test_the_vectorised_rule_is_the_production_one():
    rng = np.random.default_rng(9)
    control = [
        (float(c), float(u))
        for c, u in zip(rng.uniform(1, 2, 12), rng.uniform(1e6, 2e6, 12), strict=True)
    ]
    arm = [
        (float(c) * 1.1, float(u))
        for c, u in zip(rng.uniform(1, 2, 15), rng.uniform(1e6, 2e6, 15), strict=True)
    ]
    r2 = stats.tuning_r2(alpha=ALPHA, expected_n=EXPECTED_RUNS)
    ec, ea = (stats.ratio_estimate(stats.RatioSums.of(pairs)) for pairs in (control, arm))
    expected = stats.relative_deviation(ea, ec, alpha=ALPHA, r2=r2)

    def sums(pairs):
        c, u = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
        return len(pairs), c.sum(), u.sum(), (c * c).sum(), (c * u).sum(), (u * u).sum()

    (nc, *sc), (na, *sa) = sums(control), sums(arm)
    (rc, vc), (ra, va) = _ratio(nc, *sc), _ratio(na, *sa)
    t = nc + na
    sd = math.sqrt((va / rc**2 + ra**2 * vc / rc**4) * t)
    assert ra / rc - 1 == pytest.approx(expected.estimate, rel=1e-9)
    assert stats.cs_halfwidth(sd=sd, t=t, alpha=ALPHA, r2=r2) == pytest.approx(
        expected.halfwidth, rel=1e-9
    )
